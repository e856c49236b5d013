use super::*;

/// Every refusal a pure phase can make, one per `GatewayError` variant.
fn refusals() -> Vec<GatewayError> {
    vec![
        GatewayError::UnknownHost { host: "x".into() },
        GatewayError::BadRequest { reason: "r".into() },
        GatewayError::Unauthorized,
        GatewayError::ImpersonationForbidden {
            user: "alice".into(),
            kind: "user",
            value: "root".into(),
        },
        GatewayError::NoDispatchPolicy {
            cluster: "c".into(),
            verb: "get",
            path: "/x".into(),
        },
        GatewayError::TooManyRequests {
            schema: "slow".into(),
        },
        GatewayError::NoHealthyUpstream {
            cluster: "c".into(),
        },
        GatewayError::AuthenticationUnavailable {
            cluster: "c".into(),
            reason: "r".into(),
        },
        GatewayError::UpstreamFailed {
            server: "s".into(),
            reason: "r".into(),
        },
        GatewayError::Internal { reason: "r".into() },
    ]
}

fn upstream(cause: UpstreamFailure) -> ProxyError {
    ProxyError::Upstream {
        server: "https://10.0.0.1:6443".into(),
        cause,
    }
}

fn auth(cause: ApiCallFailure) -> ProxyError {
    ProxyError::AuthUnavailable {
        cluster: "c".into(),
        cause,
    }
}

fn refused_connection() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

/// One of each variant the proxy builds itself.
fn proxy_failures() -> Vec<ProxyError> {
    vec![
        ProxyError::Handshake(io::Error::from(io::ErrorKind::UnexpectedEof)),
        auth(ApiCallFailure::NoHealthyServer),
        upstream(UpstreamFailure::ConnectTimeout {
            endpoint: "https://10.0.0.1:6443".into(),
            timeout: Duration::from_secs(5),
        }),
        ProxyError::Config(InvalidSources::default()),
        ProxyError::ClusterFiles {
            file: "clusters/a.yaml".into(),
            cluster: "a".into(),
            cause: ClusterFileError::Insecure,
        },
    ]
}

#[test]
fn a_refusal_is_answered_exactly_as_the_pure_phase_said() {
    for refusal in refusals() {
        let error = ProxyError::from(refusal.clone());
        assert_eq!(error.status_body(), refusal.status_body(), "{refusal:?}");
        assert_eq!(error.to_status(), refusal.to_status());
        assert_eq!(error.http_status(), refusal.http_status());
        assert_eq!(error.status_reason(), refusal.reason());
        assert_eq!(error.retry_after_seconds(), refusal.retry_after_seconds());
        assert_eq!(error.to_string(), refusal.to_string());
    }
}

#[test]
fn upstream_and_review_failures_answer_as_the_gateway_always_did() {
    // Before the typed causes, these were GatewayError variants with the cause as a string:
    // the client's answer must be byte for byte the same.
    let causes = [
        UpstreamFailure::ConnectTimeout {
            endpoint: "https://10.0.0.1:6443".into(),
            timeout: Duration::from_secs(5),
        },
        UpstreamFailure::Connect {
            endpoint: "https://10.0.0.1:6443".into(),
            source: refused_connection(),
        },
        UpstreamFailure::Response(h2::Error::from(h2::Reason::INTERNAL_ERROR)),
        UpstreamFailure::UpgradeConnect(refused_connection()),
        UpstreamFailure::UpgradeRelay(UpgradeHeadError::Closed),
    ];
    for cause in causes {
        let reason = cause.to_string();
        let error = upstream(cause);
        let before = GatewayError::UpstreamFailed {
            server: "https://10.0.0.1:6443".into(),
            reason,
        };
        assert_eq!(error.status_body(), before.status_body(), "{error}");
        assert_eq!(error.http_status(), 502);
        assert_eq!(error.retry_after_seconds(), before.retry_after_seconds());
        assert_eq!(error.side(), Side::Upstream);
        assert_eq!(error.metric_label(), "upstream_failed");
    }
    let causes = [
        ApiCallFailure::NoHealthyServer,
        ApiCallFailure::Timeout {
            path: "/apis/authentication.k8s.io/v1/tokenreviews".into(),
            timeout: Duration::from_secs(2),
        },
        ApiCallFailure::Status {
            path: "/x".into(),
            status: StatusCode::FORBIDDEN,
            excerpt: "no".into(),
        },
    ];
    for cause in causes {
        let reason = cause.to_string();
        let error = auth(cause);
        let before = GatewayError::AuthenticationUnavailable {
            cluster: "c".into(),
            reason,
        };
        assert_eq!(error.status_body(), before.status_body(), "{error}");
        assert_eq!(error.http_status(), 503);
        assert_eq!(error.side(), Side::Auth);
        assert_eq!(error.metric_label(), "authentication_unavailable");
    }
}

#[test]
fn messages_name_the_failed_step() {
    let error = upstream(UpstreamFailure::ConnectTimeout {
        endpoint: "https://10.0.0.1:6443".into(),
        timeout: Duration::from_secs(5),
    });
    assert_eq!(
        error.to_string(),
        "upstream https://10.0.0.1:6443 failed: no connection to https://10.0.0.1:6443 within 5s"
    );
    let error = auth(ApiCallFailure::Status {
        path: "/apis/authentication.k8s.io/v1/tokenreviews".into(),
        status: StatusCode::INTERNAL_SERVER_ERROR,
        excerpt: "boom".into(),
    });
    assert_eq!(
        error.to_string(),
        "authentication backend of cluster \"c\" is unavailable: /apis/authentication.k8s.io/v1/tokenreviews answered 500 Internal Server Error: boom"
    );
    let error = ProxyError::ClusterFiles {
        file: "clusters/a.yaml".into(),
        cluster: "a".into(),
        cause: ClusterFileError::BearerToken,
    };
    assert_eq!(
        error.to_string(),
        "clusters/a.yaml: cluster \"a\": spec.clientConfig: the bearer token is not a valid header value"
    );
}

#[test]
fn every_metric_label_is_a_registered_reject_reason() {
    let errors = refusals()
        .into_iter()
        .map(ProxyError::from)
        .chain(proxy_failures());
    for error in errors {
        assert!(
            REJECT_REASONS.contains(&error.metric_label()),
            "{error:?}: {}",
            error.metric_label()
        );
    }
    // Each refusal has a label of its own.
    let mut labels: Vec<_> = refusals()
        .into_iter()
        .map(|refusal| ProxyError::from(refusal).metric_label())
        .collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), refusals().len());
}

#[test]
fn each_error_names_the_party_that_failed() {
    let sides: Vec<_> = proxy_failures().iter().map(ProxyError::side).collect();
    assert_eq!(
        sides,
        [
            Side::Client,
            Side::Auth,
            Side::Upstream,
            Side::Config,
            Side::Config
        ]
    );
    let side = |refusal: GatewayError| ProxyError::from(refusal).side();
    assert_eq!(side(GatewayError::Unauthorized), Side::Client);
    assert_eq!(
        side(GatewayError::TooManyRequests { schema: "s".into() }),
        Side::Client
    );
    assert_eq!(
        side(GatewayError::NoHealthyUpstream {
            cluster: "c".into()
        }),
        Side::Upstream
    );
    assert_eq!(
        side(GatewayError::Internal { reason: "r".into() }),
        Side::Internal
    );
}

#[test]
fn config_errors_never_reach_a_client_but_would_be_internal() {
    for error in proxy_failures()
        .into_iter()
        .filter(|error| error.side() == Side::Config)
    {
        assert_eq!(error.http_status(), 500);
        assert_eq!(error.status_reason(), "InternalError");
        assert_eq!(error.retry_after_seconds(), None);
        assert!(!error.retry_before_reply());
    }
}

#[test]
fn the_proxy_may_retry_only_what_never_reached_an_apiserver() {
    let endpoint = || Box::<str>::from("https://10.0.0.1:6443");
    let unsent = [
        UpstreamFailure::Connect {
            endpoint: endpoint(),
            source: refused_connection(),
        },
        UpstreamFailure::ConnectTimeout {
            endpoint: endpoint(),
            timeout: Duration::from_secs(5),
        },
        UpstreamFailure::Tls {
            endpoint: endpoint(),
            source: refused_connection(),
        },
        UpstreamFailure::Ready(h2::Error::from(h2::Reason::CONNECT_ERROR)),
        UpstreamFailure::Send(h2::Error::from(h2::Reason::CONNECT_ERROR)),
        UpstreamFailure::Response(h2::Error::from(h2::Reason::REFUSED_STREAM)),
        UpstreamFailure::UpgradeConnect(refused_connection()),
    ];
    for cause in unsent {
        assert!(upstream(cause).retry_before_reply());
    }
    let maybe_processed = [
        UpstreamFailure::Response(h2::Error::from(h2::Reason::INTERNAL_ERROR)),
        UpstreamFailure::UpgradeRelay(UpgradeHeadError::Closed),
    ];
    for cause in maybe_processed {
        assert!(!upstream(cause).retry_before_reply());
    }
    for refusal in refusals() {
        assert!(!ProxyError::from(refusal).retry_before_reply());
    }
    assert!(
        !ProxyError::Handshake(refused_connection()).retry_before_reply(),
        "there is nothing to retry before a request"
    );
}

#[test]
fn reviews_are_asked_again_only_when_another_answer_could_differ() {
    let status = |code: u16| ApiCallFailure::Status {
        path: "/x".into(),
        status: StatusCode::from_u16(code).unwrap(),
        excerpt: String::new(),
    };
    assert!(auth(status(503)).retry_before_reply());
    assert!(!auth(status(403)).retry_before_reply());
    assert!(auth(ApiCallFailure::Timeout {
        path: "/x".into(),
        timeout: Duration::from_secs(2)
    })
    .retry_before_reply());
    assert!(!auth(ApiCallFailure::NoHealthyServer).retry_before_reply());
    assert!(!auth(ApiCallFailure::TooLarge {
        path: "/x".into(),
        limit: 1
    })
    .retry_before_reply());
}

#[test]
fn errors_can_travel_to_the_daemon() {
    // `sluice` wraps start-up errors with anyhow, which needs these bounds.
    fn bounds<T: std::error::Error + Send + Sync + 'static>() {}
    bounds::<ProxyError>();
}
