//! `sluice call`'s flags and the pure parsing behind them: the endpoint, the method, metadata,
//! the payload and the credentials. Every file is read here, at parse time, so a missing or
//! oversized one is a usage error (exit 2) that names its flag before anything is dialled.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgGroup, Args, ValueEnum};
use http::{HeaderName, HeaderValue};

/// Largest request payload read from `--data-file` (the node relays 32 MiB by default,
/// `tunnel.max_message_bytes`).
pub const MAX_REQUEST_BYTES: u64 = 32 * 1024 * 1024;
/// A secret or token file holds one key; the node reads its own JWT secret up to 64 KiB too.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// `sluice call`'s flags.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("credentials").required(true).args(["jwt_secret_file", "token_file"])))]
#[command(group(ArgGroup::new("payload").args(["data", "data_file"])))]
pub struct CallArgs {
    /// The node's external endpoint: `HOST:PORT`, `http://HOST:PORT` (cleartext HTTP/2) or
    /// `https://HOST:PORT` (TLS, with --ca).
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub endpoint: Endpoint,
    /// The agent whose backend answers (metadata `sluice-agent-id`).
    #[arg(long, visible_alias = "agent-id", value_name = "ID", value_parser = clap::value_parser!(i64).range(1..))]
    pub agent: i64,
    /// Sign a short-lived HS256 JWT with this secret (the node's `tunnel.jwt.secret_file`).
    #[arg(long, value_name = "FILE", value_parser = read_secret)]
    pub jwt_secret_file: Option<Secret>,
    /// Send the token in this file as it is (`authorization: Bearer <token>`), e.g. a JWT
    /// minted elsewhere.
    #[arg(long, value_name = "FILE", value_parser = read_secret)]
    pub token_file: Option<Secret>,
    /// The JWT's `iss` (the node's `tunnel.jwt.issuer`).
    #[arg(
        long,
        value_name = "ISSUER",
        default_value = "gitlab",
        conflicts_with = "token_file"
    )]
    pub issuer: String,
    /// The JWT's `aud` (the node's `tunnel.jwt.audience`).
    #[arg(
        long,
        value_name = "AUDIENCE",
        default_value = "gitlab-kas",
        conflicts_with = "token_file"
    )]
    pub audience: String,
    /// The JWT's lifetime (`exp - iat`); at most the node's `tunnel.jwt.max_lifetime`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration, conflicts_with = "token_file")]
    pub token_lifetime: Duration,
    /// Use TLS, trusting this CA (PEM) for the node's certificate.
    #[arg(long, value_name = "FILE", value_parser = read_ca)]
    pub ca: Option<Arc<rustls::ClientConfig>>,
    /// The name the node's certificate must carry (default: the endpoint's host).
    #[arg(long, value_name = "NAME", requires = "ca")]
    pub server_name: Option<String>,
    /// Extra metadata, `NAME: VALUE` (repeatable); a `-bin` name takes base64.
    #[arg(long, short = 'H', value_name = "NAME: VALUE", value_parser = parse_metadata)]
    pub header: Vec<(HeaderName, HeaderValue)>,
    /// The request message: these bytes (the serialized message; the demo echo backend takes
    /// any bytes). Default: an empty message.
    #[arg(long, short = 'd', value_name = "BYTES")]
    pub data: Option<String>,
    /// The request message read from FILE (`-`: standard input), up to 32 MiB.
    #[arg(long, value_name = "FILE", value_parser = read_payload)]
    pub data_file: Option<Payload>,
    /// The call's deadline, sent as `grpc-timeout` and enforced here (connecting included).
    #[arg(long, visible_alias = "deadline", value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How reply messages are printed: `text` (UTF-8, invalid bytes replaced, one line per
    /// message) or `raw` (the bytes exactly, nothing added).
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
    /// The method: `package.Service/Method` (a leading `/` and grpcurl's
    /// `package.Service.Method` are taken too).
    #[arg(value_name = "METHOD", value_parser = parse_method)]
    pub method: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Raw,
}

/// Where to call: the host and port as given (the `:authority`), and whether the URL asked for
/// TLS (`None`: no scheme, TLS when `--ca` is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: Option<bool>,
}

impl Endpoint {
    /// `host:port`, brackets kept around an IPv6 address.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A secret's bytes, never printed (`CallArgs` is `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The bytes of `--data-file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(pub Vec<u8>);

pub fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
        (Some(true), rest)
    } else if let Some(rest) = text.strip_prefix("http://") {
        (Some(false), rest)
    } else if text.contains("://") {
        return Err(format!("{text}: the scheme must be http:// or https://"));
    } else {
        (None, text)
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(format!("{text}: expected HOST:PORT, without a path"));
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("{text}: an IPv6 address needs its closing `]`"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| format!("{text}: expected [IPv6]:PORT"))?;
        (host, port)
    } else {
        rest.rsplit_once(':')
            .ok_or_else(|| format!("{text}: expected HOST:PORT (a port is required)"))?
    };
    if host.is_empty() || (host.contains(':') && !rest.starts_with('[')) {
        return Err(format!("{text}: expected HOST:PORT ([IPv6]:PORT)"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("{text}: the port must be 1..=65535"))?;
    Ok(Endpoint {
        host: host.to_string(),
        port,
        tls,
    })
}

/// The request path, `/package.Service/Method`.
pub fn parse_method(text: &str) -> Result<String, String> {
    let bare = text.strip_prefix('/').unwrap_or(text);
    let (service, method) = match bare.split_once('/') {
        Some(split) => split,
        // grpcurl's `package.Service.Method`.
        None => bare
            .rsplit_once('.')
            .ok_or_else(|| format!("{text}: expected package.Service/Method"))?,
    };
    let valid = |part: &str, dots: bool| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || (dots && c == '.'))
            && !part.starts_with('.')
            && !part.ends_with('.')
    };
    if !valid(service, true) || !valid(method, false) {
        return Err(format!(
            "{text}: expected package.Service/Method (letters, digits, `_`, dots between names)"
        ));
    }
    Ok(format!("/{service}/{method}"))
}

/// Metadata the flags or HTTP/2 set themselves: given with -H they would be sent twice or break
/// the call.
const RESERVED: [&str; 10] = [
    "authorization",
    "sluice-agent-id",
    "content-type",
    "te",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

pub fn parse_metadata(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text}: expected `NAME: VALUE`"))?;
    let name = HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| format!("{text}: {:?} is not a metadata name", name.trim()))?;
    if RESERVED.contains(&name.as_str()) || name.as_str().starts_with("grpc-") {
        return Err(format!(
            "{name} is set by sluice call itself (credentials: --jwt-secret-file or --token-file; agent: --agent; deadline: --timeout)"
        ));
    }
    let value = value.trim();
    if name.as_str().ends_with("-bin") {
        use base64::Engine;
        let decodes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(value));
        if decodes.is_err() {
            return Err(format!("{name}: a -bin value is base64, {value:?} is not"));
        }
    }
    // gRPC metadata values are printable ASCII (HTTP would also take obs-text bytes).
    let value = Some(value)
        .filter(|value| value.bytes().all(|byte| (0x20..=0x7e).contains(&byte)))
        .and_then(|value| HeaderValue::from_str(value).ok())
        .ok_or_else(|| format!("{name}: the value must be printable ASCII"))?;
    Ok((name, value))
}

/// At most `limit` bytes of `reader`, or an error saying the limit.
fn read_bounded(mut reader: impl Read, limit: u64, what: &str) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    reader
        .by_ref()
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("{what}: {error}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{what}: more than {limit} bytes"));
    }
    Ok(bytes)
}

fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    read_bounded(file, limit, &path.display().to_string())
}

/// A secret or token file: its bytes without trailing whitespace (as the node reads its own).
pub fn read_secret(file: &str) -> Result<Secret, String> {
    let mut bytes = read_file(Path::new(file), MAX_SECRET_FILE_BYTES)?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(format!("{file} is empty"));
    }
    Ok(Secret(bytes))
}

pub fn read_payload(file: &str) -> Result<Payload, String> {
    if file == "-" {
        read_bounded(std::io::stdin().lock(), MAX_REQUEST_BYTES, "standard input").map(Payload)
    } else {
        read_file(&PathBuf::from(file), MAX_REQUEST_BYTES).map(Payload)
    }
}

pub fn read_ca(file: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    sluice_grpc::tls::client_config(Some(Path::new(file)), None).map_err(|error| error.to_string())
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
