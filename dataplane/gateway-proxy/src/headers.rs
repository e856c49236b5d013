//! The headers a request carries upstream: the client's end-to-end headers without its own
//! identity, plus who the gateway says the user is (Impersonate-*) and the gateway's own
//! credentials. Plain functions, shared by forwarding and upgrades.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::uri::{self, Scheme, Uri};
use http::Request;
use sluice_gateway::cluster::CompiledServer;
use sluice_gateway::identity::{strip_client_identity, write_impersonation_headers, UserInfo};
use sluice_gateway::status::GatewayError;

pub use sluice_gateway::hop_by_hop::is_hop_by_hop;
use sluice_gateway::hop_by_hop::HOP_BY_HOP;

/// Appends every end-to-end header of `from` to `to`.
pub fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_by_hop(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// The response head's headers sent to the client: the upstream's end-to-end headers, taken
/// from the upstream's map in place rather than copied into a new one (names keep their values
/// in order; the order between different names may change, which HTTP gives no meaning).
pub fn response_headers(mut upstream: HeaderMap) -> HeaderMap {
    for name in HOP_BY_HOP {
        upstream.remove(name);
    }
    upstream
}

/// The client's bearer token (`Authorization: Bearer <token>`, scheme in any case), if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|token| !token.is_empty())
}

/// The headers sent upstream for a client request: its end-to-end headers, its identity
/// (credentials, Impersonate-*) replaced by `user` as Impersonate-* headers, and the gateway's
/// own `Authorization` when it has a bearer token.
pub fn upstream_headers(
    client: &HeaderMap,
    user: &UserInfo,
    bearer: Option<&HeaderValue>,
) -> Result<HeaderMap, GatewayError> {
    // Sized for what is written below (the client's headers, Impersonate-User, a group each,
    // the gateway's Authorization), so the map is allocated once rather than grown midway:
    // with kubectl's five headers and two groups, growing cost two allocations per request.
    let mut headers = HeaderMap::with_capacity(client.len() + user.groups.len() + 2);
    copy_end_to_end(client, &mut headers);
    strip_client_identity(&mut headers);
    strip_request_header_authentication(&mut headers);
    write_impersonation_headers(user, &mut headers)?;
    if let Some(bearer) = bearer {
        let mut bearer = bearer.clone();
        // Never HPACK-indexed: the gateway's credential stays out of the dynamic table.
        bearer.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, bearer);
    }
    Ok(headers)
}

/// Identity header prefixes: the apiserver's request-header authentication (`X-Remote-*`,
/// set by an authenticating proxy) and impersonation (`Impersonate-*`).
const IDENTITY_PREFIXES: [&str; 2] = ["x-remote-", "impersonate-"];

/// Removes `X-Remote-*` (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`...): the
/// apiserver's request-header authentication reads them from an authenticating proxy, so a
/// client must never be able to set them through the gateway. Also removes every identity
/// header spelled with `_` for `-` (`X_Remote_User`, `Impersonate_User`): nginx, CGI-style
/// servers and header normalizers treat the two alike, so a proxy or apiserver behind the
/// gateway might read them as the real ones. Allocates only when the client sent one.
pub fn strip_request_header_authentication(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("x-remote-") || is_underscored_identity(name))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Whether `name` holds a `_` and, reading `_` as `-`, starts with an identity prefix.
fn is_underscored_identity(name: &HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    name.contains(&b'_')
        && IDENTITY_PREFIXES.iter().any(|prefix| {
            name.len() >= prefix.len()
                && name
                    .iter()
                    .zip(prefix.bytes())
                    .all(|(&byte, expected)| byte == expected || (byte == b'_' && expected == b'-'))
        })
}

/// Refuses an upgrade request that announces a body (`Content-Length` other than 0, or any
/// `Transfer-Encoding`). An upgrade has none: the bytes behind its head belong to the upgraded
/// protocol. Forwarded, the length would make the apiserver wait for a body that never comes,
/// holding the relay, its upstream connection and its flow-control permit with no timeout; and
/// a body the gateway and the apiserver frame differently is how requests are smuggled.
pub fn refuse_upgrade_body(headers: &HeaderMap) -> Result<(), GatewayError> {
    let length = headers.get_all(http::header::CONTENT_LENGTH);
    let announced = length.iter().any(|value| value.as_bytes() != b"0")
        || headers.contains_key(http::header::TRANSFER_ENCODING);
    if announced {
        return Err(GatewayError::BadRequest {
            reason: "an upgrade request carries no body: Content-Length (other than 0) and Transfer-Encoding are refused".into(),
        });
    }
    Ok(())
}

/// The request head sent to `server` on an HTTP/2 stream: same method, path and query.
pub fn upstream_request(
    parts: &Parts,
    server: &CompiledServer,
    headers: HeaderMap,
) -> Result<Request<()>, GatewayError> {
    let uri = match reused_uri(parts, server) {
        Some(uri) => uri,
        None => formatted_uri(parts, server)?,
    };
    let mut request = Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The upstream URI from parts already parsed (the server's authority, the client's path and
/// query), shared rather than formatted and parsed again per request. `None` unless that gives
/// exactly what [`formatted_uri`] would: an authority written `host:port` and an origin-form
/// path.
fn reused_uri(parts: &Parts, server: &CompiledServer) -> Option<Uri> {
    let authority = server.uri.authority()?;
    let written_as_formatted = authority.host() == &*server.host
        && authority.port_u16() == Some(server.port)
        && authority.as_str().len() == server.host.len() + 1 + authority.port()?.as_str().len();
    let path_and_query = parts.uri.path_and_query()?;
    if !written_as_formatted || !path_and_query.as_str().starts_with('/') {
        return None;
    }
    let mut uri = uri::Parts::default();
    uri.scheme = Some(if server.tls {
        Scheme::HTTPS
    } else {
        Scheme::HTTP
    });
    uri.authority = Some(authority.clone());
    uri.path_and_query = Some(path_and_query.clone());
    Uri::from_parts(uri).ok()
}

/// The upstream URI written out and parsed: `scheme://host:port` and the client's path and
/// query (`/` when it has none).
fn formatted_uri(parts: &Parts, server: &CompiledServer) -> Result<Uri, GatewayError> {
    let scheme = if server.tls { "https" } else { "http" };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |path_and_query| path_and_query.as_str());
    format!("{scheme}://{}:{}{path_and_query}", server.host, server.port)
        .parse()
        .map_err(|error: uri::InvalidUri| GatewayError::BadRequest {
            reason: error.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "gateway:443"),
            ("connection", "keep-alive"),
            ("te", "trailers"),
            ("authorization", "Bearer client-token"),
            ("impersonate-user", "root"),
            ("impersonate-group", "system:masters"),
            ("accept", "application/json"),
            ("x-custom", "a"),
            ("x-custom", "b"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        headers
    }

    #[test]
    fn upstream_headers_replace_the_clients_identity_with_the_user() {
        let user = UserInfo::new("alice", &["devs", "ops"]);
        let bearer = HeaderValue::from_static("Bearer gateway-token");
        let headers = upstream_headers(&client_headers(), &user, Some(&bearer)).unwrap();
        assert_eq!(headers["authorization"], "Bearer gateway-token");
        assert_eq!(headers["impersonate-user"], "alice");
        let groups: Vec<_> = headers.get_all("impersonate-group").iter().collect();
        assert_eq!(groups, ["devs", "ops"]);
        for hop in ["host", "connection", "te"] {
            assert!(!headers.contains_key(hop), "{hop}");
        }
        assert_eq!(headers["accept"], "application/json");
        let custom: Vec<_> = headers.get_all("x-custom").iter().collect();
        assert_eq!(custom, ["a", "b"], "repeated headers keep every value");
    }

    #[test]
    fn request_header_authentication_headers_from_clients_never_go_upstream() {
        let mut client = client_headers();
        for (name, value) in [
            ("x-remote-user", "system:admin"),
            ("X-Remote-Group", "system:masters"),
            ("x-remote-extra-scopes", "all"),
            ("x-remote-uid", "0"),
        ] {
            client.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static(value),
            );
        }
        let user = UserInfo::new("alice", &[]);
        let headers = upstream_headers(&client, &user, None).unwrap();
        for (name, _) in &headers {
            assert!(!name.as_str().starts_with("x-remote-"), "{name} forwarded");
        }
        assert_eq!(headers["x-custom"], "a", "other x- headers stay");
    }

    #[test]
    fn identity_headers_spelled_with_underscores_never_go_upstream() {
        let mut client = client_headers();
        for name in [
            "x_remote_user",
            "X_Remote_Group",
            "x-remote_extra_scopes",
            "impersonate_user",
            "Impersonate_Group",
            "impersonate_extra_scopes",
            "impersonate-uid_",
        ] {
            client.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("system:admin"),
            );
        }
        client.append("x_custom_header", HeaderValue::from_static("kept"));
        let user = UserInfo::new("alice", &[]);
        let headers = upstream_headers(&client, &user, None).unwrap();
        let names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        for (name, value) in &headers {
            assert_ne!(value, "system:admin", "{name} forwarded: {names:?}");
        }
        assert_eq!(headers["x_custom_header"], "kept", "other `_` headers stay");
        assert_eq!(headers["impersonate-user"], "alice");
    }

    #[test]
    fn an_upgrade_announcing_a_body_is_refused() {
        let head = |extra: &str| {
            let text = format!(
                "GET /api/v1/namespaces/default/pods/web/exec HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n{extra}\r\n"
            );
            crate::head::parse_request(text.as_bytes()).unwrap().headers
        };
        for extra in [
            "Content-Length: 10\r\n",
            "Content-Length: 0\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: chunked\r\n",
        ] {
            let error = refuse_upgrade_body(&head(extra)).unwrap_err();
            assert_eq!(error.http_status(), 400, "{extra}");
            assert!(error.to_string().contains("no body"), "{error}");
        }
        assert!(refuse_upgrade_body(&head("")).is_ok());
        assert!(refuse_upgrade_body(&head("Content-Length: 0\r\n")).is_ok());
    }

    #[test]
    fn the_gateways_bearer_is_never_indexed() {
        let user = UserInfo::new("alice", &[]);
        let bearer = HeaderValue::from_static("Bearer gateway-token");
        let headers = upstream_headers(&client_headers(), &user, Some(&bearer)).unwrap();
        assert!(headers["authorization"].is_sensitive());
    }

    #[test]
    fn without_its_own_token_the_gateway_sends_no_authorization() {
        let user = UserInfo::new("alice", &[]);
        let headers = upstream_headers(&client_headers(), &user, None).unwrap();
        assert!(!headers.contains_key("authorization"));
        assert!(!headers.contains_key("impersonate-group"));
    }

    #[test]
    fn a_user_that_cannot_be_a_header_is_a_bad_request() {
        let user = UserInfo::new("bad\nname", &[]);
        let error = upstream_headers(&HeaderMap::new(), &user, None).unwrap_err();
        assert_eq!(error.http_status(), 400);
    }

    #[test]
    fn bearer_tokens_need_the_scheme_and_a_value() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            headers
        };
        assert_eq!(bearer_token(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&with("Basic abc")), None);
        assert_eq!(bearer_token(&with("Bearer ")), None);
        assert_eq!(bearer_token(&with("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn the_upstream_request_keeps_method_path_and_query() {
        let (parts, ()) = Request::post("/api/v1/namespaces/a/pods?dryRun=All")
            .body(())
            .unwrap()
            .into_parts();
        let server = CompiledServer {
            endpoint: "https://10.0.0.1:6443".into(),
            uri: "https://10.0.0.1:6443".parse().unwrap(),
            tls: true,
            host: "10.0.0.1".into(),
            port: 6443,
            disabled: false,
            agent: None,
        };
        let mut headers = HeaderMap::new();
        headers.insert("impersonate-user", HeaderValue::from_static("alice"));
        let request = upstream_request(&parts, &server, headers).unwrap();
        assert_eq!(request.method(), "POST");
        assert_eq!(
            request.uri(),
            "https://10.0.0.1:6443/api/v1/namespaces/a/pods?dryRun=All"
        );
        assert_eq!(request.headers()["impersonate-user"], "alice");
        let plain = CompiledServer {
            tls: false,
            ..server
        };
        let request = upstream_request(&parts, &plain, HeaderMap::new()).unwrap();
        assert_eq!(request.uri().scheme_str(), Some("http"));
    }

    #[test]
    fn the_upstream_uri_is_the_same_reused_or_formatted() {
        let endpoints = [
            ("https://10.0.0.1:6443", 6443),
            ("https://api.example.com", 443),
            ("http://user@h:8080", 8080),
            ("http://h:80", 80),
        ];
        for (endpoint, port) in endpoints {
            let uri: Uri = endpoint.parse().unwrap();
            let server = CompiledServer {
                endpoint: endpoint.into(),
                tls: uri.scheme_str() != Some("http"),
                host: uri.host().unwrap().into(),
                port,
                uri,
                disabled: false,
                agent: None,
            };
            for path in ["/api/v1/pods?limit=1", "/", "/healthz"] {
                let (parts, ()) = Request::get(path).body(()).unwrap().into_parts();
                let formatted = formatted_uri(&parts, &server).unwrap();
                let request = upstream_request(&parts, &server, HeaderMap::new()).unwrap();
                assert_eq!(request.uri(), &formatted, "{endpoint}{path}");
                assert_eq!(request.uri().to_string(), formatted.to_string());
            }
        }
    }
}
