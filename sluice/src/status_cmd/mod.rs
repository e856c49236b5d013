//! `sluice status [--admin ADDR] [--ca FILE]`: a role's state in a few lines, read from its
//! admin endpoint (`/readyz` and `/metrics`): plain HTTP for a node, an agent or a VM agent;
//! HTTPS verified against `--ca` for the control plane, whose health paths need no credentials.
//! Exit 0 when it is ready, 2 when it answers but is not ready (main.rs makes that 3), 1 when it
//! cannot be read.

mod view;
#[cfg(test)]
mod view_props;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};

/// A `/metrics` answer larger than this is not an admin endpoint's.
const MAX_ANSWER_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("reading {path} from {address}: {source}")]
    Io {
        address: SocketAddr,
        path: &'static str,
        source: std::io::Error,
    },
    #[error("{path} from {address}: not an HTTP/1.1 answer (HTTPS, as the control plane's is, needs --ca)")]
    NotHttp {
        address: SocketAddr,
        path: &'static str,
    },
    #[error("{path} from {address}: the peer hung up on plain HTTP (HTTPS, as the control plane's is, needs --ca): {source}")]
    HungUp {
        address: SocketAddr,
        path: &'static str,
        source: std::io::Error,
    },
    #[error(
        "TLS with https://{address} failed (is --ca the CA that signed its certificate?): {source}"
    )]
    Tls {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// How `sluice status` talks to the admin endpoint.
#[derive(Debug, Clone)]
pub enum Transport {
    Http,
    /// HTTPS, the server's certificate verified against these roots for the `--admin` IP.
    Https(Arc<rustls::ClientConfig>),
}

/// The TLS client for `--ca FILE`, or why the file cannot be one (clap prints it and exits 2).
pub fn https_with_ca(file: &Path) -> Result<Transport, String> {
    let named = |error: &dyn std::fmt::Display| format!("{}: {error}", file.display());
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(file).map_err(|error| named(&error))? {
        roots
            .add(certificate.map_err(|error| named(&error))?)
            .map_err(|error| named(&error))?;
    }
    if roots.is_empty() {
        return Err(named(&"no CA certificate in the file"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| named(&error))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Transport::Https(Arc::new(config)))
}

pub fn run(admin: SocketAddr, transport: &Transport, timeout: Duration) -> ExitCode {
    let get = |path| get(admin, transport, path, timeout);
    let ready = match get("/readyz") {
        Ok((status, _)) => Some(status),
        Err(error) => {
            eprintln!("sluice status: {error}");
            return ExitCode::FAILURE;
        }
    };
    let metrics = match get("/metrics") {
        Ok((200, body)) => body,
        Ok((status, _)) => {
            eprintln!("sluice status: /metrics from {admin} answered {status}");
            return ExitCode::FAILURE;
        }
        Err(error) => {
            eprintln!("sluice status: {error}");
            return ExitCode::FAILURE;
        }
    };
    let scrape = match view::parse(&metrics) {
        Ok(scrape) => scrape,
        Err(error) => {
            eprintln!("sluice status: /metrics from {admin} is not Prometheus text: {error}");
            return ExitCode::FAILURE;
        }
    };
    for line in view::render(&scrape, ready) {
        println!("{line}");
    }
    if ready == Some(200) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// One GET with `Connection: close`: (status, body), the body at most `MAX_ANSWER_BYTES`.
fn get(
    address: SocketAddr,
    transport: &Transport,
    path: &'static str,
    timeout: Duration,
) -> Result<(u16, String), FetchError> {
    let io = |source| FetchError::Io {
        address,
        path,
        source,
    };
    let mut tcp = TcpStream::connect_timeout(&address, timeout)
        .map_err(|source| FetchError::Connect { address, source })?;
    tcp.set_read_timeout(Some(timeout)).map_err(io)?;
    tcp.set_write_timeout(Some(timeout)).map_err(io)?;
    match transport {
        Transport::Http => exchange(tcp, address, path).map_err(|error| match error {
            // A TLS listener drops a plain request at once, while it is being written or read.
            FetchError::Io { source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                FetchError::HungUp {
                    address,
                    path,
                    source,
                }
            }
            other => other,
        }),
        Transport::Https(config) => {
            let tls = |source| FetchError::Tls { address, source };
            let name = ServerName::IpAddress(address.ip().into());
            let mut client = rustls::ClientConnection::new(Arc::clone(config), name)
                .map_err(|error| tls(std::io::Error::other(error)))?;
            // Done before the request so that a certificate the CA did not sign is reported as
            // such, not as an error reading the path.
            while client.is_handshaking() {
                client.complete_io(&mut tcp).map_err(tls)?;
            }
            exchange(rustls::StreamOwned::new(client, tcp), address, path)
        }
    }
}

fn exchange(
    mut stream: impl Read + Write,
    address: SocketAddr,
    path: &'static str,
) -> Result<(u16, String), FetchError> {
    let io = |source| FetchError::Io {
        address,
        path,
        source,
    };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut answer = Vec::new();
    match stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer) {
        Ok(_) => {}
        // A TLS peer may close after its whole answer without a close_notify: the answer is
        // still checked to be complete HTTP below.
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(error) => return Err(io(error)),
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = response.parse(&answer) else {
        return Err(FetchError::NotHttp { address, path });
    };
    let status = response.code.ok_or(FetchError::NotHttp { address, path })?;
    let body = String::from_utf8_lossy(&answer[head..]).into_owned();
    Ok((status, body))
}
