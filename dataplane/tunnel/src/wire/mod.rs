//! Tunnel messages on the wire: protobuf (`sluice.tunnel.v1`) inside gRPC frames; the
//! conversion between HTTP/2 headers and tunnel metadata is in `metadata`.

mod metadata;
pub mod splice;

use bytes::{BufMut, Bytes, BytesMut};
use h2::RecvStream;
use sluice_grpc::transport::recv_data;
use sluice_grpc::{message_header, FrameDecoder, FrameError, MESSAGE_HEADER_LEN};
use sluice_proto::tunnel::v1::{
    connect_request, connect_response, ConnectRequest, ConnectResponse,
};

pub(crate) use metadata::is_hop_header;
pub use metadata::{
    check_metadata, header_frame_into, metadata_into_headers, request_info_frame_into,
    trailer_frame_into, HeaderMetadata, MetadataLimits, MetadataTooLarge,
};

/// Why a tunnel peer's bytes are not a valid tunnel message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad gRPC framing: {0}")]
    Frame(#[from] FrameError),
    #[error("undecodable tunnel message: {0}")]
    Decode(String),
    #[error("empty tunnel message")]
    Empty,
    #[error("the node's buffer for partly received messages ({limit} bytes, tunnel.max_buffered_bytes) is full")]
    OverBudget { limit: usize },
}

/// Bytes of partly received tunnel messages held across a whole node, against
/// `tunnel.max_buffered_bytes`: many agent streams each trickling a large message cannot add
/// up to more.
#[derive(Debug)]
pub struct BufferBudget {
    used: std::sync::atomic::AtomicUsize,
    limit: usize,
}

impl BufferBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            used: std::sync::atomic::AtomicUsize::new(0),
            limit,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, bytes: usize) -> usize {
        self.used
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed)
            + bytes
    }

    fn sub(&self, bytes: usize) {
        self.used
            .fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Encodes a whole message as one gRPC frame (control messages; small).
pub fn frame<M: prost::Message>(message: &M) -> Bytes {
    let mut out = BytesMut::new();
    frame_into(&mut out, message);
    out.freeze()
}

/// [`frame`], appended to `out` (several messages gathered into one DATA frame).
pub fn frame_into<M: prost::Message>(out: &mut BytesMut, message: &M) {
    let length = message.encoded_len();
    out.reserve(MESSAGE_HEADER_LEN + length);
    out.put_slice(&message_header(false, length));
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = message.encode(out);
}

/// Payloads up to this size are copied into one frame buffer; larger ones are sent as separate
/// slices (prefix, payload, suffix) so the payload is never copied.
pub const COPY_LIMIT: usize = 16 * 1024;

/// Frames a client message as `ConnectResponse { message: Message { data, compressed } }` (or,
/// with `request_side == true`, as `ConnectRequest { message: ... }`), returning the pieces to
/// send in order. The payload bytes are those the sender framed, not re-encoded.
pub fn data_frame(data: Bytes, compressed: bool, request_side: bool) -> Vec<Bytes> {
    if data.len() <= COPY_LIMIT {
        // Sized once: the head is at most 17 bytes and the tail 2.
        let mut frame = BytesMut::with_capacity(data.len() + 20);
        data_frame_into(&mut frame, &data, compressed, request_side);
        return vec![frame.freeze()];
    }
    let head = data_frame_head(data.len(), compressed, request_side);
    if compressed {
        vec![head.freeze(), data, Bytes::from_static(&[(2 << 3), 1])]
    } else {
        vec![head.freeze(), data]
    }
}

/// What [`data_frame`] puts before a payload of `size` bytes: with [`data_frame_tail`] after
/// the payload, a message can be forwarded as its bytes arrive instead of whole.
pub fn data_frame_head(size: usize, compressed: bool, request_side: bool) -> BytesMut {
    let mut head = BytesMut::new();
    data_frame_head_into(&mut head, size, compressed, request_side);
    head
}

/// [`data_frame_head`], appended to `out`.
pub fn data_frame_head_into(out: &mut BytesMut, size: usize, compressed: bool, request_side: bool) {
    // Message { data = 1 (bytes), compressed = 2 (bool) }
    let data_key_len = 1 + varint_len(size as u64);
    let compressed_len = if compressed { 2 } else { 0 };
    let inner_len = data_key_len + size + compressed_len;
    // Outer oneof field: ConnectResponse.message = 2, ConnectRequest.message = 3 (wire type 2).
    let outer_tag: u8 = if request_side {
        (3 << 3) | 2
    } else {
        (2 << 3) | 2
    };
    let body_len = 1 + varint_len(inner_len as u64) + inner_len;
    out.reserve(MESSAGE_HEADER_LEN + body_len - size - compressed_len);
    out.put_slice(&message_header(false, body_len));
    out.put_u8(outer_tag);
    put_varint(out, inner_len as u64);
    out.put_u8((1 << 3) | 2);
    put_varint(out, size as u64);
}

/// [`data_frame`] of a payload copied into `out` (the frame of a small message among others).
pub fn data_frame_into(out: &mut BytesMut, data: &[u8], compressed: bool, request_side: bool) {
    data_frame_head_into(out, data.len(), compressed, request_side);
    let tail = data_frame_tail(compressed);
    out.reserve(data.len() + tail.len());
    out.put_slice(data);
    out.put_slice(tail);
}

/// What [`data_frame`] puts after the payload.
pub fn data_frame_tail(compressed: bool) -> &'static [u8] {
    if compressed {
        &[(2 << 3), 1]
    } else {
        &[]
    }
}

fn varint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn put_varint(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Reads agent -> node messages from the tunnel's request body.
#[derive(Debug)]
pub struct TunnelReader {
    frames: FrameDecoder,
    /// The node-wide budget the buffered bytes are charged to, and how many are charged.
    budget: Option<(std::sync::Arc<BufferBudget>, usize)>,
}

impl TunnelReader {
    /// `max_message`: the largest client payload allowed, plus room for the wrapper.
    pub fn new(max_message: usize) -> Self {
        Self {
            frames: FrameDecoder::new(max_message.saturating_add(64)),
            budget: None,
        }
    }

    /// A reader whose buffered bytes count against `budget`; reading fails with
    /// [`WireError::OverBudget`] when the budget is exhausted.
    pub fn with_budget(max_message: usize, budget: std::sync::Arc<BufferBudget>) -> Self {
        Self {
            frames: FrameDecoder::new(max_message.saturating_add(64)),
            budget: Some((budget, 0)),
        }
    }

    /// Brings the budget in line with what is buffered now; an error if it is exceeded.
    fn charge(&mut self) -> Result<(), WireError> {
        let buffered = self.frames.buffered();
        let Some((budget, charged)) = self.budget.as_mut() else {
            return Ok(());
        };
        if buffered == *charged {
            return Ok(());
        }
        if buffered > *charged {
            let used = budget.add(buffered - *charged);
            *charged = buffered;
            if used > budget.limit {
                return Err(WireError::OverBudget {
                    limit: budget.limit,
                });
            }
        } else {
            budget.sub(*charged - buffered);
            *charged = buffered;
        }
        Ok(())
    }

    pub fn push(&mut self, chunk: Bytes) {
        self.frames.push(chunk);
    }

    pub fn next_request(&mut self) -> Result<Option<connect_request::Msg>, WireError> {
        decode_next::<ConnectRequest, _>(&mut self.frames, |message| message.msg)
    }

    pub fn next_response(&mut self) -> Result<Option<connect_response::Msg>, WireError> {
        decode_next::<ConnectResponse, _>(&mut self.frames, |message| message.msg)
    }

    pub fn finish(&self) -> Result<(), WireError> {
        Ok(self.frames.finish()?)
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// Reads the next agent -> node message from `recv`, pulling DATA frames as needed.
    /// `Ok(None)`: the peer ended the stream cleanly.
    pub async fn read_request(
        &mut self,
        recv: &mut RecvStream,
    ) -> Result<Option<connect_request::Msg>, ReadError> {
        self.read_with(recv, Self::next_request).await
    }

    /// Reads the next node -> agent message from `recv`.
    pub async fn read_response(
        &mut self,
        recv: &mut RecvStream,
    ) -> Result<Option<connect_response::Msg>, ReadError> {
        self.read_with(recv, Self::next_response).await
    }

    async fn read_with<T>(
        &mut self,
        recv: &mut RecvStream,
        next: fn(&mut Self) -> Result<Option<T>, WireError>,
    ) -> Result<Option<T>, ReadError> {
        loop {
            let message = next(self).map_err(ReadError::Protocol)?;
            self.charge().map_err(ReadError::Protocol)?;
            if let Some(message) = message {
                return Ok(Some(message));
            }
            match recv_data(recv).await {
                // Charged on the next turn, after decoding: a chunk that holds whole messages
                // leaves nothing buffered, so the node-wide budget (an atomic all cores share)
                // is not touched at all.
                Some(Ok(chunk)) => self.push(chunk),
                Some(Err(error)) if error.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                    return Err(ReadError::Refused(error.to_string()))
                }
                Some(Err(error)) => return Err(ReadError::Gone(error.to_string())),
                None => {
                    self.finish().map_err(ReadError::Protocol)?;
                    return Ok(None);
                }
            }
        }
    }
}

impl Drop for TunnelReader {
    fn drop(&mut self) {
        if let Some((budget, charged)) = &self.budget {
            budget.sub(*charged);
        }
    }
}

/// Why reading the tunnel stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The peer sent bytes that are not tunnel messages.
    #[error("{0}")]
    Protocol(WireError),
    /// The stream or connection failed (reset, connection lost).
    #[error("{0}")]
    Gone(String),
    /// The peer reset the stream with REFUSED_STREAM, which says it processed nothing sent on
    /// it (RFC 9113, section 8.7): an agent withdrawing an idle tunnel (stopping, or its idle
    /// timeout) that a call was sent down at the same moment. The call may go to another tunnel.
    #[error("{0}")]
    Refused(String),
}

fn decode_next<M: prost::Message + Default, T>(
    frames: &mut FrameDecoder,
    take: impl FnOnce(M) -> Option<T>,
) -> Result<Option<T>, WireError> {
    let Some(frame) = frames.next_message()? else {
        return Ok(None);
    };
    if frame.compressed {
        return Err(WireError::Decode(
            "compressed tunnel frames are not used".to_string(),
        ));
    }
    let message = M::decode(frame.data).map_err(|error| WireError::Decode(error.to_string()))?;
    take(message).map(Some).ok_or(WireError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_proto::tunnel::v1::Message;

    fn decode_response(pieces: &[Bytes]) -> connect_response::Msg {
        let mut reader = TunnelReader::new(1 << 20);
        for piece in pieces {
            reader.push(piece.clone());
        }
        let message = reader.next_response().unwrap().unwrap();
        reader.finish().unwrap();
        message
    }

    #[test]
    fn hand_built_data_frames_decode_as_prost_messages() {
        for size in [0usize, 1, 127, 128, 16 * 1024, 16 * 1024 + 1, 300_000] {
            for compressed in [false, true] {
                let data = Bytes::from(vec![0x5a; size]);
                let pieces = data_frame(data.clone(), compressed, false);
                assert_eq!(pieces.len() > 1, size > COPY_LIMIT, "size {size}");
                assert_eq!(
                    decode_response(&pieces),
                    connect_response::Msg::Message(Message {
                        data: data.clone(),
                        compressed
                    }),
                    "size {size} compressed {compressed}"
                );
                // And the same bytes prost would produce (prost omits an empty `data` field;
                // both forms decode alike).
                if size == 0 {
                    continue;
                }
                let joined: Vec<u8> = pieces
                    .iter()
                    .flat_map(|piece| piece.iter().copied())
                    .collect();
                let reference = frame(&ConnectResponse {
                    msg: Some(connect_response::Msg::Message(Message { data, compressed })),
                });
                assert_eq!(joined, reference.to_vec());
            }
        }
    }

    #[test]
    fn request_side_frames_decode_as_connect_requests() {
        let pieces = data_frame(Bytes::from_static(b"abc"), false, true);
        let mut reader = TunnelReader::new(1024);
        reader.push(pieces[0].clone());
        assert_eq!(
            reader.next_request().unwrap(),
            Some(connect_request::Msg::Message(Message {
                data: Bytes::from_static(b"abc"),
                compressed: false
            }))
        );
    }

    #[test]
    fn partly_received_messages_count_against_the_node_budget() {
        let budget = std::sync::Arc::new(BufferBudget::new(1000));
        let mut first = TunnelReader::with_budget(1 << 20, budget.clone());
        let mut second = TunnelReader::with_budget(1 << 20, budget.clone());
        // Each announces a 4 KiB message and sends 600 bytes of it.
        for reader in [&mut first, &mut second] {
            reader.push(Bytes::copy_from_slice(&message_header(false, 4096)));
            reader.push(Bytes::from(vec![0u8; 600]));
        }
        assert_eq!(first.charge(), Ok(()));
        assert_eq!(
            second.charge(),
            Err(WireError::OverBudget { limit: 1000 }),
            "1,210 bytes held node-wide"
        );
        drop(second);
        assert_eq!(budget.used(), 605);
        drop(first);
        assert_eq!(budget.used(), 0, "dropped readers give their bytes back");
    }

    #[test]
    fn garbage_and_empty_messages_are_errors() {
        let mut reader = TunnelReader::new(1024);
        reader.push(sluice_grpc::encode_message(false, &[0xff, 0xff, 0xff]));
        assert!(matches!(reader.next_request(), Err(WireError::Decode(_))));
        let mut reader = TunnelReader::new(1024);
        reader.push(sluice_grpc::encode_message(false, &[]));
        assert_eq!(reader.next_request(), Err(WireError::Empty));
        let mut reader = TunnelReader::new(16);
        reader.push(Bytes::copy_from_slice(&message_header(false, 1 << 20)));
        assert!(matches!(
            reader.next_request(),
            Err(WireError::Frame(FrameError::TooLarge { .. }))
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(body in prop::collection::vec(any::<u8>(), 0..512)) {
            let mut reader = TunnelReader::new(1024);
            reader.push(sluice_grpc::encode_message(false, &body));
            let _ = reader.next_request();
            let mut reader = TunnelReader::new(1024);
            reader.push(sluice_grpc::encode_message(false, &body));
            let _ = reader.next_response();
        }

    }
}
