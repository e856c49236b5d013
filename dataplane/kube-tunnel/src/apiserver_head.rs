//! The headers an agent sends its apiserver: the client's end-to-end headers with nothing that
//! names a user or a host, then the identity the gateway vouched for as `Impersonate-*` headers
//! (encoded exactly as the gateway encodes them for a direct upstream) and the agent's own
//! credential. A client's `Impersonate-User: admin` thus never reaches the apiserver: the
//! gateway has already checked that impersonation and put its result in the assertion.

use http::header::{self, HeaderMap, HeaderValue};
use sluice_gateway::hop_by_hop::is_hop_by_hop;
use sluice_gateway::identity::{write_impersonation_headers, IdentityError, UserInfo};

use crate::assertion::Identity;

/// Beside the hop-by-hop ones (`host` among them: the agent names its own apiserver): the
/// client's credentials (the agent sends its own).
const DROPPED: [&str; 1] = ["authorization"];

/// Prefixes of headers that assert who the user is: impersonation, and the front-proxy
/// (request-header authentication) headers an apiserver may be configured to trust.
const DROPPED_PREFIXES: [&str; 2] = ["impersonate-", "x-remote-"];

/// Why the head could not be built. The identity came signed by the gateway, so the fault is the
/// gateway's: INVALID_ARGUMENT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("the vouched-for identity has no user name")]
    EmptyUser,
    #[error("the vouched-for identity cannot be sent as impersonation headers: {0}")]
    Identity(#[from] IdentityError),
}

impl HeadError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::EmptyUser => "empty_user",
            Self::Identity(_) => "invalid_identity",
        }
    }

    pub fn grpc_code(&self) -> u32 {
        crate::grpc_code::INVALID_ARGUMENT
    }
}

/// The apiserver request's headers: `request`'s end-to-end headers, minus hop-by-hop ones (and
/// those its `Connection` names), `Host`, `Authorization`, `Proxy-Authorization`, every
/// `Impersonate-*` and `X-Remote-*`; plus `identity`'s impersonation headers and `bearer` as
/// `Authorization` (the whole header value, `Bearer <token>`). An upgrade request (exec,
/// attach, port-forward) keeps `Upgrade` and gets `Connection: Upgrade`.
pub fn apiserver_headers(
    request: &HeaderMap,
    identity: &Identity,
    bearer: Option<&HeaderValue>,
) -> Result<HeaderMap, HeadError> {
    if identity.user.is_empty() {
        return Err(HeadError::EmptyUser);
    }
    let mut headers = end_to_end(request);
    write_impersonation_headers(&UserInfo::from(identity), &mut headers)?;
    set_bearer(&mut headers, bearer);
    Ok(headers)
}

/// The headers of the gateway's own review (see `assertion::Vouched::GatewayReview`): the
/// request's end-to-end headers as for a user, no impersonation, the agent's credential.
pub fn review_headers(request: &HeaderMap, bearer: Option<&HeaderValue>) -> HeaderMap {
    let mut headers = end_to_end(request);
    set_bearer(&mut headers, bearer);
    headers
}

fn set_bearer(headers: &mut HeaderMap, bearer: Option<&HeaderValue>) {
    if let Some(bearer) = bearer {
        let mut bearer = bearer.clone();
        bearer.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, bearer);
    }
}

/// `request`'s headers without hop-by-hop ones (and those its `Connection` names), `Host`,
/// credentials and every header that asserts who the user is; an upgrade keeps `Upgrade` and
/// gets `Connection: Upgrade`.
fn end_to_end(request: &HeaderMap) -> HeaderMap {
    let connection_listed = connection_tokens(request);
    let mut headers = HeaderMap::with_capacity(request.len() + 4);
    for (name, value) in request {
        let name_text = name.as_str();
        let dropped = is_hop_by_hop(name)
            || DROPPED.contains(&name_text)
            || DROPPED_PREFIXES
                .iter()
                .any(|prefix| name_text.starts_with(prefix))
            || connection_listed.iter().any(|listed| listed == name_text);
        if !dropped {
            headers.append(name.clone(), value.clone());
        }
    }
    if is_upgrade(request, &connection_listed) {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        for value in request.get_all(header::UPGRADE) {
            headers.append(header::UPGRADE, value.clone());
        }
    }
    headers
}

/// The lowercase names listed in the request's `Connection` headers.
fn connection_tokens(request: &HeaderMap) -> Vec<String> {
    request
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect()
}

/// An HTTP/1.1 upgrade: `Connection: upgrade` and an `Upgrade` header.
fn is_upgrade(request: &HeaderMap, connection_listed: &[String]) -> bool {
    request.contains_key(header::UPGRADE)
        && connection_listed.iter().any(|token| token == "upgrade")
}

#[cfg(test)]
mod tests;
