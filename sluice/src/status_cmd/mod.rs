//! `sluice status [--admin ADDR]`: a node's (or agent's, or VM agent's) state in a few lines,
//! read from its admin endpoint (`/readyz` and `/metrics`, plain HTTP on loopback by default).
//! Exit 0 when it is ready, 2 when it answers but is not ready, 1 when it cannot be read.

mod view;
#[cfg(test)]
mod view_props;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

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
    #[error("{path} from {address}: not an HTTP/1.1 answer")]
    NotHttp {
        address: SocketAddr,
        path: &'static str,
    },
}

pub fn run(admin: SocketAddr, timeout: Duration) -> ExitCode {
    let ready = match get(admin, "/readyz", timeout) {
        Ok((status, _)) => Some(status),
        Err(error) => {
            eprintln!("sluice status: {error}");
            return ExitCode::FAILURE;
        }
    };
    let metrics = match get(admin, "/metrics", timeout) {
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
    path: &'static str,
    timeout: Duration,
) -> Result<(u16, String), FetchError> {
    let io = |source| FetchError::Io {
        address,
        path,
        source,
    };
    let mut stream = TcpStream::connect_timeout(&address, timeout)
        .map_err(|source| FetchError::Connect { address, source })?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER_BYTES)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = response.parse(&answer) else {
        return Err(FetchError::NotHttp { address, path });
    };
    let status = response.code.ok_or(FetchError::NotHttp { address, path })?;
    let body = String::from_utf8_lossy(&answer[head..]).into_owned();
    Ok((status, body))
}
