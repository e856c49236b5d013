use std::collections::BTreeMap;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::*;

/// Header names given as a client may spell them (any case).
fn request(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn identity() -> Identity {
    Identity {
        user: "alice".into(),
        uid: Some("u-1".into()),
        groups: vec!["dev".into(), "ops".into()],
        extra: BTreeMap::from([
            ("scopes".into(), vec!["view".into(), "edit".into()]),
            ("example.org/Team Name".into(), vec!["blue".into()]),
        ]),
    }
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|value| value.to_str().unwrap())
        .collect()
}

#[test]
fn the_clients_identity_host_and_hop_by_hop_headers_are_dropped() {
    let client = request(&[
        ("Impersonate-User", "admin"),
        ("IMPERSONATE-GROUP", "system:masters"),
        ("impersonate-uid", "0"),
        ("Impersonate-Extra-Scopes", "all"),
        ("X-Remote-User", "admin"),
        ("x-REMOTE-group", "system:masters"),
        ("X-Remote-Extra-Scopes", "all"),
        ("Authorization", "Bearer client-token"),
        ("Proxy-Authorization", "Basic eDp5"),
        ("Proxy-Authenticate", "Basic"),
        ("Host", "evil.example"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("X-Secret-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "x-checksum"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "websocket"),
        ("Accept", "application/json"),
        ("Content-Type", "application/merge-patch+json"),
        ("Content-Length", "12"),
        ("User-Agent", "kubectl/v1.31"),
        ("Audit-Id", "abc"),
    ]);
    let bearer = HeaderValue::from_static("Bearer agent-token");
    let headers = apiserver_headers(&client, &identity(), Some(&bearer)).unwrap();
    let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "accept",
            "audit-id",
            "authorization",
            "content-length",
            "content-type",
            "impersonate-extra-example.org%2fteam%20name",
            "impersonate-extra-scopes",
            "impersonate-group",
            "impersonate-uid",
            "impersonate-user",
            "user-agent",
        ]
    );
    assert_eq!(values(&headers, "impersonate-user"), ["alice"]);
    assert_eq!(values(&headers, "impersonate-group"), ["dev", "ops"]);
    assert_eq!(values(&headers, "impersonate-uid"), ["u-1"]);
    assert_eq!(
        values(&headers, "impersonate-extra-scopes"),
        ["view", "edit"]
    );
    assert_eq!(
        values(&headers, "Impersonate-Extra-example.org%2FTeam%20Name"),
        ["blue"]
    );
    assert_eq!(values(&headers, "authorization"), ["Bearer agent-token"]);
    assert!(headers["authorization"].is_sensitive());
    assert_eq!(values(&headers, "content-length"), ["12"]);
}

#[test]
fn without_a_bearer_no_authorization_is_sent_and_an_identity_sets_only_its_own_headers() {
    let client = request(&[
        ("authorization", "Bearer client"),
        ("impersonate-group", "system:masters"),
    ]);
    let user_only = Identity {
        user: "bob".into(),
        ..Identity::default()
    };
    let headers = apiserver_headers(&client, &user_only, None).unwrap();
    assert_eq!(headers.len(), 1);
    assert_eq!(values(&headers, "impersonate-user"), ["bob"]);
}

#[test]
fn an_upgrade_request_keeps_upgrade_with_a_clean_connection_header() {
    let client = request(&[
        ("Connection", "Upgrade, impersonate-user"),
        ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ("Impersonate-User", "admin"),
    ]);
    let headers = apiserver_headers(&client, &identity(), None).unwrap();
    assert_eq!(values(&headers, "connection"), ["Upgrade"]);
    assert_eq!(values(&headers, "upgrade"), ["SPDY/3.1"]);
    assert_eq!(
        values(&headers, "x-stream-protocol-version"),
        ["v4.channel.k8s.io"]
    );
    assert_eq!(values(&headers, "impersonate-user"), ["alice"]);
    // `Upgrade` without `Connection: upgrade` is not an upgrade request.
    let headers =
        apiserver_headers(&request(&[("Upgrade", "websocket")]), &identity(), None).unwrap();
    assert!(!headers.contains_key("upgrade") && !headers.contains_key("connection"));
}

#[test]
fn an_identity_that_cannot_be_sent_is_refused() {
    let empty = Identity::default();
    assert_eq!(
        apiserver_headers(&HeaderMap::new(), &empty, None),
        Err(HeadError::EmptyUser)
    );
    let line_break = Identity {
        user: "alice\r\nimpersonate-group: system:masters".into(),
        ..Identity::default()
    };
    let error = apiserver_headers(&HeaderMap::new(), &line_break, None).unwrap_err();
    assert_eq!(error.reason(), "invalid_identity");
    assert_eq!(error.grpc_code(), crate::grpc_code::INVALID_ARGUMENT);
    assert_eq!(HeadError::EmptyUser.reason(), "empty_user");
}

#[test]
fn a_review_goes_as_the_agent_with_no_identity_of_anyones() {
    let client = request(&[
        ("Content-Type", "application/json"),
        ("Impersonate-User", "admin"),
        ("X-Remote-User", "admin"),
        ("Authorization", "Bearer someone-elses"),
        ("Host", "evil.example"),
    ]);
    let bearer = HeaderValue::from_static("Bearer agent-token");
    let headers = review_headers(&client, Some(&bearer));
    assert_eq!(values(&headers, "authorization"), ["Bearer agent-token"]);
    assert!(headers.get("authorization").unwrap().is_sensitive());
    assert_eq!(values(&headers, "content-type"), ["application/json"]);
    for gone in ["impersonate-user", "x-remote-user", "host"] {
        assert!(!headers.contains_key(gone), "{gone}");
    }
    assert_eq!(headers.len(), 2);
}
