//! The query string, decoded once and bounded: a client cannot make the server hold or scan
//! more than [`MAX_QUERY_BYTES`] of it.

use percent_encoding::percent_decode_str;
use sluice_apimachinery::StatusError;

/// kube-apiserver has no explicit limit; the URL itself is bounded by the header limit. This is
/// far above any selector kubectl or client-go sends.
pub const MAX_QUERY_BYTES: usize = 8 * 1024;
const MAX_PARAMETERS: usize = 64;

/// Decoded `name=value` pairs, in order.
#[derive(Debug, Default)]
pub struct Query {
    raw: String,
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn parse(raw: &str) -> Result<Self, StatusError> {
        if raw.len() > MAX_QUERY_BYTES {
            return Err(StatusError::bad_request(format!(
                "the query string is longer than {MAX_QUERY_BYTES} bytes"
            )));
        }
        let mut pairs = Vec::new();
        for pair in raw.split('&').filter(|pair| !pair.is_empty()) {
            if pairs.len() == MAX_PARAMETERS {
                return Err(StatusError::bad_request(format!(
                    "the query has more than {MAX_PARAMETERS} parameters"
                )));
            }
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            pairs.push((decode(name)?, decode(value)?));
        }
        Ok(Self {
            raw: raw.to_string(),
            pairs,
        })
    }

    /// The query as sent (for the parts that only look for `watch`).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
    }
}

fn decode(text: &str) -> Result<String, StatusError> {
    let spaced = text.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| StatusError::bad_request("the query string is not valid UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_decoded() {
        let query = Query::parse("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&limit").unwrap();
        assert_eq!(query.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(query.get("watch"), Some("1"));
        assert_eq!(query.get("limit"), Some(""));
        assert_eq!(query.get("continue"), None);
    }

    #[test]
    fn hostile_queries_are_refused() {
        assert_eq!(
            Query::parse(&"a".repeat(MAX_QUERY_BYTES + 1))
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(Query::parse(&"a=1&".repeat(65)).unwrap_err().code, 400);
        assert_eq!(Query::parse("a=%ff").unwrap_err().code, 400);
    }
}
