//! Checking one call's tunnel messages while they are passed on unread (the private hop's
//! spliced calls, `node/framed.rs`): the node holding the agent's tunnel splices the routing
//! node's frames into the tunnel and the agent's frames back, and needs to know only where each
//! message starts and ends, what kind it is, and when the call is over. Payloads are never
//! decoded or copied; the bytes passed on are exactly the bytes received.
//!
//! Hand-written rather than prost: decoding would copy every message's metadata and split its
//! payload, which is what splicing saves. The check is strict so that the agent (which decodes
//! with prost) sees the same messages as this scanner: every frame is one uncompressed gRPC
//! message holding exactly one length-delimited field of the expected oneof, nothing else.

use sluice_grpc::{FrameError, MESSAGE_HEADER_LEN};

/// Which messages a spliced stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Node -> agent (`ConnectResponse`): RequestInfo, Message*, CloseSend.
    ToAgent,
    /// Agent -> node (`ConnectRequest`): Header?, Message*, then Trailer or Error.
    FromAgent,
}

/// One tunnel message's kind, by its oneof field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RequestInfo,
    Message,
    CloseSend,
    Header,
    Trailer,
    Error,
}

impl Direction {
    /// The kind of a message whose first byte (its field's key) is `key`.
    fn kind(self, key: u8) -> Option<Kind> {
        // Length-delimited fields only (wire type 2): field number << 3 | 2.
        match (self, key) {
            (Direction::ToAgent, 0x0a) => Some(Kind::RequestInfo),
            (Direction::ToAgent, 0x12) => Some(Kind::Message),
            (Direction::ToAgent, 0x1a) => Some(Kind::CloseSend),
            (Direction::FromAgent, 0x12) => Some(Kind::Header),
            (Direction::FromAgent, 0x1a) => Some(Kind::Message),
            (Direction::FromAgent, 0x22) => Some(Kind::Trailer),
            (Direction::FromAgent, 0x2a) => Some(Kind::Error),
            _ => None,
        }
    }
}

/// Why a spliced stream is not one well-formed call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    #[error("bad gRPC framing: {0}")]
    Frame(#[from] FrameError),
    #[error("compressed tunnel frames are not used")]
    Compressed,
    #[error("a tunnel frame that is not exactly one known message")]
    Shape,
    #[error("{0}")]
    Order(&'static str),
    #[error("bytes after the call's last message")]
    AfterEnd,
}

/// How far one chunk was scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes of the chunk that belong to the call; the rest (if any) came after its end.
    pub consumed: usize,
    /// The call's last message (CloseSend, Trailer or Error) is complete.
    pub ended: bool,
}

/// Where in the call the messages are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing yet.
    Start,
    /// After the RequestInfo (to the agent) or the Header (from it).
    Open,
    Ended,
}

/// The most bytes of a frame's start looked at: the gRPC prefix, the field key and its length
/// (a varint of at most 10 bytes).
const HEAD_MAX: usize = MESSAGE_HEADER_LEN + 1 + 10;

/// A Trailer or Error kept for its status up to this size (a larger one still passes).
const TERMINAL_KEPT: usize = 80 * 1024;

/// Scans one call's frames as they pass (see the module docs).
#[derive(Debug)]
pub struct CallScanner {
    direction: Direction,
    /// The largest frame allowed.
    limit: usize,
    phase: Phase,
    head: [u8; HEAD_MAX],
    head_len: usize,
    /// The frame's length from its gRPC prefix, once read.
    frame_len: usize,
    /// Bytes of the current frame's field still to pass, once its head was read.
    remaining: usize,
    kind: Option<Kind>,
    /// The last message when it is a Trailer or Error (its encoding as a `ConnectRequest`),
    /// unless over `TERMINAL_KEPT`.
    terminal: Option<Vec<u8>>,
}

impl CallScanner {
    /// `limit`: the largest frame allowed (the largest payload plus room for its wrapper).
    pub fn new(direction: Direction, limit: usize) -> Self {
        Self {
            direction,
            limit,
            phase: Phase::Start,
            head: [0; HEAD_MAX],
            head_len: 0,
            frame_len: 0,
            remaining: 0,
            kind: None,
            terminal: None,
        }
    }

    /// Scans the next bytes of the stream. Stops at the end of the call's last message; bytes
    /// after it are left unconsumed (the caller decides, see [`SpliceError::AfterEnd`]).
    pub fn scan(&mut self, chunk: &[u8]) -> Result<Scanned, SpliceError> {
        if self.phase == Phase::Ended && !chunk.is_empty() {
            return Err(SpliceError::AfterEnd);
        }
        let mut at = 0;
        while at < chunk.len() && self.phase != Phase::Ended {
            if self.kind.is_some() {
                let taken = self.remaining.min(chunk.len() - at);
                if let Some(kept) = self.terminal.as_mut() {
                    kept.extend_from_slice(&chunk[at..at + taken]);
                }
                self.remaining -= taken;
                at += taken;
            } else {
                self.head[self.head_len] = chunk[at];
                self.head_len += 1;
                at += 1;
                self.read_head()?;
            }
            if self.kind.is_some() && self.remaining == 0 {
                self.frame_done();
            }
        }
        Ok(Scanned {
            consumed: at,
            ended: self.phase == Phase::Ended,
        })
    }

    /// Whether the call's last message passed.
    pub fn ended(&self) -> bool {
        self.phase == Phase::Ended
    }

    /// At the end of the stream: an error unless the call ended there.
    pub fn finish(&self) -> Result<(), SpliceError> {
        if self.phase == Phase::Ended {
            return Ok(());
        }
        let buffered = self.head_len + usize::from(self.kind.is_some());
        if buffered > 0 {
            return Err(FrameError::Truncated { buffered }.into());
        }
        Err(SpliceError::Order(match self.direction {
            Direction::ToAgent => "the call's messages ended without CloseSend",
            Direction::FromAgent => "the agent's messages ended without a Trailer or Error",
        }))
    }

    /// The call's last message, a Trailer or Error, encoded as a `ConnectRequest` (`None`
    /// before it, to the agent, or when it was too large to keep).
    pub fn terminal(&self) -> Option<&[u8]> {
        self.terminal.as_deref()
    }

    /// Takes in the byte just added to the head.
    fn read_head(&mut self) -> Result<(), SpliceError> {
        let len = self.head_len;
        if len < MESSAGE_HEADER_LEN {
            return Ok(());
        }
        if len == MESSAGE_HEADER_LEN {
            if self.head[0] == 1 {
                return Err(SpliceError::Compressed);
            }
            if self.head[0] != 0 {
                return Err(FrameError::BadFlag(self.head[0]).into());
            }
            let size = u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]])
                as usize;
            if size > self.limit {
                return Err(FrameError::TooLarge {
                    size,
                    limit: self.limit,
                }
                .into());
            }
            if size < 2 {
                // No room for a key and a length: an empty message or a bare key.
                return Err(SpliceError::Shape);
            }
            self.frame_len = size;
            return Ok(());
        }
        if len == MESSAGE_HEADER_LEN + 1 {
            return match self.direction.kind(self.head[MESSAGE_HEADER_LEN]) {
                Some(_) => Ok(()),
                None => Err(SpliceError::Shape),
            };
        }
        let body_read = len - MESSAGE_HEADER_LEN;
        let last = self.head[len - 1];
        if last & 0x80 != 0 {
            // The length goes on; it may not go past the frame or ten bytes.
            return if body_read >= self.frame_len || len == HEAD_MAX {
                Err(SpliceError::Shape)
            } else {
                Ok(())
            };
        }
        let field_len = self.head[MESSAGE_HEADER_LEN + 1..len]
            .iter()
            .rev()
            .try_fold(0u64, |value, byte| {
                value
                    .checked_mul(128)
                    .map(|value| value | u64::from(byte & 0x7f))
            })
            .ok_or(SpliceError::Shape)?;
        // Exactly one field filling the frame.
        if (body_read as u64).checked_add(field_len) != Some(self.frame_len as u64) {
            return Err(SpliceError::Shape);
        }
        let key = self.head[MESSAGE_HEADER_LEN];
        let kind = self.direction.kind(key).ok_or(SpliceError::Shape)?;
        self.start_message(kind)?;
        if matches!(kind, Kind::Trailer | Kind::Error) {
            self.terminal = (self.frame_len <= TERMINAL_KEPT).then(|| {
                let mut kept = Vec::with_capacity(self.frame_len);
                kept.extend_from_slice(&self.head[MESSAGE_HEADER_LEN..len]);
                kept
            });
        }
        self.kind = Some(kind);
        self.remaining = field_len as usize;
        Ok(())
    }

    /// Whether a message of `kind` may come now.
    fn start_message(&mut self, kind: Kind) -> Result<(), SpliceError> {
        use Kind::*;
        let order = |why| Err(SpliceError::Order(why));
        match (self.phase, kind) {
            (Phase::Start, RequestInfo) | (Phase::Start, Header) => self.phase = Phase::Open,
            (Phase::Start, Message | CloseSend) if self.direction == Direction::ToAgent => {
                return order("a call's first message is its RequestInfo")
            }
            (Phase::Start, Message) => return order("a Message before the Header"),
            (Phase::Open, RequestInfo) => return order("a second RequestInfo"),
            (Phase::Open, Header) => return order("a second Header"),
            _ => {}
        }
        Ok(())
    }

    fn frame_done(&mut self) {
        if matches!(
            self.kind,
            Some(Kind::CloseSend | Kind::Trailer | Kind::Error)
        ) {
            self.phase = Phase::Ended;
        }
        self.kind = None;
        self.head_len = 0;
        self.frame_len = 0;
    }
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
