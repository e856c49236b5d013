//! gRPC for the data plane, written for forwarding: messages are located in the HTTP/2 byte
//! stream and passed on as `Bytes` slices of what arrived, never decoded and re-encoded.
//!
//! - [`frame`]: the 5-byte length-prefixed message framing, decoded incrementally from
//!   arbitrarily split DATA frames, with a message size limit;
//! - [`status`]: status codes and `grpc-message` percent-encoding;
//! - [`timeout`]: the `grpc-timeout` header;
//! - [`transport`]: HTTP/2 (the `h2` crate) on monoio, cleartext or TLS ([`tls`]).
//!
//! Hand-written because the gRPC crates (tonic) bring their own HTTP/2 server and tokio runtime,
//! and decode messages into types; a forwarder needs only the framing, on monoio.

pub mod frame;
pub mod frames;
mod gather;
mod serve;
pub mod status;
pub mod timeout;
pub mod tls;
pub mod transport;

pub use frame::{
    encode_message, message_header, message_pieces, FrameDecoder, FrameError, GrpcMessage,
    MESSAGE_HEADER_LEN,
};
pub use status::{Code, Status};
pub use timeout::{encode_timeout, parse_timeout, TimeoutError};
