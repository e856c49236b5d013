//! `sluice call`: one gRPC call to an agent's backend through a node's external endpoint, as a
//! client of the tunnel does it (a short-lived HS256 JWT, `sluice-agent-id`), with nothing but
//! this binary: the reply on stdout, a failed call's gRPC status named on stderr and in the exit
//! code (64 + the code), so `sluice up`'s banner works on a machine without Python.

mod args;
mod client;

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use rustls::pki_types::ServerName;
use sluice_grpc::{Code, Status};

pub use args::CallArgs;
use args::{Output, Secret};
use client::{Call, CallError};

/// Exit code of a call that ended with gRPC status `code`: above the codes every subcommand
/// shares (0-3, docs/CONFIG.md "Exit codes"), one per status so a script can tell UNAVAILABLE
/// (78) from UNAUTHENTICATED (80).
pub fn exit_code(code: Code) -> u8 {
    64 + code.as_u32() as u8
}

/// What is wrong with the flags together (each alone was checked by clap): exit 2.
#[derive(Debug, thiserror::Error)]
enum UsageError {
    #[error("https:// needs --ca FILE (sluice call trusts only the CA it is given)")]
    HttpsWithoutCa,
    #[error("--ca asks for TLS, but the endpoint says http://")]
    CaWithHttp,
    #[error("--server-name {0:?} is not a DNS name or IP address")]
    ServerName(String),
    #[error("{0}: the token must be printable ASCII without spaces")]
    Token(&'static str),
    #[error("cannot sign the JWT: {0}")]
    Sign(jsonwebtoken::errors::Error),
}

pub fn run(args: CallArgs) -> ExitCode {
    let prepared = match prepare(&args) {
        Ok(prepared) => prepared,
        Err(error) => {
            eprintln!("sluice call: {error}");
            return ExitCode::from(2);
        }
    };
    let call = match resolve(&args, prepared) {
        Ok(call) => call,
        Err(status) => return failed(&status),
    };
    let runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build();
    let mut runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice call: cannot start the I/O runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let output = args.output;
    let mut sink = |message: &[u8]| match output {
        Output::Raw => stdout.write_all(message),
        Output::Text => writeln!(stdout, "{}", String::from_utf8_lossy(message)),
    };
    let outcome = runtime.block_on(client::call(call, &mut sink));
    let flushed = std::io::stdout().lock().flush();
    match outcome.and(flushed.map_err(CallError::Output)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => match error.code() {
            Some(code) => failed(&Status::new(code, error.to_string())),
            None => {
                eprintln!("sluice call: {error}");
                ExitCode::FAILURE
            }
        },
    }
}

fn failed(status: &Status) -> ExitCode {
    let message = if status.message.is_empty() {
        "(no message)"
    } else {
        status.message.as_str()
    };
    eprintln!(
        "sluice call: {} (gRPC status {}): {message}",
        status.code,
        status.code.as_u32()
    );
    ExitCode::from(exit_code(status.code))
}

/// The call's parts that need no network: TLS, metadata, the message.
struct Prepared {
    tls: Option<(std::sync::Arc<rustls::ClientConfig>, ServerName<'static>)>,
    headers: HeaderMap,
    message: Bytes,
}

fn prepare(args: &CallArgs) -> Result<Prepared, UsageError> {
    let tls = match (args.endpoint.tls, &args.ca) {
        (Some(true), None) => return Err(UsageError::HttpsWithoutCa),
        (Some(false), Some(_)) => return Err(UsageError::CaWithHttp),
        (_, None) => None,
        (_, Some(config)) => {
            let name = args
                .server_name
                .clone()
                .unwrap_or_else(|| args.endpoint.host.clone());
            let server_name =
                ServerName::try_from(name.clone()).map_err(|_| UsageError::ServerName(name))?;
            Some((config.clone(), server_name))
        }
    };
    let token = match (&args.jwt_secret_file, &args.token_file) {
        (Some(secret), _) => sign_jwt(
            secret,
            &args.issuer,
            &args.audience,
            now(),
            args.token_lifetime,
        )
        .map_err(UsageError::Sign)?,
        (None, Some(Secret(token))) => String::from_utf8(token.clone())
            .ok()
            .filter(|token| token.bytes().all(|byte| byte.is_ascii_graphic()))
            .ok_or(UsageError::Token("--token-file"))?,
        // clap requires one of the two; were that lost, the node's refusal (UNAUTHENTICATED,
        // missing authorization) would say so.
        (None, None) => String::new(),
    };
    let headers = metadata(args, &token).ok_or(UsageError::Token("--token-file"))?;
    let message = match (&args.data, &args.data_file) {
        (Some(text), _) => Bytes::from(text.clone().into_bytes()),
        (None, Some(payload)) => Bytes::from(payload.0.clone()),
        (None, None) => Bytes::new(),
    };
    Ok(Prepared {
        tls,
        headers,
        message,
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// The HS256 JWT the external endpoint checks: `iss`, `aud`, `iat` = `now`, `exp` = `now` +
/// `lifetime` (the node refuses lifetimes above its `tunnel.jwt.max_lifetime`).
pub fn sign_jwt(
    secret: &Secret,
    issuer: &str,
    audience: &str,
    now: u64,
    lifetime: Duration,
) -> Result<String, jsonwebtoken::errors::Error> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        iss: &'a str,
        aud: &'a str,
        iat: u64,
        exp: u64,
    }
    let claims = Claims {
        iss: issuer,
        aud: audience,
        iat: now,
        exp: now.saturating_add(lifetime.as_secs()),
    };
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&secret.0),
    )
}

/// The request's headers: gRPC's, the credentials, the agent, then `-H` metadata. `None` if the
/// token cannot be a header value.
fn metadata(args: &CallArgs, token: &str) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    headers.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("sluice-call/", env!("CARGO_PKG_VERSION"))),
    );
    headers.insert(
        "grpc-timeout",
        HeaderValue::from_str(&sluice_grpc::encode_timeout(args.timeout)).ok()?,
    );
    if !token.is_empty() {
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).ok()?,
        );
    }
    headers.insert(
        sluice_tunnel::protocol::AGENT_ID_HEADER,
        HeaderValue::from(args.agent),
    );
    for (name, value) in &args.header {
        headers.append(name.clone(), value.clone());
    }
    Some(headers)
}

/// The endpoint's address (a host name resolved now, its first address) and the request URI.
fn resolve(args: &CallArgs, prepared: Prepared) -> Result<Call, Status> {
    let authority = args.endpoint.authority();
    let address: SocketAddr = (args.endpoint.host.as_str(), args.endpoint.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .ok_or_else(|| {
            Status::new(
                Code::Unavailable,
                format!("cannot resolve {}", args.endpoint.host),
            )
        })?;
    let scheme = if prepared.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = format!("{scheme}://{authority}{}", args.method)
        .parse()
        .map_err(|_| Status::new(Code::InvalidArgument, format!("{authority}{}", args.method)))?;
    Ok(Call {
        address,
        tls: prepared.tls,
        uri,
        headers: prepared.headers,
        message: prepared.message,
        timeout: args.timeout,
    })
}

#[cfg(test)]
mod tests;
