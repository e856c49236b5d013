//! gRPC length-prefixed message framing: 1 byte compressed flag, 4 bytes big-endian length, body.

use std::collections::VecDeque;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::Code;

/// Size of the prefix before every message.
pub const MESSAGE_HEADER_LEN: usize = 5;

/// One message as it was framed: the body bytes and the compressed flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcMessage {
    pub compressed: bool,
    pub data: Bytes,
}

/// Why a byte stream is not valid gRPC framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("invalid compressed flag {0} (must be 0 or 1)")]
    BadFlag(u8),
    #[error("stream ended inside a message ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
}

impl FrameError {
    /// The status a peer gets for this error.
    pub fn code(&self) -> Code {
        match self {
            FrameError::TooLarge { .. } => Code::ResourceExhausted,
            FrameError::BadFlag(_) | FrameError::Truncated { .. } => Code::Internal,
        }
    }
}

/// Incremental decoder over the DATA frames of one gRPC stream.
///
/// A message that lies inside one received chunk is returned as a slice of that chunk (no copy);
/// only messages split across chunks are assembled into a new buffer.
#[derive(Debug)]
pub struct FrameDecoder {
    limit: usize,
    chunks: VecDeque<Bytes>,
    buffered: usize,
}

impl FrameDecoder {
    /// `limit`: the largest message body accepted, in bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            chunks: VecDeque::new(),
            buffered: 0,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.buffered += chunk.len();
            self.chunks.push_back(chunk);
        }
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// The next complete message, `Ok(None)` if more bytes are needed. An oversize message is
    /// refused as soon as its header arrives, before its body is buffered.
    pub fn next_message(&mut self) -> Result<Option<GrpcMessage>, FrameError> {
        let Some(header) = self.peek_header() else {
            return Ok(None);
        };
        let compressed = match header[0] {
            0 => false,
            1 => true,
            flag => return Err(FrameError::BadFlag(flag)),
        };
        let size = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if size > self.limit {
            return Err(FrameError::TooLarge {
                size,
                limit: self.limit,
            });
        }
        if self.buffered < MESSAGE_HEADER_LEN + size {
            return Ok(None);
        }
        self.advance(MESSAGE_HEADER_LEN);
        let data = self.take(size);
        Ok(Some(GrpcMessage { compressed, data }))
    }

    /// Call at end of stream: an error if a partial message remains.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buffered == 0 {
            Ok(())
        } else {
            Err(FrameError::Truncated {
                buffered: self.buffered,
            })
        }
    }

    fn peek_header(&self) -> Option<[u8; MESSAGE_HEADER_LEN]> {
        if self.buffered < MESSAGE_HEADER_LEN {
            return None;
        }
        let mut header = [0u8; MESSAGE_HEADER_LEN];
        let mut filled = 0;
        for chunk in &self.chunks {
            let wanted = (MESSAGE_HEADER_LEN - filled).min(chunk.len());
            header[filled..filled + wanted].copy_from_slice(&chunk[..wanted]);
            filled += wanted;
            if filled == MESSAGE_HEADER_LEN {
                break;
            }
        }
        Some(header)
    }

    fn advance(&mut self, mut count: usize) {
        self.buffered -= count;
        while count > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if front.len() > count {
                front.advance(count);
                return;
            }
            count -= front.len();
            self.chunks.pop_front();
        }
    }

    fn take(&mut self, size: usize) -> Bytes {
        self.buffered -= size;
        match self.chunks.front_mut() {
            Some(front) if front.len() >= size => {
                let data = front.split_to(size);
                if front.is_empty() {
                    self.chunks.pop_front();
                }
                data
            }
            _ => {
                let mut assembled = BytesMut::with_capacity(size);
                while assembled.len() < size {
                    let Some(mut front) = self.chunks.pop_front() else {
                        break;
                    };
                    let wanted = size - assembled.len();
                    if front.len() > wanted {
                        assembled.put_slice(&front[..wanted]);
                        front.advance(wanted);
                        self.chunks.push_front(front);
                    } else {
                        assembled.put_slice(&front);
                    }
                }
                assembled.freeze()
            }
        }
    }
}

/// The 5-byte prefix of a message of `len` bytes. Returned separately so a forwarder can send the
/// prefix and an existing body buffer as two writes, without copying the body.
pub fn message_header(compressed: bool, len: usize) -> [u8; MESSAGE_HEADER_LEN] {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    [u8::from(compressed), len[0], len[1], len[2], len[3]]
}

/// Messages up to this size are copied behind their prefix into one buffer, so they travel as
/// one DATA frame instead of two: a tiny frame costs more than the copy, and h2 peers limit how
/// many small frames they buffer per connection.
pub const COALESCE_LIMIT: usize = 16 * 1024;

/// A message as the buffers to send in order: prefix and body together when the body is small,
/// else the prefix and the body's own buffer (not copied).
pub fn message_pieces(compressed: bool, body: Bytes) -> (Bytes, Option<Bytes>) {
    if body.len() <= COALESCE_LIMIT {
        (encode_message(compressed, &body), None)
    } else {
        (
            Bytes::copy_from_slice(&message_header(compressed, body.len())),
            Some(body),
        )
    }
}

/// A whole framed message (prefix and body) in one buffer.
pub fn encode_message(compressed: bool, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(MESSAGE_HEADER_LEN + body.len());
    out.put_slice(&message_header(compressed, body.len()));
    out.put_slice(body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(decoder: &mut FrameDecoder) -> Result<Vec<GrpcMessage>, FrameError> {
        let mut messages = Vec::new();
        while let Some(message) = decoder.next_message()? {
            messages.push(message);
        }
        Ok(messages)
    }

    #[test]
    fn decodes_messages_within_and_across_chunks() {
        let mut stream = Vec::new();
        stream.extend_from_slice(&encode_message(false, b"hello"));
        stream.extend_from_slice(&encode_message(true, b""));
        stream.extend_from_slice(&encode_message(false, &[9u8; 1000]));
        let mut decoder = FrameDecoder::new(4096);
        decoder.push(Bytes::copy_from_slice(&stream[..3]));
        assert_eq!(decoder.next_message(), Ok(None));
        decoder.push(Bytes::copy_from_slice(&stream[3..20]));
        decoder.push(Bytes::copy_from_slice(&stream[20..]));
        let messages = decode_all(&mut decoder).unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0].data, Bytes::from_static(b"hello"));
        assert!(!messages[0].compressed);
        assert!(messages[1].compressed && messages[1].data.is_empty());
        assert_eq!(messages[2].data.len(), 1000);
        assert_eq!(decoder.buffered(), 0);
        assert_eq!(decoder.finish(), Ok(()));
    }

    #[test]
    fn a_message_inside_one_chunk_is_not_copied() {
        let chunk = encode_message(false, b"zero-copy body");
        let body_start = chunk.as_ptr() as usize + MESSAGE_HEADER_LEN;
        let mut decoder = FrameDecoder::new(1024);
        decoder.push(chunk);
        let message = decoder.next_message().unwrap().unwrap();
        assert_eq!(message.data.as_ptr() as usize, body_start);
    }

    #[test]
    fn oversize_is_refused_from_the_header_alone() {
        let mut decoder = FrameDecoder::new(10);
        decoder.push(Bytes::copy_from_slice(&message_header(false, 11)));
        let error = decoder.next_message().unwrap_err();
        assert_eq!(
            error,
            FrameError::TooLarge {
                size: 11,
                limit: 10
            }
        );
        assert_eq!(error.code(), Code::ResourceExhausted);
        assert_eq!(
            error.to_string(),
            "message of 11 bytes exceeds the limit of 10 bytes"
        );
    }

    #[test]
    fn bad_flag_and_truncation_are_errors() {
        let mut decoder = FrameDecoder::new(10);
        decoder.push(Bytes::from_static(&[2, 0, 0, 0, 1, 0]));
        assert_eq!(decoder.next_message(), Err(FrameError::BadFlag(2)));
        let mut decoder = FrameDecoder::new(10);
        decoder.push(Bytes::from_static(&[0, 0, 0, 0, 4, 1, 2]));
        assert_eq!(decoder.next_message(), Ok(None));
        assert_eq!(decoder.finish(), Err(FrameError::Truncated { buffered: 7 }));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), limit in 0usize..512) {
            let mut decoder = FrameDecoder::new(limit);
            decoder.push(Bytes::from(bytes));
            let _ = decode_all(&mut decoder);
            let _ = decoder.finish();
        }

        #[test]
        fn any_split_yields_the_same_messages(
            bodies in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)), 0..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut stream = Vec::new();
            for (compressed, body) in &bodies {
                stream.extend_from_slice(&encode_message(*compressed, body));
            }
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(stream.len() + 1)).collect();
            points.push(0);
            points.push(stream.len());
            points.sort_unstable();
            let mut decoder = FrameDecoder::new(1024);
            let mut decoded = Vec::new();
            for pair in points.windows(2) {
                decoder.push(Bytes::copy_from_slice(&stream[pair[0]..pair[1]]));
                decoded.extend(decode_all(&mut decoder).unwrap());
            }
            prop_assert_eq!(decoder.finish(), Ok(()));
            let expected: Vec<GrpcMessage> = bodies
                .into_iter()
                .map(|(compressed, body)| GrpcMessage { compressed, data: Bytes::from(body) })
                .collect();
            prop_assert_eq!(decoded, expected);
        }
    }
}
