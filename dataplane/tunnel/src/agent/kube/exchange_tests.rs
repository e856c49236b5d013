#![allow(clippy::unwrap_used)]

use super::*;

fn authority() -> http::uri::Authority {
    "api.internal:6443".parse().unwrap()
}

#[test]
fn the_apiserver_request_takes_only_the_path_from_the_head() {
    let mut headers = HeaderMap::new();
    headers.insert(http::header::HOST, "evil.example:80".parse().unwrap());
    let request = apiserver_request(
        &authority(),
        http::Method::GET,
        "/api/v1/namespaces/default/pods?watch=true",
        headers,
    )
    .unwrap();
    assert_eq!(
        request.uri().to_string(),
        "https://api.internal:6443/api/v1/namespaces/default/pods?watch=true"
    );
    // An absolute URI or a scheme-relative path never becomes the target.
    for path in [
        "http://evil.example/api",
        "//evil.example/api",
        "evil.example/api",
        "",
        "@evil.example/api",
    ] {
        let refused = apiserver_request(&authority(), http::Method::GET, path, HeaderMap::new());
        assert!(refused.is_err(), "{path:?} was accepted");
        assert_eq!(refused.unwrap_err().code(), Code::InvalidArgument);
    }
}

#[test]
fn upgrades_are_recognised_by_either_header() {
    let mut headers = HeaderMap::new();
    assert!(!is_upgrade(&headers));
    headers.insert(
        http::header::CONNECTION,
        "keep-alive, Upgrade".parse().unwrap(),
    );
    assert!(is_upgrade(&headers));
    let mut headers = HeaderMap::new();
    headers.insert(http::header::UPGRADE, "SPDY/3.1".parse().unwrap());
    assert!(is_upgrade(&headers));
    let mut headers = HeaderMap::new();
    headers.insert(http::header::CONNECTION, "upgrades".parse().unwrap());
    assert!(!is_upgrade(&headers));
}

#[test]
fn large_chunks_are_sliced_to_the_data_bound() {
    let chunk = Bytes::from(vec![7u8; 10]);
    let sliced = pieces(chunk.clone(), 4);
    assert_eq!(
        sliced.iter().map(Bytes::len).collect::<Vec<_>>(),
        vec![4, 4, 2]
    );
    assert_eq!(sliced.concat(), chunk.to_vec());
    assert_eq!(pieces(chunk.clone(), 10).len(), 1);
    assert!(pieces(Bytes::new(), 4).is_empty());
}
