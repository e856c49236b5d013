//! Parsing a call: which agent it is for and by when it must end.

use std::time::Instant;

use http::HeaderMap;
use sluice_grpc::parse_timeout;

use crate::error::{ErrorKind, TunnelError};
use crate::protocol::{AGENT_ID_HEADER, GRPC_TIMEOUT};
use crate::registry::AgentId;

/// What routing needs to know about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CallTarget {
    pub(super) agent: AgentId,
    /// The client's deadline (`grpc-timeout`), if it set one.
    pub(super) deadline: Option<Instant>,
    /// When the call arrived: its deadline and its wait for a route count from here.
    pub(super) arrived: Instant,
}

pub(super) fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Reads the agent id and the deadline from a call's metadata, `now` being its arrival.
pub(super) fn parse_call(headers: &HeaderMap, now: Instant) -> Result<CallTarget, TunnelError> {
    let agent = parse_agent(headers)?;
    let deadline = match headers
        .get(GRPC_TIMEOUT)
        .map(|value| parse_timeout(value.as_bytes()))
    {
        None => None,
        Some(Ok(timeout)) => Some(now + timeout),
        Some(Err(error)) => return Err(TunnelError::new(ErrorKind::BadRequest, error.to_string())),
    };
    Ok(CallTarget {
        agent,
        deadline,
        arrived: now,
    })
}

fn parse_agent(headers: &HeaderMap) -> Result<AgentId, TunnelError> {
    let Some(text) = header_text(headers, AGENT_ID_HEADER) else {
        return Err(TunnelError::new(
            ErrorKind::BadRequest,
            format!("missing {AGENT_ID_HEADER} metadata: name the agent to call"),
        ));
    };
    match text.trim().parse::<AgentId>() {
        Ok(agent) if agent > 0 => Ok(agent),
        _ => {
            let shown: String = text.chars().take(40).collect();
            Err(TunnelError::new(
                ErrorKind::BadRequest,
                format!("malformed {AGENT_ID_HEADER} {shown:?}: expected a positive integer"),
            ))
        }
    }
}

/// Whether a private-endpoint call asks for readiness first (`expect: 100-continue`).
pub(super) fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use http::HeaderValue;
    use sluice_grpc::Code;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn a_call_names_a_positive_agent_and_may_carry_a_deadline() {
        let now = Instant::now();
        let call = parse_call(
            &headers(&[("sluice-agent-id", " 12 "), ("grpc-timeout", "2S")]),
            now,
        )
        .unwrap();
        assert_eq!(call.agent, 12);
        assert_eq!(call.deadline, Some(now + Duration::from_secs(2)));
        let call = parse_call(&headers(&[("sluice-agent-id", "3")]), now).unwrap();
        assert_eq!(call.deadline, None);
    }

    #[test]
    fn bad_metadata_is_an_invalid_argument() {
        let now = Instant::now();
        for bad in [
            headers(&[]),
            headers(&[("sluice-agent-id", "0")]),
            headers(&[("sluice-agent-id", "seven")]),
            headers(&[("sluice-agent-id", "7"), ("grpc-timeout", "soon")]),
        ] {
            let error = parse_call(&bad, now).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::BadRequest);
            assert_eq!(error.code(), Code::InvalidArgument);
        }
        assert!(parse_call(&headers(&[]), now)
            .unwrap_err()
            .message()
            .starts_with("missing sluice-agent-id"));
    }
}
