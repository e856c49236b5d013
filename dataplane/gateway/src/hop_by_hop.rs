//! The headers that belong to one connection, not to the request: a proxy never forwards them.
//! One list for every hop that re-sends a client's request (the gateway to its apiservers, the
//! agent to its own).

use http::HeaderName;

/// Hop-by-hop headers (RFC 9110 7.6.1) and `host` (the next hop names its own target; HTTP/2
/// carries it as :authority).
pub const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Whether `name` is one of [`HOP_BY_HOP`].
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}
