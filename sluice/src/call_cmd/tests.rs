use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Harness {
    #[command(flatten)]
    call: CallArgs,
}

fn call_args(extra: &[&str], secret: &tempfile::NamedTempFile) -> CallArgs {
    let path = secret.path().to_str().unwrap();
    let base = ["call", "--agent", "7", "--jwt-secret-file", path];
    Harness::try_parse_from(base.iter().chain(extra))
        .unwrap()
        .call
}

fn secret() -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, b"0123456789abcdef0123456789abcdef\n").unwrap();
    file
}

/// The node's own validator, configured as `sluice up` configures it.
fn validator(max_lifetime: Duration) -> sluice_tunnel::auth::JwtValidator {
    sluice_tunnel::auth::JwtValidator::new(&sluice_config::JwtConfig {
        secret: b"0123456789abcdef0123456789abcdef".to_vec(),
        secret_file: "jwt.secret".into(),
        issuer: "gitlab".into(),
        audience: "gitlab-kas".into(),
        leeway: Duration::from_secs(5),
        max_lifetime,
    })
}

#[test]
fn the_signed_jwt_passes_the_nodes_own_check_and_its_limits_hold() {
    let args = call_args(&["--endpoint", "127.0.0.1:1", "E/S"], &secret());
    let key = args.jwt_secret_file.clone().unwrap();
    let token = sign_jwt(&key, "gitlab", "gitlab-kas", now(), args.token_lifetime).unwrap();
    assert_eq!(
        validator(Duration::from_secs(60)).validate_token(&token),
        Ok(now() + 30)
    );
    // Longer than the node allows, another issuer, another key: refused, each for its reason.
    let node = validator(Duration::from_secs(10));
    assert_eq!(
        node.validate_token(&token).map_err(|error| error.reason()),
        Err("too_long_lived")
    );
    let other_issuer = sign_jwt(&key, "me", "gitlab-kas", now(), Duration::from_secs(5)).unwrap();
    assert_eq!(
        node.validate_token(&other_issuer)
            .map_err(|error| error.reason()),
        Err("wrong_issuer")
    );
    let other_key = Secret(b"another key".to_vec());
    let forged = sign_jwt(
        &other_key,
        "gitlab",
        "gitlab-kas",
        now(),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(
        node.validate_token(&forged).map_err(|error| error.reason()),
        Err("bad_signature")
    );
}

#[test]
fn the_metadata_carries_the_token_the_agent_the_deadline_and_extra_headers() {
    let args = call_args(
        &[
            "--endpoint",
            "127.0.0.1:1",
            "--timeout",
            "3s",
            "-H",
            "x-trace: a",
            "-H",
            "x-trace: b",
            "E/S",
        ],
        &secret(),
    );
    let headers = metadata(&args, "abc.def.ghi").unwrap();
    assert_eq!(headers["authorization"], "Bearer abc.def.ghi");
    assert_eq!(headers["sluice-agent-id"], "7");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["te"], "trailers");
    let timeout = sluice_grpc::parse_timeout(headers["grpc-timeout"].as_bytes()).unwrap();
    assert_eq!(timeout, Duration::from_secs(3));
    let traces: Vec<_> = headers.get_all("x-trace").iter().collect();
    assert_eq!(traces, ["a", "b"]);
    assert!(metadata(&args, "").unwrap().get("authorization").is_none());
    assert!(metadata(&args, "line\nbreak").is_none());
}

#[test]
fn tls_follows_the_scheme_and_the_ca() {
    let secret = secret();
    let https = call_args(&["--endpoint", "https://127.0.0.1:1", "E/S"], &secret);
    assert!(matches!(prepare(&https), Err(UsageError::HttpsWithoutCa)));
    let plain = call_args(
        &["--endpoint", "127.0.0.1:1", "--data", "hi", "E/S"],
        &secret,
    );
    let prepared = prepare(&plain).unwrap();
    assert!(prepared.tls.is_none());
    assert_eq!(prepared.message, Bytes::from_static(b"hi"));
    let call = resolve(&plain, prepared).unwrap();
    assert_eq!(call.uri.to_string(), "http://127.0.0.1:1/E/S");
    assert_eq!(call.address, "127.0.0.1:1".parse().unwrap());
}

#[test]
fn a_token_file_is_sent_as_it_is_unless_it_cannot_be_a_header() {
    let args = |token: &[u8]| {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, token).unwrap();
        let path = file.path().to_str().unwrap().to_string();
        let parsed = Harness::try_parse_from([
            "call",
            "--endpoint",
            "127.0.0.1:1",
            "--agent",
            "1",
            "--token-file",
            &path,
            "E/S",
        ])
        .unwrap()
        .call;
        prepare(&parsed)
    };
    let prepared = args(b"eyJ.a.b\n").unwrap();
    assert_eq!(prepared.headers["authorization"], "Bearer eyJ.a.b");
    assert!(matches!(args(b"two words"), Err(UsageError::Token(_))));
}

#[test]
fn each_status_has_an_exit_code_of_its_own_above_the_shared_ones() {
    assert_eq!(exit_code(Code::Cancelled), 65);
    assert_eq!(exit_code(Code::DeadlineExceeded), 68);
    assert_eq!(exit_code(Code::PermissionDenied), 71);
    assert_eq!(exit_code(Code::Unavailable), 78);
    assert_eq!(exit_code(Code::Unauthenticated), 80);
}
