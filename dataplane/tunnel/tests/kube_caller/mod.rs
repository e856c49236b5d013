//! The caller side of the Kubernetes API tests: `MakeRequest` on a node's private endpoint
//! with a node token, as the gateway's node does, read whole or as it streams.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::Request;
use sluice_grpc::transport::{connect, recv_data, ClientConnection, H2Settings};
use sluice_grpc::{encode_message, Code, FrameDecoder};
use sluice_kube_tunnel::{decode_response, ExchangeLimits, ResponseMessage, MAKE_REQUEST_PATH};

use crate::common::private_jwt;

/// What the caller learns: the gRPC status, and the HTTP answer when there was one.
#[derive(Debug, Default)]
pub struct Outcome {
    pub grpc_status: String,
    pub grpc_message: String,
    pub http_status: Option<u16>,
    pub body: Vec<u8>,
    pub ended: bool,
}

/// A call whose answer is read as it streams (a watch).
pub struct Streaming {
    body: RecvStream,
    frames: FrameDecoder,
    seen: Vec<u8>,
    _send: SendStream<Bytes>,
    _connection: ClientConnection,
}

impl Streaming {
    pub async fn open(private: SocketAddr, agent: i64, messages: Vec<Bytes>) -> Self {
        let (connection, response, send) = send_call(private, agent, messages, true).await;
        let response = monoio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(
            !response.headers().contains_key("grpc-status"),
            "{response:?}"
        );
        Self {
            body: response.into_body(),
            frames: FrameDecoder::new(4 * 1024 * 1024),
            seen: Vec::new(),
            _send: send,
            _connection: connection,
        }
    }

    /// Reads the answer until its body holds `needle` (the stream stays open).
    pub async fn read_until(&mut self, needle: &str) {
        let wait = async {
            while !String::from_utf8_lossy(&self.seen).contains(needle) {
                let chunk = recv_data(&mut self.body).await.expect("the watch goes on");
                self.frames.push(chunk.unwrap());
                while let Some(message) = self.frames.next_message().unwrap() {
                    let limits = ExchangeLimits::default();
                    if let ResponseMessage::Data(data) =
                        decode_response(&message.data, &limits).unwrap()
                    {
                        self.seen.extend_from_slice(&data);
                    }
                }
            }
        };
        monoio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("{needle} did not come through the watch in 10 s"));
    }
}

pub async fn send_call(
    private: SocketAddr,
    agent: i64,
    messages: Vec<Bytes>,
    end: bool,
) -> (ClientConnection, ResponseFuture, SendStream<Bytes>) {
    let connection = connect(private, None, &H2Settings::default())
        .await
        .unwrap();
    let mut ready = connection.ready().await.unwrap();
    let request = Request::post(format!("http://node{MAKE_REQUEST_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {}", private_jwt()))
        .header("sluice-agent-id", agent.to_string())
        .body(())
        .unwrap();
    let (response, mut send) = ready.send_request(request, false).unwrap();
    let mut out = BytesMut::new();
    for message in messages {
        out.extend_from_slice(&encode_message(false, &message));
    }
    send.send_data(out.freeze(), end).unwrap();
    (connection, response, send)
}

pub async fn make_request(private: SocketAddr, agent: i64, messages: Vec<Bytes>) -> Outcome {
    let (_connection, response, _send) = send_call(private, agent, messages, true).await;
    let response = monoio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer in time")
        .unwrap();
    let mut outcome = Outcome::default();
    let headers = response.headers().clone();
    let mut body = response.into_body();
    let trailers = if headers.contains_key("grpc-status") {
        headers
    } else {
        let mut frames = FrameDecoder::new(4 * 1024 * 1024);
        while let Some(chunk) = recv_data(&mut body).await {
            frames.push(chunk.unwrap());
            while let Some(message) = frames.next_message().unwrap() {
                match decode_response(&message.data, &ExchangeLimits::default()).unwrap() {
                    ResponseMessage::Head(head) => outcome.http_status = Some(head.status.as_u16()),
                    ResponseMessage::Data(data) => outcome.body.extend_from_slice(&data),
                    ResponseMessage::End => outcome.ended = true,
                    ResponseMessage::UpgradeData(_) => panic!("no upgrade was asked for"),
                }
            }
        }
        std::future::poll_fn(|cx| body.poll_trailers(cx))
            .await
            .unwrap()
            .unwrap_or_default()
    };
    let text = |name: &str| {
        trailers
            .get(name)
            .map(|value| value.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    outcome.grpc_status = text("grpc-status");
    outcome.grpc_message = text("grpc-message");
    outcome
}

pub fn code(code: Code) -> String {
    code.as_u32().to_string()
}

/// The next message of an answer being read as it streams.
pub async fn next_response(body: &mut RecvStream, frames: &mut FrameDecoder) -> ResponseMessage {
    let wait = async {
        loop {
            if let Some(message) = frames.next_message().unwrap() {
                return decode_response(&message.data, &ExchangeLimits::default()).unwrap();
            }
            let chunk = recv_data(body).await.expect("the answer goes on");
            frames.push(chunk.unwrap());
        }
    };
    monoio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the next message in 10 s")
}
