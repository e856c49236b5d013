//! Kubernetes API requests through the reverse tunnel, as pure functions shared by the gateway
//! (which sends them) and the agent (which replays them against its apiserver):
//! - [`codec`]: the `MakeRequest` messages with every size bounded and typed errors, and the
//!   order an exchange's messages may come in;
//! - [`assertion`]: the gateway's signed, short-lived, request-bound statement of who the user
//!   is, and the agent's verification of it (trusted keys, audience, lifetime, replay);
//! - [`apiserver_head`]: the headers the agent sends its apiserver: the client's end-to-end
//!   headers without any identity of its own, plus the vouched-for user's impersonation headers.
//!
//! No I/O and no async runtime: the callers own the streams.

pub mod apiserver_head;
pub mod assertion;
pub mod codec;

pub use apiserver_head::{apiserver_headers, review_headers, HeadError};
pub use assertion::{
    AssertionError, AssertionSigner, AssertionVerifier, Identity, VerifierOptions, Vouched,
    REVIEW_PATHS,
};
pub use codec::{
    decode_request, decode_response, encode_request_data, encode_request_end, encode_request_head,
    encode_request_upgrade_data, encode_response_data, encode_response_end, encode_response_head,
    encode_response_upgrade_data, CodecError, ExchangeLimits, ExchangeOrder, MessageKind,
    RequestHead, RequestMessage, ResponseHead, ResponseMessage,
};

/// The gRPC method carrying one HTTP exchange. The node's external endpoint refuses it: only the
/// gateway may call it (in process, or over the private hop).
pub const MAKE_REQUEST_PATH: &str = "/sluice.kubernetes.v1.KubernetesApi/MakeRequest";

/// The gRPC status codes the errors map to (numbers, as `sluice_grpc::Code::from_u32` takes them:
/// this crate stays free of the gRPC transport).
pub mod grpc_code {
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const PERMISSION_DENIED: u32 = 7;
}
