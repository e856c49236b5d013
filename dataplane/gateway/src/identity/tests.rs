use super::*;
use proptest::prelude::*;

fn alice() -> UserInfo {
    let mut user = UserInfo::new("alice", &["dev", "system:authenticated"]);
    user.uid = "42".into();
    user.extra
        .insert("scopes".into(), vec!["view".into(), "edit".into()]);
    user.extra
        .insert("example.org/Team Name".into(), vec!["blue".into()]);
    user
}

fn all(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|value| value.to_str().unwrap().to_string())
        .collect()
}

#[test]
fn client_credentials_and_impersonation_are_stripped() {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Bearer secret"));
    headers.insert("impersonate-user", HeaderValue::from_static("root"));
    headers.append("impersonate-group", HeaderValue::from_static("a"));
    headers.append("impersonate-group", HeaderValue::from_static("b"));
    headers.insert("impersonate-extra-x", HeaderValue::from_static("y"));
    headers.insert("accept", HeaderValue::from_static("application/json"));
    strip_client_identity(&mut headers);
    assert_eq!(headers.len(), 1);
    assert!(headers.contains_key("accept"));
}

#[test]
fn impersonation_headers_follow_client_go() {
    let mut headers = HeaderMap::new();
    write_impersonation_headers(&alice(), &mut headers).unwrap();
    assert_eq!(all(&headers, "Impersonate-User"), ["alice"]);
    assert_eq!(
        all(&headers, "Impersonate-Group"),
        ["dev", "system:authenticated"]
    );
    assert_eq!(all(&headers, "Impersonate-Uid"), ["42"]);
    assert_eq!(all(&headers, "Impersonate-Extra-scopes"), ["view", "edit"]);
    // '/' and ' ' are not header token characters: percent-encoded as client-go does
    assert_eq!(
        all(&headers, "Impersonate-Extra-example.org%2FTeam%20Name"),
        ["blue"]
    );
}

#[test]
fn cached_headers_apply_like_written_ones() {
    let mut written = HeaderMap::new();
    write_impersonation_headers(&alice(), &mut written).unwrap();
    let cached = ImpersonationHeaders::new(&alice()).unwrap();
    let mut applied = HeaderMap::new();
    applied.insert("authorization", HeaderValue::from_static("Bearer client"));
    applied.insert("impersonate-user", HeaderValue::from_static("root"));
    strip_client_identity(&mut applied);
    cached.apply(&mut applied);
    assert_eq!(applied, written);
}

#[test]
fn uid_header_is_omitted_when_unknown() {
    let mut headers = HeaderMap::new();
    write_impersonation_headers(&UserInfo::new("bob", &[]), &mut headers).unwrap();
    assert!(!headers.contains_key("impersonate-uid"));
    assert!(!headers.contains_key("impersonate-group"));
}

#[test]
fn header_injection_in_a_value_is_refused() {
    let mut headers = HeaderMap::new();
    let user = UserInfo::new("eve\r\nX-Evil: 1", &[]);
    assert!(matches!(
        write_impersonation_headers(&user, &mut headers),
        Err(IdentityError::InvalidHeaderValue { .. })
    ));
}

#[test]
fn written_headers_parse_back_to_the_same_user() {
    let mut headers = HeaderMap::new();
    let mut user = alice();
    // The apiserver lower-cases extra keys.
    let team = user.extra.remove("example.org/Team Name").unwrap();
    user.extra.insert("example.org/team name".into(), team);
    write_impersonation_headers(&user, &mut headers).unwrap();
    assert_eq!(requested_impersonation(&headers).unwrap(), Some(user));
}

#[test]
fn no_impersonation_headers_means_none() {
    let mut headers = HeaderMap::new();
    headers.insert("accept", HeaderValue::from_static("*/*"));
    assert_eq!(requested_impersonation(&headers).unwrap(), None);
}

#[test]
fn group_without_user_is_an_error() {
    let mut headers = HeaderMap::new();
    headers.insert("impersonate-group", HeaderValue::from_static("admins"));
    assert_eq!(
        requested_impersonation(&headers),
        Err(IdentityError::ImpersonationWithoutUser {
            header: "impersonate-group".into()
        })
    );
}

#[test]
fn repeated_user_is_an_error() {
    let mut headers = HeaderMap::new();
    headers.append("impersonate-user", HeaderValue::from_static("a"));
    headers.append("impersonate-user", HeaderValue::from_static("b"));
    assert_eq!(
        requested_impersonation(&headers),
        Err(IdentityError::RepeatedImpersonateUser)
    );
}

#[test]
fn checks_cover_user_groups_extras_and_uid() {
    let checks = impersonation_checks(&alice());
    let summary: Vec<_> = checks
        .iter()
        .map(|check| {
            (
                check.kind(),
                check.subresource.as_str(),
                check.name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("user", "", "alice"),
            ("group", "", "dev"),
            ("group", "", "system:authenticated"),
            ("userextra", "example.org/Team Name", "blue"),
            ("userextra", "scopes", "view"),
            ("userextra", "scopes", "edit"),
            ("uid", "", "42"),
        ]
    );
}

#[test]
fn service_account_is_checked_in_its_namespace() {
    let checks = impersonation_checks(&UserInfo::new(
        "system:serviceaccount:kube-system:builder",
        &[],
    ));
    assert_eq!(checks[0].resource, "serviceaccounts");
    assert_eq!(checks[0].namespace, "kube-system");
    assert_eq!(checks[0].name, "builder");
}

fn openssl_certificate(subject: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cert.der");
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            subject,
            "-outform",
            "DER",
            "-keyout",
        ])
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(&out)
        .output()
        .expect("openssl is installed");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    std::fs::read(out).unwrap()
}

#[test]
fn certificate_cn_is_user_and_each_o_a_group() {
    let der = openssl_certificate("/CN=alice/O=dev/O=system:masters");
    assert_eq!(
        user_from_certificate(&der).unwrap(),
        UserInfo::new("alice", &["dev", "system:masters"])
    );
}

#[test]
fn certificate_without_cn_is_refused() {
    let der = openssl_certificate("/O=dev");
    assert_eq!(
        user_from_certificate(&der),
        Err(IdentityError::EmptyCommonName)
    );
}

proptest! {
    #[test]
    fn garbage_certificates_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = user_from_certificate(&bytes);
    }

    #[test]
    fn arbitrary_impersonation_headers_never_panic(
        pairs in proptest::collection::vec(("impersonate-(user|group|uid|extra-[a-z%0-9]{0,6})", proptest::collection::vec(any::<u8>(), 0..12)), 0..6)
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_bytes(&value)) {
                headers.append(name, value);
            }
        }
        if let Ok(Some(user)) = requested_impersonation(&headers) {
            let _ = impersonation_checks(&user);
        }
    }
}
