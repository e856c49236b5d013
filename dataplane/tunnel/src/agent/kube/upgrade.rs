//! Upgrades (exec, attach, port-forward): HTTP/2 to the apiserver cannot switch protocols, so
//! each upgrade gets its own HTTP/1.1 connection (TLS with the configured CA, ALPN http/1.1) to
//! the configured apiserver. After its 101 the bytes flow both ways as UpgradeData until either
//! side closes; any other answer is relayed as a plain response.

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use rustls::pki_types::ServerName;
use sluice_grpc::transport::{compat, send_data};
use sluice_grpc::Code;
use sluice_kube_tunnel::{
    encode_response_data, encode_response_end, encode_response_head, encode_response_upgrade_data,
    ExchangeLimits, RequestMessage,
};
use sluice_proto::tunnel::v1::{connect_request, ConnectRequest, Header, Trailer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::exchange::{invalid, next, pieces, Next};
use super::KubeApi;
use crate::error::{ErrorKind, TunnelError};
use crate::wire::{data_frame, frame_into, TunnelReader};

/// Most bytes of the apiserver's response head.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most header fields in it.
const MAX_RESPONSE_FIELDS: usize = 128;
/// Bytes read from the apiserver at once.
const READ_CHUNK: usize = 16 * 1024;

/// The request as HTTP/1.1 bytes: the configured authority as Host, the head's own headers
/// (already filtered and with the impersonation set) after it.
pub(super) fn request_head(request: &Request<()>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    out.extend_from_slice(format!("{} {target} HTTP/1.1\r\n", request.method()).as_bytes());
    if let Some(authority) = request.uri().authority() {
        out.extend_from_slice(format!("host: {authority}\r\n").as_bytes());
    }
    for (name, value) in request.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The apiserver's response head, when `buffer` holds all of it: status, headers, and how many
/// bytes of `buffer` it took.
pub(super) fn response_head(
    buffer: &[u8],
) -> Result<Option<(StatusCode, HeaderMap, usize)>, TunnelError> {
    let broken =
        |why: String| TunnelError::new(ErrorKind::BackendUnavailable, format!("apiserver: {why}"));
    let mut fields = [httparse::EMPTY_HEADER; MAX_RESPONSE_FIELDS];
    let mut response = httparse::Response::new(&mut fields);
    let length = match response.parse(buffer) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buffer.len() >= MAX_RESPONSE_HEAD => {
            return Err(broken(format!(
                "a response head over {MAX_RESPONSE_HEAD} bytes"
            )))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(broken(format!("malformed response head: {error}"))),
    };
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| broken("no status".into()))?;
    let mut headers = HeaderMap::new();
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes());
        let value = HeaderValue::from_bytes(field.value);
        if let (Ok(name), Ok(value)) = (name, value) {
            headers.append(name, value);
        }
    }
    Ok(Some((status, headers, length)))
}

/// Serves an upgrade request: dial, send the head, relay the answer (and after a 101 the
/// upgraded stream) until both sides are done.
pub(super) async fn relay_upgrade(
    kube: &KubeApi,
    request: Request<()>,
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    node_send: &mut SendStream<Bytes>,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    let unreachable = |why: String| {
        kube.setup.metrics.apiserver_error();
        TunnelError::new(ErrorKind::BackendUnavailable, why)
    };
    let mut stream = dial(kube).await.map_err(unreachable)?;
    // The connection gathers writes until a flush.
    let sent = async {
        stream.write_all(&request_head(&request)).await?;
        stream.flush().await
    };
    sent.await
        .map_err(|error| unreachable(format!("apiserver: {error}")))?;
    let (status, headers, rest) = read_head(&mut stream)
        .await
        .inspect_err(|_| kube.setup.metrics.apiserver_error())?;
    let mut out = BytesMut::new();
    frame_into(
        &mut out,
        &ConnectRequest {
            msg: Some(connect_request::Msg::Header(Header::default())),
        },
    );
    message_into(&mut out, encode_response_head(status, &headers));
    send_data(node_send, out.freeze(), false)
        .await
        .map_err(node_gone)?;
    let upgraded = status == StatusCode::SWITCHING_PROTOCOLS;
    let limits = ExchangeLimits::default();
    let (mut api_read, mut api_write) = tokio::io::split(stream);
    let up = pump_up(
        reader,
        node_recv,
        &mut api_write,
        &limits,
        upgraded,
        close_send_seen,
    );
    // A plain answer on a connection kept open ends after its Content-Length.
    let length = (!upgraded)
        .then(|| headers.get(http::header::CONTENT_LENGTH))
        .flatten()
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let down = pump_down(&mut api_read, rest, node_send, (upgraded, length), &limits);
    let outcome = monoio::select! {
        sent = up => sent,
        received = down => received,
    };
    if outcome.is_ok() {
        super::exchange::await_close_send(reader, node_recv, close_send_seen).await;
    }
    outcome
}

type TlsStream = tokio_rustls::client::TlsStream<sluice_grpc::transport::CompatStream>;

async fn dial(kube: &KubeApi) -> Result<TlsStream, String> {
    let config = &kube.setup.config;
    let address = super::super::resolve(&sluice_config::Endpoint {
        url: config.url.clone(),
        tls: true,
        host: config.host.clone(),
        port: config.port,
    })
    .map_err(|error| format!("{}: {error}", config.url))?;
    let name = ServerName::try_from(config.host.clone()).map_err(|error| error.to_string())?;
    let tcp = monoio::net::TcpStream::connect(address)
        .await
        .map_err(|error| format!("{}: {error}", config.url))?;
    let _ = tcp.set_nodelay(true);
    let io = compat(tcp).map_err(|error| error.to_string())?;
    tokio_rustls::TlsConnector::from(kube.setup.tls_http1.clone())
        .connect(name, io)
        .await
        .map_err(|error| format!("{}: TLS: {error}", config.url))
}

async fn read_head(stream: &mut TlsStream) -> Result<(StatusCode, HeaderMap, Bytes), TunnelError> {
    let mut buffer = BytesMut::with_capacity(READ_CHUNK);
    loop {
        if let Some((status, headers, length)) = response_head(&buffer)? {
            let rest = buffer.split_off(length).freeze();
            return Ok((status, headers, rest));
        }
        let read = stream.read_buf(&mut buffer).await.map_err(|error| {
            TunnelError::new(ErrorKind::BackendUnavailable, format!("apiserver: {error}"))
        })?;
        if read == 0 {
            return Err(TunnelError::new(
                ErrorKind::BackendUnavailable,
                "apiserver: the connection closed before a response head",
            ));
        }
    }
}

/// What the request side of an upgrade may send next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum UpSide {
    /// After the head: the (empty) body's End, or, once upgraded, the stream's bytes.
    Body,
    /// The body ended; once upgraded the stream's bytes, then End.
    BodyEnded,
    /// Closed: the apiserver's side of the stream was shut down.
    Closed,
}

/// What to do with the next request message of an upgrade. The gateway may send the body's
/// End before or after it sees the 101, so the first End after the head always ends the body
/// and only a later one closes the stream (a CloseSend closes it too).
pub(super) fn up_step(
    side: UpSide,
    message: &RequestMessage,
    upgraded: bool,
) -> Result<(UpSide, bool), TunnelError> {
    match (side, message) {
        (UpSide::Body, RequestMessage::End) => Ok((UpSide::BodyEnded, false)),
        (UpSide::BodyEnded, RequestMessage::End) if upgraded => Ok((UpSide::Closed, true)),
        (UpSide::Body | UpSide::BodyEnded, RequestMessage::UpgradeData(_)) if upgraded => {
            Ok((side, false))
        }
        (_, RequestMessage::Data(_)) => Err(invalid("an upgrade request has no body")),
        _ => Err(invalid("a message out of order for an upgrade")),
    }
}

/// Node -> apiserver: the upgraded stream's bytes, until the stream's End (or CloseSend).
async fn pump_up<W: AsyncWrite + Unpin>(
    reader: &mut TunnelReader,
    node_recv: &mut RecvStream,
    api_write: &mut W,
    limits: &ExchangeLimits,
    upgraded: bool,
    close_send_seen: &mut bool,
) -> Result<(), TunnelError> {
    let failed = |error: std::io::Error| {
        TunnelError::new(ErrorKind::BackendUnavailable, format!("apiserver: {error}"))
    };
    let mut side = UpSide::Body;
    loop {
        let message = match next(reader, node_recv, limits).await? {
            Next::Message(message) => message,
            Next::CloseSend => break,
        };
        let (next_side, close) = up_step(side, &message, upgraded)?;
        side = next_side;
        if let RequestMessage::UpgradeData(data) = message {
            api_write.write_all(&data).await.map_err(failed)?;
            api_write.flush().await.map_err(failed)?;
        }
        if close {
            api_write.shutdown().await.map_err(failed)?;
        }
    }
    if upgraded && side != UpSide::Closed {
        api_write.shutdown().await.map_err(failed)?;
    }
    *close_send_seen = true;
    // The answer may still be flowing: wait for it (a reset of the tunnel ends both).
    std::future::pending().await
}

/// Apiserver -> node: after a 101 every byte as UpgradeData; otherwise the body (to the end of
/// the connection, which an HTTP/1.1 answer to an upgrade request closes) as Data. Then End and
/// the OK Trailer.
async fn pump_down<R: AsyncRead + Unpin>(
    api_read: &mut R,
    first: Bytes,
    node_send: &mut SendStream<Bytes>,
    (upgraded, length): (bool, Option<u64>),
    limits: &ExchangeLimits,
) -> Result<(), TunnelError> {
    let mut chunk = first;
    let mut buffer = BytesMut::with_capacity(READ_CHUNK);
    let mut remaining = length.unwrap_or(u64::MAX);
    loop {
        if chunk.len() as u64 > remaining {
            chunk.truncate(remaining as usize);
        }
        remaining -= chunk.len() as u64;
        for piece in pieces(chunk, limits.max_data_bytes) {
            let message = if upgraded {
                encode_response_upgrade_data(piece)
            } else {
                encode_response_data(piece)
            };
            for part in data_frame(message, false, true) {
                send_data(node_send, part, false).await.map_err(node_gone)?;
            }
        }
        if remaining == 0 {
            break;
        }
        buffer.reserve(READ_CHUNK);
        let read = api_read.read_buf(&mut buffer).await.unwrap_or(0);
        if read == 0 {
            break;
        }
        chunk = buffer.split().freeze();
    }
    let mut out = BytesMut::new();
    message_into(&mut out, encode_response_end());
    frame_into(
        &mut out,
        &ConnectRequest {
            msg: Some(connect_request::Msg::Trailer(Trailer {
                grpc_status: Code::Ok.as_u32(),
                ..Trailer::default()
            })),
        },
    );
    send_data(node_send, out.freeze(), false)
        .await
        .map_err(node_gone)
}

fn message_into(out: &mut BytesMut, message: Bytes) {
    for part in data_frame(message, false, true) {
        out.extend_from_slice(&part);
    }
}

fn node_gone(error: h2::Error) -> TunnelError {
    TunnelError::new(ErrorKind::NodeGone, error.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_head_names_the_configured_authority_and_the_filtered_headers() {
        let mut request = Request::new(());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = "https://api.internal:6443/api/v1/namespaces/a/pods/p/exec?command=sh"
            .parse()
            .unwrap();
        request
            .headers_mut()
            .insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        let head = String::from_utf8(request_head(&request)).unwrap();
        assert_eq!(
            head,
            "POST /api/v1/namespaces/a/pods/p/exec?command=sh HTTP/1.1\r\nhost: api.internal:6443\r\nupgrade: SPDY/3.1\r\n\r\n"
        );
    }

    #[test]
    fn the_first_end_ends_the_body_and_the_next_closes_the_stream() {
        let end = RequestMessage::End;
        let data = RequestMessage::UpgradeData(Bytes::from_static(b"x"));
        let body = RequestMessage::Data(Bytes::from_static(b"x"));
        // End before the bytes (sent before the 101 was seen), then the bytes, then End.
        let (side, close) = up_step(UpSide::Body, &end, true).unwrap();
        assert_eq!((side, close), (UpSide::BodyEnded, false));
        assert_eq!(
            up_step(side, &data, true).unwrap(),
            (UpSide::BodyEnded, false)
        );
        assert_eq!(up_step(side, &end, true).unwrap(), (UpSide::Closed, true));
        // Bytes straight after the head are fine once upgraded, never before.
        assert_eq!(
            up_step(UpSide::Body, &data, true).unwrap(),
            (UpSide::Body, false)
        );
        assert!(up_step(UpSide::Body, &data, false).is_err());
        assert!(up_step(UpSide::Body, &body, true).is_err());
        assert!(up_step(UpSide::Closed, &data, true).is_err());
        assert!(up_step(UpSide::BodyEnded, &end, false).is_err());
    }

    #[test]
    fn a_response_head_is_parsed_once_whole_and_bounded() {
        let whole = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\nConnection: Upgrade\r\n\r\nabc";
        assert!(response_head(&whole[..20]).unwrap().is_none());
        let (status, headers, length) = response_head(whole).unwrap().unwrap();
        assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(headers["upgrade"], "SPDY/3.1");
        assert_eq!(&whole[length..], b"abc");
        let endless = vec![b'a'; MAX_RESPONSE_HEAD];
        assert!(response_head(&endless).is_err());
        assert!(response_head(b"garbage\r\n\r\n").is_err());
    }
}
