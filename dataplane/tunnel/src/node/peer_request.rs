//! The request head of a call forwarded to another node's private endpoint.

use std::time::Instant;

use http::uri::Authority;
use http::{HeaderName, HeaderValue, Request, Uri};
use sluice_grpc::encode_timeout;

use super::framed::SPLICE_PATH;
use crate::protocol::{AGENT_ID_HEADER, GRPC_TIMEOUT};
use crate::registry::AgentId;
use crate::wire::is_hop_header;

// Parsed once: a name given as text is parsed again on every insert.
const AGENT_ID: HeaderName = HeaderName::from_static(AGENT_ID_HEADER);
const TIMEOUT: HeaderName = HeaderName::from_static(GRPC_TIMEOUT);

/// What a call forwarded to another node carries in its request head.
pub(super) struct PeerCall<'a> {
    pub(super) authority: &'a Authority,
    pub(super) parts: &'a http::request::Parts,
    pub(super) deadline: Option<Instant>,
    pub(super) agent: AgentId,
    pub(super) token: &'a HeaderValue,
}

impl PeerCall<'_> {
    /// The request head: the node's token, the agent, the remaining deadline and a request
    /// for readiness first; the client's method and metadata too unless the call is framed
    /// (then they travel in its RequestInfo).
    pub(super) fn request(&self, framed: bool) -> Result<Request<()>, http::Error> {
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(self.authority.clone());
        uri.path_and_query = if framed {
            Some(http::uri::PathAndQuery::from_static(SPLICE_PATH))
        } else {
            // The client's parsed path is shared, not formatted and parsed again.
            self.parts.uri.path_and_query().cloned()
        };
        let mut request = Request::post(Uri::from_parts(uri)?).body(())?;
        let headers = request.headers_mut();
        if !framed {
            // The client's metadata as it arrived (it passed this node's limits then), hop
            // headers left out: values are shared, not copied, and nothing is parsed again.
            let _ = headers.try_reserve(self.parts.headers.len() + 4);
            for (name, value) in &self.parts.headers {
                if !is_hop_header(name) {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers
            .entry(http::header::CONTENT_TYPE)
            .or_insert(HeaderValue::from_static("application/grpc"));
        headers.insert(
            http::header::EXPECT,
            HeaderValue::from_static("100-continue"),
        );
        headers.insert(http::header::AUTHORIZATION, self.token.clone());
        headers.insert(AGENT_ID, HeaderValue::from(self.agent));
        if let Some(deadline) = self.deadline {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if let Ok(value) = HeaderValue::from_str(&encode_timeout(remaining)) {
                headers.insert(TIMEOUT, value);
            }
        }
        Ok(request)
    }
}
