//! exec / attach over WebSocket, as kubectl 1.31+ and the Python client's `stream` speak it: the
//! Kubernetes channel protocol (`v5.channel.k8s.io` or `v4.channel.k8s.io`: each binary message
//! starts with its channel, 0 stdin, 1 stdout, 3 the status, 255 a stream's close in v5).
//!
//! What runs "in the pod" is simulated: `echo ARGS...` writes its arguments to stdout and
//! succeeds; any other command echoes stdin to stdout until stdin closes, then succeeds. That is
//! enough to prove a proxy carries the handshake and the messages both ways.

use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::body::ResponseBody;

/// The channel protocols served, most preferred first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// Whether the request asks for a WebSocket (RFC 6455 section 4.1).
pub(super) fn is_websocket(headers: &HeaderMap) -> bool {
    let says = |name: &str, word: &str| {
        headers.get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|text| {
                text.split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(word))
            })
        })
    };
    says("upgrade", "websocket") && headers.contains_key("sec-websocket-key")
}

/// The 101 for a WebSocket exec or attach, with the session run on the upgraded connection;
/// a 400 Status when the client offers no channel protocol the simulator speaks.
pub(super) fn accept(
    request: http::Request<Incoming>,
    command: Vec<String>,
) -> Response<ResponseBody> {
    let headers = request.headers();
    let offered: Vec<&str> = headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|text| text.split(','))
        .map(str::trim)
        .collect();
    let Some(protocol) = PROTOCOLS.iter().find(|known| offered.contains(known)) else {
        return super::status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no channel protocol offered that the simulator speaks (v5.channel.k8s.io, v4.channel.k8s.io)",
        );
    };
    let Some(accept) = headers
        .get("sec-websocket-key")
        .map(|key| derive_accept_key(key.as_bytes()))
    else {
        return super::status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no Sec-WebSocket-Key",
        );
    };
    let v5 = *protocol == PROTOCOLS[0];
    tokio::spawn(async move {
        if let Ok(upgraded) = hyper::upgrade::on(request).await {
            let socket =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            let _ = session(socket, &command, v5).await;
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", *protocol)
        .body(ResponseBody::full(bytes::Bytes::new()))
        .unwrap_or_else(|_| Response::new(ResponseBody::full(bytes::Bytes::new())))
}

async fn session<S>(
    mut socket: WebSocketStream<S>,
    command: &[String],
    v5: bool,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Some(("echo", words)) = command
        .split_first()
        .map(|(first, rest)| (first.as_str(), rest))
    {
        socket
            .send(channel(STDOUT, format!("{}\n", words.join(" ")).as_bytes()))
            .await?;
    } else {
        while let Some(message) = socket.next().await {
            let Message::Binary(data) = message? else {
                continue;
            };
            match data.split_first() {
                Some((&STDIN, input)) if !input.is_empty() => {
                    socket.send(channel(STDOUT, input)).await?;
                }
                // v5: stdin is closed; v4 has no close and ends with the connection.
                Some((&CLOSE, [STDIN])) if v5 => break,
                _ => {}
            }
        }
    }
    let success = br#"{"metadata":{},"status":"Success"}"#;
    socket.send(channel(STATUS, success)).await?;
    // A normal close (1000): client-go reports a close without a code as an error.
    let normal = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    socket.close(Some(normal)).await
}

fn channel(number: u8, data: &[u8]) -> Message {
    let mut message = Vec::with_capacity(1 + data.len());
    message.push(number);
    message.extend_from_slice(data);
    Message::Binary(message.into())
}
