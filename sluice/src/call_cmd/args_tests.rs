use super::*;
use clap::Parser;

#[derive(Debug, Parser)]
struct Harness {
    #[command(flatten)]
    call: CallArgs,
}

fn secret_file(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, bytes).unwrap();
    file
}

fn parse(args: &[&str]) -> Result<CallArgs, clap::Error> {
    Harness::try_parse_from(std::iter::once("call").chain(args.iter().copied())).map(|h| h.call)
}

#[test]
fn endpoints_take_a_scheme_an_ipv6_address_or_a_host_name() {
    let plain = parse_endpoint("127.0.0.1:8151").unwrap();
    assert_eq!(
        (plain.host.as_str(), plain.port, plain.tls),
        ("127.0.0.1", 8151, None)
    );
    assert_eq!(
        parse_endpoint("https://node.example:443/").unwrap().tls,
        Some(true)
    );
    assert_eq!(
        parse_endpoint("http://localhost:80").unwrap().tls,
        Some(false)
    );
    let v6 = parse_endpoint("[::1]:8151").unwrap();
    assert_eq!(
        (v6.host.as_str(), v6.authority()),
        ("::1", "[::1]:8151".to_string())
    );
    for wrong in [
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        ":8151",
        "::1:8151",
        "[::1]8151",
        "grpc://127.0.0.1:1",
        "http://127.0.0.1:1/sluice.demo.Echo/Say",
    ] {
        assert!(parse_endpoint(wrong).is_err(), "{wrong}");
    }
}

#[test]
fn methods_become_one_path() {
    for given in [
        "sluice.demo.Echo/Say",
        "/sluice.demo.Echo/Say",
        "sluice.demo.Echo.Say",
    ] {
        assert_eq!(
            parse_method(given).as_deref(),
            Ok("/sluice.demo.Echo/Say"),
            "{given}"
        );
    }
    assert_eq!(parse_method("Echo/Say").as_deref(), Ok("/Echo/Say"));
    for wrong in [
        "",
        "Say",
        "/Echo/",
        "a b/Say",
        "Echo/Say/More",
        "Echo/Sa.y",
        ".x/Say",
        "x./Say",
    ] {
        assert!(parse_method(wrong).is_err(), "{wrong:?}");
    }
}

#[test]
fn metadata_is_lower_cased_and_may_not_replace_what_the_call_sets() {
    let (name, value) = parse_metadata("X-Request-Id:  abc ").unwrap();
    assert_eq!(
        (name.as_str(), value.to_str().unwrap()),
        ("x-request-id", "abc")
    );
    let (name, _) = parse_metadata("trace-bin: AAEC").unwrap();
    assert_eq!(name.as_str(), "trace-bin");
    for reserved in [
        "authorization: Bearer x",
        "Sluice-Agent-Id: 2",
        "grpc-timeout: 1S",
        "content-type: text/plain",
        "te: gzip",
    ] {
        let error = parse_metadata(reserved).unwrap_err();
        assert!(
            error.contains("set by sluice call itself"),
            "{reserved}: {error}"
        );
    }
    for wrong in [
        "no-colon",
        ": empty name",
        "bad name: x",
        "x-bin: not base64!",
        "x: caf\u{e9}",
    ] {
        assert!(parse_metadata(wrong).is_err(), "{wrong:?}");
    }
}

#[test]
fn secrets_lose_their_trailing_newline_and_are_bounded() {
    let file = secret_file(b"0123456789abcdef\r\n");
    let secret = read_secret(file.path().to_str().unwrap()).unwrap();
    assert_eq!(secret.0, b"0123456789abcdef");
    assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
    let empty = secret_file(b" \n");
    assert!(read_secret(empty.path().to_str().unwrap())
        .unwrap_err()
        .ends_with("is empty"));
    let huge = secret_file(&vec![b'a'; 64 * 1024 + 1]);
    assert!(read_secret(huge.path().to_str().unwrap())
        .unwrap_err()
        .contains("more than 65536 bytes"));
    assert!(read_secret("/nonexistent/jwt.secret")
        .unwrap_err()
        .starts_with("/nonexistent/jwt.secret: "));
}

#[test]
fn a_credential_is_required_and_only_one() {
    let secret = secret_file(b"s");
    let path = secret.path().to_str().unwrap();
    let base = ["--endpoint", "127.0.0.1:1", "--agent", "1", "Echo/Say"];
    let error = parse(&base).unwrap_err();
    assert_eq!(
        error.kind(),
        clap::error::ErrorKind::MissingRequiredArgument
    );
    let both = [
        &base[..],
        &["--jwt-secret-file", path, "--token-file", path],
    ]
    .concat();
    assert_eq!(
        parse(&both).unwrap_err().kind(),
        clap::error::ErrorKind::ArgumentConflict
    );
    let call = parse(&[&base[..], &["--token-file", path]].concat()).unwrap();
    assert_eq!(call.token_file, Some(Secret(b"s".to_vec())));
    // The JWT's claims mean nothing to a ready token.
    let issuer = [&base[..], &["--token-file", path, "--issuer", "x"]].concat();
    assert!(parse(&issuer).is_err());
}

#[test]
fn flags_have_the_defaults_of_the_demo_and_check_their_values() {
    let secret = secret_file(b"s");
    let path = secret.path().to_str().unwrap();
    let call = parse(&[
        "--endpoint",
        "127.0.0.1:8151",
        "--agent-id",
        "7",
        "--jwt-secret-file",
        path,
        "sluice.demo.Echo/Say",
        "--data",
        "hello",
        "-H",
        "x-a: 1",
        "-H",
        "x-b: 2",
    ])
    .unwrap();
    assert_eq!(call.agent, 7);
    assert_eq!(
        (call.issuer.as_str(), call.audience.as_str()),
        ("gitlab", "gitlab-kas")
    );
    assert_eq!(call.token_lifetime, Duration::from_secs(30));
    assert_eq!(call.timeout, Duration::from_secs(10));
    assert_eq!(call.output, Output::Text);
    assert_eq!(call.method, "/sluice.demo.Echo/Say");
    assert_eq!(call.data.as_deref(), Some("hello"));
    assert_eq!(call.header.len(), 2);
    let wrong_agent = [
        "--endpoint",
        "127.0.0.1:1",
        "--agent",
        "0",
        "--token-file",
        path,
        "E/S",
    ];
    assert!(parse(&wrong_agent).is_err(), "agent ids start at 1");
    let two_payloads = [
        "--endpoint",
        "127.0.0.1:1",
        "--agent",
        "1",
        "--token-file",
        path,
        "E/S",
        "--data",
        "x",
        "--data-file",
        path,
    ];
    assert_eq!(
        parse(&two_payloads).unwrap_err().kind(),
        clap::error::ErrorKind::ArgumentConflict
    );
    let not_a_ca = [
        "--endpoint",
        "127.0.0.1:1",
        "--agent",
        "1",
        "--token-file",
        path,
        "--ca",
        path,
        "E/S",
    ];
    let error = parse(&not_a_ca).unwrap_err().to_string();
    assert!(
        error.contains("--ca") && error.contains("no certificate"),
        "{error}"
    );
}

#[test]
fn a_payload_file_is_read_up_to_32_mib() {
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().set_len(MAX_REQUEST_BYTES).unwrap();
    let path = file.path().to_str().unwrap();
    assert_eq!(
        read_payload(path).unwrap().0.len() as u64,
        MAX_REQUEST_BYTES
    );
    file.as_file().set_len(MAX_REQUEST_BYTES + 1).unwrap();
    assert!(read_payload(path)
        .unwrap_err()
        .ends_with("more than 33554432 bytes"));
}
