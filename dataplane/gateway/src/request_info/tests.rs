//! The cases of k8s.io/apiserver's `requestinfo_test.go`, plus field selectors, long-running
//! detection and property tests.

use super::*;
use proptest::prelude::*;

fn parse(method: &str, url: &str) -> RequestInfo<'static> {
    let url: &'static str = Box::leak(url.to_string().into_boxed_str());
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    RequestInfo::parse(method, path, query).unwrap()
}

/// method, url, verb, prefix, group, version, namespace, resource, subresource, name, parts
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
);

#[test]
fn resource_requests_match_kubernetes_table() {
    // method, url, verb, prefix, group, version, namespace, resource, subresource, name, parts
    let cases: &[Case] = &[
        (
            "GET",
            "/api/v1/namespaces",
            "list",
            "api",
            "",
            "v1",
            "",
            "namespaces",
            "",
            "",
            "namespaces",
        ),
        (
            "GET",
            "/api/v1/namespaces/other",
            "get",
            "api",
            "",
            "v1",
            "other",
            "namespaces",
            "",
            "other",
            "namespaces/other",
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods",
            "list",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods/foo",
            "get",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo",
        ),
        (
            "HEAD",
            "/api/v1/namespaces/other/pods/foo",
            "get",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo",
        ),
        (
            "GET",
            "/api/v1/pods",
            "list",
            "api",
            "",
            "v1",
            "",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "HEAD",
            "/api/v1/pods",
            "list",
            "api",
            "",
            "v1",
            "",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "PATCH",
            "/api/v1/namespaces/new-namespace",
            "patch",
            "api",
            "",
            "v1",
            "new-namespace",
            "namespaces",
            "",
            "new-namespace",
            "namespaces/new-namespace",
        ),
        // special verbs
        (
            "GET",
            "/api/v1/proxy/namespaces/other/pods/foo",
            "proxy",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo",
        ),
        (
            "GET",
            "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource",
            "proxy",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo/subpath/not/a/subresource",
        ),
        (
            "GET",
            "/api/v1/watch/pods",
            "watch",
            "api",
            "",
            "v1",
            "",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/pods?watch=true",
            "watch",
            "api",
            "",
            "v1",
            "",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/pods?watch=false",
            "list",
            "api",
            "",
            "v1",
            "",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/watch/namespaces/other/pods",
            "watch",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods?watch=1",
            "watch",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods?watch=0",
            "list",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        // subresource identification
        (
            "GET",
            "/api/v1/namespaces/other/pods/foo/status",
            "get",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "status",
            "foo",
            "pods/foo/status",
        ),
        (
            "GET",
            "/api/v1/namespaces/other/pods/foo/proxy/subpath",
            "get",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "proxy",
            "foo",
            "pods/foo/proxy/subpath",
        ),
        (
            "PUT",
            "/api/v1/namespaces/other/finalize",
            "update",
            "api",
            "",
            "v1",
            "other",
            "namespaces",
            "finalize",
            "other",
            "namespaces/other/finalize",
        ),
        (
            "PUT",
            "/api/v1/namespaces/other/status",
            "update",
            "api",
            "",
            "v1",
            "other",
            "namespaces",
            "status",
            "other",
            "namespaces/other/status",
        ),
        // verb identification
        (
            "PATCH",
            "/api/v1/namespaces/other/pods/foo",
            "patch",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/other/pods/foo",
            "delete",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "foo",
            "pods/foo",
        ),
        (
            "POST",
            "/api/v1/namespaces/other/pods",
            "create",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        // deletecollection verb identification
        (
            "DELETE",
            "/api/v1/nodes",
            "deletecollection",
            "api",
            "",
            "v1",
            "",
            "nodes",
            "",
            "",
            "nodes",
        ),
        (
            "DELETE",
            "/api/v1/namespaces",
            "deletecollection",
            "api",
            "",
            "v1",
            "",
            "namespaces",
            "",
            "",
            "namespaces",
        ),
        (
            "DELETE",
            "/api/v1/namespaces/other/pods",
            "deletecollection",
            "api",
            "",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        (
            "DELETE",
            "/apis/extensions/v1/namespaces/other/pods",
            "deletecollection",
            "apis",
            "extensions",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        // api group identification
        (
            "POST",
            "/apis/extensions/v1/namespaces/other/pods",
            "create",
            "apis",
            "extensions",
            "v1",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
        // api version identification
        (
            "POST",
            "/apis/extensions/v1beta3/namespaces/other/pods",
            "create",
            "apis",
            "extensions",
            "v1beta3",
            "other",
            "pods",
            "",
            "",
            "pods",
        ),
    ];
    for (
        method,
        url,
        verb,
        prefix,
        group,
        version,
        namespace,
        resource,
        subresource,
        name,
        parts,
    ) in cases
    {
        let info = parse(method, url);
        assert!(info.is_resource_request, "{method} {url}");
        assert_eq!(info.verb.as_str(), *verb, "verb of {method} {url}");
        assert_eq!(info.api_prefix, *prefix, "prefix of {url}");
        assert_eq!(info.api_group, *group, "group of {url}");
        assert_eq!(info.api_version, *version, "version of {url}");
        assert_eq!(info.namespace, *namespace, "namespace of {url}");
        assert_eq!(info.resource, *resource, "resource of {url}");
        assert_eq!(info.subresource, *subresource, "subresource of {url}");
        assert_eq!(info.name, *name, "name of {url}");
        assert_eq!(info.parts, *parts, "parts of {url}");
    }
}

#[test]
fn paths_without_enough_steps_are_non_resource_requests() {
    for path in [
        "/",
        "/api/version/",
        "/apis/group/version/",
        "/badprefix/version/resource",
        "/apis/version/resource",
        "/not-api/version/resource",
        "/apis/extensions/v1beta1",
        "/apis/extensions/v1beta1/",
        "/api/version",
        "/api",
        "",
        "/healthz",
        "/version",
        "/openapi/v2",
    ] {
        let info = parse("GET", path);
        assert!(!info.is_resource_request, "{path}");
        assert_eq!(info.verb, Verb::Get);
        assert_eq!(info.path, path);
    }
    for path in [
        "/api/version/resource",
        "/apis/group/version/resource/name/subresource",
        "/api/version/resource/name/subresource",
        "/apis/batch/v1/job",
        "/apis/batch/v1/job/foo",
        "/apis/batch/v1/job/foo/scale",
    ] {
        assert!(parse("GET", path).is_resource_request, "{path}");
    }
}

#[test]
fn non_resource_verbs_are_lower_cased_methods() {
    assert_eq!(parse("POST", "/healthz").verb, Verb::Post);
    assert_eq!(parse("HEAD", "/healthz").verb, Verb::Head);
    assert_eq!(parse("PUT", "/x").verb, Verb::Put);
    assert_eq!(parse("OPTIONS", "/x").verb, Verb::Options);
    assert_eq!(parse("BREW", "/x").verb, Verb::Other);
    assert_eq!(parse("BREW", "/api/v1/pods").verb, Verb::Other);
}

#[test]
fn special_verb_without_kind_is_an_error() {
    assert!(matches!(
        RequestInfo::parse("GET", "/api/v1/watch", ""),
        Err(RequestInfoError::MissingKind { .. })
    ));
    assert!(RequestInfo::parse("GET", "/apis/g/v1/proxy", "").is_err());
}

#[test]
fn field_selector_parsing_matches_kubernetes() {
    // url, name, verb
    let cases = [
        ("/apis/group/version/resource", "", "list"),
        (
            "/apis/group/version/resource?fieldSelector=metadata.name=name1",
            "name1",
            "list",
        ),
        (
            "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1",
            "name1",
            "watch",
        ),
        (
            "/apis/group/version/resource?fieldSelector=foo=bar",
            "",
            "list",
        ),
        (
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo",
            "",
            "list",
        ),
        (
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true",
            "",
            "watch",
        ),
        (
            "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false",
            "",
            "list",
        ),
        // kubectl percent-encodes the selector
        (
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb-1&watch=1",
            "web-1",
            "watch",
        ),
        (
            "/api/v1/pods?fieldSelector=metadata.name%3D%3Dweb",
            "web",
            "list",
        ),
        (
            "/api/v1/pods?fieldSelector=metadata.name!%3Dweb",
            "",
            "list",
        ),
        (
            "/api/v1/pods?fieldSelector=status.phase%3DRunning,metadata.name%3Da",
            "a",
            "list",
        ),
        // names that are not valid path segments are dropped
        ("/api/v1/pods?fieldSelector=metadata.name%3D..", "", "list"),
        (
            "/api/v1/pods?fieldSelector=metadata.name%3Da%2Fb",
            "",
            "list",
        ),
        // escaped comma is part of the value
        (
            "/api/v1/pods?fieldSelector=metadata.name%3Da%5C%2Cb",
            "a,b",
            "list",
        ),
        // "f" is false for the parameter codec, but true in the error fallback
        ("/api/v1/pods?watch=f", "", "list"),
        ("/api/v1/pods?watch=f&fieldSelector=bad", "", "watch"),
        ("/api/v1/pods?watch=", "", "watch"),
        ("/api/v1/pods?watch=true;x=1", "", "list"),
        ("/api/v1/pods?watch=0&watch=1", "", "list"),
    ];
    for (url, name, verb) in cases {
        let info = parse("GET", url);
        assert_eq!(info.name, name, "name of {url}");
        assert_eq!(info.verb.as_str(), verb, "verb of {url}");
    }
}

#[test]
fn delete_with_field_selector_stays_deletecollection() {
    let info = parse("DELETE", "/api/v1/pods?fieldSelector=metadata.name%3Da");
    assert_eq!(info.verb, Verb::DeleteCollection);
    assert_eq!(info.name, "");
}

#[test]
fn long_running_requests_are_detected_like_kubernetes() {
    assert!(parse("GET", "/api/v1/pods?watch=true").is_long_running());
    assert!(parse("GET", "/api/v1/watch/pods").is_long_running());
    assert!(parse("GET", "/api/v1/proxy/namespaces/a/pods/b").is_long_running());
    for sub in ["exec", "attach", "portforward", "log", "proxy"] {
        let url = format!("/api/v1/namespaces/a/pods/b/{sub}");
        assert!(parse("POST", &url).is_long_running(), "{url}");
    }
    assert!(!parse("GET", "/api/v1/pods").is_long_running());
    assert!(!parse("GET", "/api/v1/namespaces/a/pods/b/status").is_long_running());
    assert!(!parse("GET", "/healthz").is_long_running());
    assert!(!parse("GET", "/logs/exec").is_long_running());
}

#[test]
fn decode_path_borrows_unless_encoded() {
    assert!(matches!(decode_path("/api/v1/pods"), Ok(Cow::Borrowed(_))));
    assert_eq!(
        decode_path("/api/v1/namespaces/x/%73ecrets").unwrap(),
        "/api/v1/namespaces/x/secrets"
    );
    assert_eq!(
        decode_path("/api/v1/namespaces/caf%C3%A9").unwrap(),
        "/api/v1/namespaces/café"
    );
}

#[test]
fn an_encoded_resource_is_routed_as_the_apiserver_decodes_it() {
    let decoded = decode_path("/api/v1/namespaces/x/%73ecrets/%61").unwrap();
    let info = parse("GET", &decoded);
    assert_eq!(info.resource, "secrets");
    assert_eq!(info.name, "a");
    assert_eq!(info.namespace, "x");
}

#[test]
fn paths_that_decode_two_ways_are_refused() {
    for (raw, error) in [
        ("/api/v1/namespaces/a%2Fb/pods", PathError::EncodedSlash),
        ("/api/v1/namespaces/a%2fb/pods", PathError::EncodedSlash),
        ("/api/v1/namespaces/%ff/pods", PathError::InvalidUtf8),
        ("/api/v1/namespaces/%C3/pods", PathError::InvalidUtf8),
        ("/api/v1/namespaces/x/../secrets", PathError::DotSegment),
        ("/api/v1/namespaces/x/%2e%2E/secrets", PathError::DotSegment),
        ("/api/v1/./pods", PathError::DotSegment),
        ("/api/v1/namespaces/x/pods/..", PathError::DotSegment),
        ("/api/v1/pods%00", PathError::ControlCharacter),
        ("/api/v1/pods%0a", PathError::ControlCharacter),
        ("/api/v1/pods%7F", PathError::ControlCharacter),
        ("/api/v1/pods%", PathError::MalformedEscape),
        ("/api/v1/pods%4", PathError::MalformedEscape),
        ("/api/v1/pods%zz", PathError::MalformedEscape),
        ("api/v1/pods", PathError::NotAbsolute),
    ] {
        assert_eq!(decode_path(raw), Err(error), "{raw}");
    }
    // Dots inside a name are names, not segments.
    assert!(decode_path("/api/v1/namespaces/x/configmaps/a..b").is_ok());
    assert!(decode_path("/apis/apps/v1/namespaces/x/deployments/.hidden").is_ok());
    assert!(PathError::EncodedSlash.to_string().contains("%2F"));
}

#[test]
fn verb_names_round_trip() {
    for verb in Verb::ALL {
        if verb == Verb::Other {
            assert_eq!(Verb::from_name(""), None);
        } else {
            assert_eq!(Verb::from_name(verb.as_str()), Some(verb));
        }
    }
    assert_eq!(Verb::from_name("impersonate"), None);
}

proptest! {
    #[test]
    fn arbitrary_paths_never_panic(method in "(GET|POST|PUT|PATCH|DELETE|HEAD|[A-Z]{0,8})", path in "\\PC{0,80}", query in "\\PC{0,80}") {
        if let Ok(info) = RequestInfo::parse(&method, &path, &query) {
            let _ = info.is_long_running();
        }
    }

    #[test]
    fn kubernetes_shaped_paths_never_panic(
        steps in proptest::collection::vec("(api|apis|v1|namespaces|watch|proxy|pods|status|finalize|x|%2F|\\\\|,|=|)", 0..9),
        query in "(watch=(true|f|0|)|fieldSelector=(metadata.name(=|==|!=|%3D)[a-z\\\\,=%]{0,6})|&|;){0,5}",
        method in "(GET|POST|PUT|PATCH|DELETE|HEAD)",
    ) {
        let path = format!("/{}", steps.join("/"));
        let Ok(decoded) = decode_path(&path) else {
            return Ok(());
        };
        if let Ok(info) = RequestInfo::parse(&method, &decoded, &query) {
            prop_assert!(info.path == decoded.as_ref());
            prop_assert!(!info.path.split('/').any(|step| step == ".." || step == "."));
            if info.is_resource_request {
                prop_assert!(info.api_prefix == "api" || info.api_prefix == "apis");
            }
        }
    }
}
