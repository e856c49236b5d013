//! What an API request asks for, read from its method, path and query before anything else
//! runs: the resource it names, the verb, and whether it is a discovery or health path. Pure,
//! so authorization and routing decide on plain data.

use crate::auth::Verb;

/// The longest path the parser looks at; a longer one is refused before it is split.
pub const MAX_PATH_BYTES: usize = 4096;

/// A request to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiRequest<'a> {
    /// `/api`, `/apis`, `/apis/<group>`, `/apis/<group>/<version>`, `/openapi/...`, `/version`:
    /// readable by every authenticated caller.
    Discovery(&'a str),
    /// `/healthz`, `/readyz`, `/livez`, `/metrics`: served without authentication.
    Health(&'a str),
    /// A resource request.
    Resource(ResourceRequest<'a>),
}

/// A request for objects of one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceRequest<'a> {
    pub verb: Verb,
    pub group: &'a str,
    pub version: &'a str,
    /// Plural name (`upstreamclusters`).
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

/// A path or method the API server does not serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request path is longer than {MAX_PATH_BYTES} bytes")]
    PathTooLong,
    /// 404: nothing is served at this path.
    #[error("the server could not find the requested resource")]
    NotFound,
    /// 405: the path exists, the method does not apply to it.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
}

impl RequestError {
    pub fn http_status(&self) -> u16 {
        match self {
            RequestError::PathTooLong => 414,
            RequestError::NotFound => 404,
            RequestError::MethodNotAllowed => 405,
        }
    }
}

/// Parses `method`, `path` (without the query) and `query` (without `?`, may be empty).
pub fn parse<'a>(method: &str, path: &'a str, query: &str) -> Result<ApiRequest<'a>, RequestError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(RequestError::PathTooLong);
    }
    match path {
        "/healthz" | "/readyz" | "/livez" | "/metrics" => {
            return read_only(method, ApiRequest::Health(path))
        }
        "/api" | "/apis" | "/version" => return read_only(method, ApiRequest::Discovery(path)),
        _ => {}
    }
    if path == "/openapi/v2" || path == "/openapi/v3" || path.starts_with("/openapi/v3/") {
        return read_only(method, ApiRequest::Discovery(path));
    }
    // The core group (`/api/v1/...`) has no group segment: its group is "".
    let (core, rest) = match (path.strip_prefix("/api/"), path.strip_prefix("/apis/")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(RequestError::NotFound),
    };
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.iter().any(|segment| segment.is_empty()) {
        return Err(RequestError::NotFound);
    }
    match (core, segments.as_slice()) {
        (true, [_]) | (false, [_] | [_, _]) => read_only(method, ApiRequest::Discovery(path)),
        (true, [version, rest @ ..]) => {
            resource(method, query, "", version, rest).map(ApiRequest::Resource)
        }
        (false, [group, version, rest @ ..]) => {
            resource(method, query, group, version, rest).map(ApiRequest::Resource)
        }
        (_, []) => Err(RequestError::NotFound),
    }
}

fn read_only<'a>(method: &str, request: ApiRequest<'a>) -> Result<ApiRequest<'a>, RequestError> {
    match method {
        "GET" | "HEAD" => Ok(request),
        _ => Err(RequestError::MethodNotAllowed),
    }
}

/// `[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]` after `/apis/<group>/<version>/`.
fn resource<'a>(
    method: &str,
    query: &str,
    group: &'a str,
    version: &'a str,
    segments: &[&'a str],
) -> Result<ResourceRequest<'a>, RequestError> {
    let (namespace, rest) = match segments {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => (Some(*namespace), rest),
        _ => (None, segments),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, subresource] => (*resource, Some(*name), Some(*subresource)),
        _ => return Err(RequestError::NotFound),
    };
    let verb = verb(method, name.is_some(), is_watch(query))?;
    Ok(ResourceRequest {
        verb,
        group,
        version,
        resource,
        namespace,
        name,
        subresource,
    })
}

/// The verb kube-apiserver derives from the method, whether a name is given, and `watch`:
/// only a GET of a collection is a watch (kube's RequestInfo), so `?watch=true` on a named GET
/// or on a write changes nothing; in particular it does not make the request long-running.
fn verb(method: &str, named: bool, watch: bool) -> Result<Verb, RequestError> {
    Ok(match (method, named) {
        ("GET" | "HEAD", false) if watch => Verb::Watch,
        ("GET" | "HEAD", true) => Verb::Get,
        ("GET" | "HEAD", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => return Err(RequestError::MethodNotAllowed),
    })
}

/// `watch=true` or `watch=1` (client-go sends `watch=true`; kubectl `get -w` too).
fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn resource_of(method: &str, path: &str, query: &str) -> ResourceRequest<'static> {
        let path: &'static str = Box::leak(path.to_string().into_boxed_str());
        match parse(method, path, query) {
            Ok(ApiRequest::Resource(request)) => request,
            other => panic!("{method} {path}: {other:?}"),
        }
    }

    #[test]
    fn cluster_scoped_paths_give_the_kube_verbs() {
        let base = "/apis/proxy.sluice.dev/v1alpha1/upstreamclusters";
        for (method, path, query, verb) in [
            ("GET", base.to_string(), "", Verb::List),
            (
                "GET",
                base.to_string(),
                "watch=true&resourceVersion=5",
                Verb::Watch,
            ),
            ("GET", format!("{base}/a"), "watch=1", Verb::Get),
            ("POST", base.to_string(), "watch=true", Verb::Create),
            ("GET", format!("{base}/a"), "", Verb::Get),
            ("POST", base.to_string(), "", Verb::Create),
            ("PUT", format!("{base}/a"), "", Verb::Update),
            ("PATCH", format!("{base}/a"), "", Verb::Patch),
            ("DELETE", format!("{base}/a"), "", Verb::Delete),
            ("DELETE", base.to_string(), "", Verb::DeleteCollection),
        ] {
            let request = resource_of(method, &path, query);
            assert_eq!(request.verb, verb, "{method} {path}?{query}");
            assert_eq!(
                (
                    request.group,
                    request.version,
                    request.resource,
                    request.namespace
                ),
                ("proxy.sluice.dev", "v1alpha1", "upstreamclusters", None)
            );
        }
        let status = resource_of("PUT", &format!("{base}/a/status"), "");
        assert_eq!(
            (status.name, status.subresource),
            (Some("a"), Some("status"))
        );
    }

    #[test]
    fn namespaced_paths_carry_their_namespace() {
        let request = resource_of(
            "GET",
            "/apis/policy.sluice.dev/v1alpha1/namespaces/prod/networkpolicies/web",
            "",
        );
        assert_eq!(request.namespace, Some("prod"));
        assert_eq!(
            (request.resource, request.name),
            ("networkpolicies", Some("web"))
        );
        // A resource called "namespaces" is a cluster-scoped list, not a namespace prefix.
        let listed = resource_of("GET", "/apis/g/v1/namespaces", "");
        assert_eq!((listed.resource, listed.namespace), ("namespaces", None));
    }

    #[test]
    fn core_group_paths_have_the_empty_group() {
        let request = resource_of("GET", "/api/v1/namespaces/default/events/e1", "");
        assert_eq!(
            (request.group, request.version, request.resource),
            ("", "v1", "events")
        );
        assert_eq!(
            (request.namespace, request.name),
            (Some("default"), Some("e1"))
        );
        let all = resource_of("GET", "/api/v1/events", "watch=true");
        assert_eq!((all.verb, all.namespace), (Verb::Watch, None));
        assert_eq!(
            parse("GET", "/api/v1", ""),
            Ok(ApiRequest::Discovery("/api/v1"))
        );
    }

    #[test]
    fn discovery_and_health_are_read_only() {
        for path in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/proxy.sluice.dev",
            "/apis/proxy.sluice.dev/v1alpha1",
            "/openapi/v3",
            "/openapi/v3/apis/proxy.sluice.dev/v1alpha1",
            "/openapi/v2",
            "/version",
        ] {
            assert_eq!(parse("GET", path, ""), Ok(ApiRequest::Discovery(path)));
            assert_eq!(parse("POST", path, ""), Err(RequestError::MethodNotAllowed));
        }
        assert_eq!(
            parse("GET", "/readyz", ""),
            Ok(ApiRequest::Health("/readyz"))
        );
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        for (method, path) in [
            ("GET", "/"),
            ("GET", "/api/"),
            ("GET", "/api/v1//events"),
            ("GET", "/apis/g/v1/r/name/sub/extra"),
            ("GET", "/apis/g/v1//r"),
            ("GET", "/apis/g/v1/r/"),
            ("GET", "/openapi/v3x"),
        ] {
            assert_eq!(
                parse(method, path, ""),
                Err(RequestError::NotFound),
                "{path}"
            );
        }
        for (method, path) in [
            ("POST", "/apis/g/v1/r/name"),
            ("PUT", "/apis/g/v1/r"),
            ("TRACE", "/apis/g/v1/r"),
        ] {
            assert_eq!(
                parse(method, path, ""),
                Err(RequestError::MethodNotAllowed),
                "{method} {path}"
            );
        }
        let long = format!("/apis/{}", "a".repeat(MAX_PATH_BYTES));
        assert_eq!(parse("GET", &long, ""), Err(RequestError::PathTooLong));
        assert_eq!(RequestError::PathTooLong.http_status(), 414);
    }

    proptest! {
        #[test]
        fn arbitrary_requests_never_panic(method in "[A-Z]{0,8}", path in "/[a-z/.0-9]{0,60}", query in "[a-z=&0-9]{0,30}") {
            let _ = parse(&method, &path, &query);
        }
    }
}
