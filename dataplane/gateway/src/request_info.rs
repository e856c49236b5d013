//! Kubernetes `RequestInfo` from a method, a path and a query string, following
//! `k8s.io/apiserver/pkg/endpoints/request.RequestInfoFactory` (API prefixes `api` and `apis`,
//! `api` groupless) so dispatch rules see exactly what the apiserver's authorizer would see.
//!
//! Everything borrows from the request: the only allocation is a `metadata.name` field-selector
//! value that needed percent- or backslash-unescaping.
//!
//! Known differences from the apiserver, on purpose:
//! - The apiserver decodes the whole `ListOptions` and, when any parameter is malformed, falls back
//!   to "list, no name". Here only `watch` and `fieldSelector` are looked at; a malformed
//!   `limit=abc` does not change the verb (the apiserver rejects such a request anyway).
//! - The path must already be percent-decoded, as Go's `URL.Path` is: [`decode_path`] does that,
//!   and refuses paths that do not decode to exactly one path ([`PathError`]).

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

/// The verb a request performs, as Kubernetes authorization names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    Proxy,
    /// Non-resource `POST`.
    Post,
    /// Non-resource `PUT`.
    Put,
    /// Non-resource `HEAD` (resource `HEAD` is `get`/`list`).
    Head,
    /// Non-resource `OPTIONS`.
    Options,
    /// Any other method: Kubernetes gives resource requests the empty verb and non-resource
    /// requests the lower-cased method; neither can be named in a dispatch rule except by `*` or
    /// a negation.
    Other,
}

impl Verb {
    /// Every verb, for building bit sets.
    pub const ALL: [Verb; 14] = [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
        Verb::Proxy,
        Verb::Post,
        Verb::Put,
        Verb::Head,
        Verb::Options,
        Verb::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Proxy => "proxy",
            Verb::Post => "post",
            Verb::Put => "put",
            Verb::Head => "head",
            Verb::Options => "options",
            Verb::Other => "",
        }
    }

    /// The verb a dispatch rule names (`"get"`, `"deletecollection"`...); `None` for unknown
    /// names and for the empty string.
    pub fn from_name(name: &str) -> Option<Verb> {
        Verb::ALL
            .into_iter()
            .find(|verb| *verb != Verb::Other && verb.as_str() == name)
    }

    /// One bit per verb, for the allocation-free verb sets of compiled dispatch rules.
    pub fn bit(self) -> u16 {
        1 << (self as u8)
    }
}

/// A path or query that the apiserver itself refuses to interpret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestInfoError {
    #[error("unable to determine kind and namespace from url {path:?}")]
    MissingKind { path: String },
}

/// What the apiserver would know about a request before authorizing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    pub is_resource_request: bool,
    /// The decoded request path.
    pub path: &'a str,
    pub verb: Verb,
    /// `api` or `apis` for resource requests, empty otherwise.
    pub api_prefix: &'a str,
    /// Empty for the legacy core group (`/api/v1`).
    pub api_group: &'a str,
    pub api_version: &'a str,
    pub namespace: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    /// From the path, or from a `fieldSelector=metadata.name=...` of a list or watch.
    pub name: Cow<'a, str>,
    /// The path steps from the resource on, `/`-joined (Kubernetes' `Parts`).
    pub parts: &'a str,
}

const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

impl<'a> RequestInfo<'a> {
    /// Parses `method` (upper case, as on the wire), the decoded `path` and the raw `query`
    /// (without `?`).
    pub fn parse(
        method: &str,
        path: &'a str,
        query: &'a str,
    ) -> Result<RequestInfo<'a>, RequestInfoError> {
        let non_resource = RequestInfo {
            is_resource_request: false,
            path,
            verb: non_resource_verb(method),
            api_prefix: "",
            api_group: "",
            api_version: "",
            namespace: "",
            resource: "",
            subresource: "",
            name: Cow::Borrowed(""),
            parts: "",
        };
        let mut parts = PathParts::new(path);
        if parts.len() < 3 {
            return Ok(non_resource);
        }
        let api_prefix = parts.first();
        if api_prefix != "api" && api_prefix != "apis" {
            return Ok(non_resource);
        }
        parts.advance(1);
        let mut api_group = "";
        if api_prefix == "apis" {
            if parts.len() < 3 {
                return Ok(non_resource);
            }
            api_group = parts.first();
            parts.advance(1);
        }
        let api_version = parts.first();
        parts.advance(1);

        let verb = match parts.first() {
            special @ ("proxy" | "watch") => {
                if parts.len() < 2 {
                    return Err(RequestInfoError::MissingKind {
                        path: path.to_string(),
                    });
                }
                parts.advance(1);
                if special == "proxy" {
                    Verb::Proxy
                } else {
                    Verb::Watch
                }
            }
            _ => match method {
                "POST" => Verb::Create,
                "GET" | "HEAD" => Verb::Get,
                "PUT" => Verb::Update,
                "PATCH" => Verb::Patch,
                "DELETE" => Verb::Delete,
                _ => Verb::Other,
            },
        };

        let mut namespace = "";
        if parts.first() == "namespaces" && parts.len() > 1 {
            namespace = parts.nth(1);
            if parts.len() > 2 && !matches!(parts.nth(2), "status" | "finalize") {
                parts.advance(2);
            }
        }

        let mut info = RequestInfo {
            is_resource_request: true,
            path,
            verb,
            api_prefix,
            api_group,
            api_version,
            namespace,
            resource: parts.first(),
            subresource: "",
            name: Cow::Borrowed(""),
            parts: parts.rest,
        };
        if parts.len() >= 2 {
            info.name = Cow::Borrowed(parts.nth(1));
        }
        // The proxy verb keeps everything after the name as the proxied path, not a subresource.
        if parts.len() >= 3 && verb != Verb::Proxy {
            info.subresource = parts.nth(2);
        }

        if info.name.is_empty() && info.verb == Verb::Get {
            let options = ListQuery::parse(query);
            info.verb = if options.watch {
                Verb::Watch
            } else {
                Verb::List
            };
            if let Some(name) = options.name {
                info.name = name;
            }
        }
        if info.name.is_empty() && info.verb == Verb::Delete {
            info.verb = Verb::DeleteCollection;
        }
        Ok(info)
    }

    /// Whether Kubernetes treats the request as long-running (not counted by
    /// MaxRequestsInflight): verbs `watch` and `proxy`, subresources attach, exec, proxy, log and
    /// portforward (`genericfilters.BasicLongRunningRequestCheck`, which counts every `log`, not
    /// only `follow=true` ones).
    pub fn is_long_running(&self) -> bool {
        matches!(self.verb, Verb::Watch | Verb::Proxy)
            || (self.is_resource_request && LONG_RUNNING_SUBRESOURCES.contains(&self.subresource))
    }
}

fn non_resource_verb(method: &str) -> Verb {
    match method {
        "GET" => Verb::Get,
        "POST" => Verb::Post,
        "PUT" => Verb::Put,
        "PATCH" => Verb::Patch,
        "DELETE" => Verb::Delete,
        "HEAD" => Verb::Head,
        "OPTIONS" => Verb::Options,
        _ => Verb::Other,
    }
}

/// Why a raw request path cannot be decoded into exactly one path the apiserver would see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the path does not start with '/'")]
    NotAbsolute,
    #[error("the path has a malformed percent escape")]
    MalformedEscape,
    #[error("the path has an encoded '/' (%2F), which cannot be routed unambiguously")]
    EncodedSlash,
    #[error("the path has a NUL or control character")]
    ControlCharacter,
    #[error("the path does not decode to UTF-8")]
    InvalidUtf8,
    #[error("the path has a '.' or '..' segment")]
    DotSegment,
}

/// Percent-decodes a raw request path the way Go fills `URL.Path`, so routing and flow control
/// decide on the path the apiserver will see; borrows when there is nothing to decode.
///
/// Refuses what could be read two ways: an encoded `/` (a segment boundary to one reader, a
/// name character to another), `.` and `..` segments (a client or proxy may resolve them),
/// control characters (NUL included), malformed escapes and invalid UTF-8.
pub fn decode_path(raw: &str) -> Result<Cow<'_, str>, PathError> {
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let bytes = raw.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        let byte = match bytes[index] {
            b'%' => {
                let hex = bytes
                    .get(index + 1..index + 3)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .ok_or(PathError::MalformedEscape)?;
                if hex == b'/' {
                    return Err(PathError::EncodedSlash);
                }
                index += 3;
                hex
            }
            byte => {
                index += 1;
                byte
            }
        };
        if byte < 0x20 || byte == 0x7f {
            return Err(PathError::ControlCharacter);
        }
    }
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| PathError::InvalidUtf8)?;
    if decoded
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(PathError::DotSegment);
    }
    Ok(decoded)
}

/// The steps of `strings.Split(strings.Trim(path, "/"), "/")`, walked without collecting them.
struct PathParts<'a> {
    rest: &'a str,
    count: usize,
}

impl<'a> PathParts<'a> {
    fn new(path: &'a str) -> Self {
        let rest = path.trim_matches('/');
        let count = if rest.is_empty() {
            0
        } else {
            rest.bytes().filter(|byte| *byte == b'/').count() + 1
        };
        Self { rest, count }
    }

    fn len(&self) -> usize {
        self.count
    }

    fn first(&self) -> &'a str {
        self.nth(0)
    }

    fn nth(&self, index: usize) -> &'a str {
        self.rest.split('/').nth(index).unwrap_or("")
    }

    fn advance(&mut self, steps: usize) {
        for _ in 0..steps.min(self.count) {
            self.rest = self.rest.split_once('/').map_or("", |(_, rest)| rest);
            self.count -= 1;
        }
    }
}

/// The two list options that change a request's verb and name.
struct ListQuery<'a> {
    watch: bool,
    name: Option<Cow<'a, str>>,
}

impl<'a> ListQuery<'a> {
    fn parse(query: &'a str) -> Self {
        let mut watch_value = None;
        let mut field_selector = None;
        // Go's url.ParseQuery skips pairs with a semicolon and keeps the first value of a key.
        for pair in query.split('&').filter(|pair| !pair.contains(';')) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if watch_value.is_none() && query_component_equals(key, "watch") {
                watch_value = Some(value);
            } else if field_selector.is_none() && query_component_equals(key, "fieldSelector") {
                field_selector = Some(value);
            }
        }
        let selector = field_selector.map(decode_query_component);
        let parsed = selector.as_ref().map(|selector| exact_name(selector));
        match parsed {
            Some(Err(MalformedSelector)) => Self {
                // ListOptions decoding failed: the apiserver then only looks for a watch value
                // other than "false"/"0" and sets no name.
                watch: watch_value.is_some_and(|value| {
                    let value = decode_query_component(value);
                    !(value.eq_ignore_ascii_case("false") || value == "0")
                }),
                name: None,
            },
            _ => {
                let name = match (selector, parsed) {
                    (Some(Cow::Borrowed(selector)), Some(Ok(Some(range)))) => {
                        Some(unescape_selector_value(&selector[range]))
                    }
                    (Some(Cow::Owned(selector)), Some(Ok(Some(range)))) => Some(Cow::Owned(
                        unescape_selector_value(&selector[range]).into_owned(),
                    )),
                    _ => None,
                };
                Self {
                    watch: watch_value.is_some_and(|value| {
                        let value = decode_query_component(value);
                        !(value == "0"
                            || value.eq_ignore_ascii_case("f")
                            || value.eq_ignore_ascii_case("false"))
                    }),
                    name: name.filter(|name| is_valid_path_segment_name(name)),
                }
            }
        }
    }
}

fn query_component_equals(raw: &str, expected: &str) -> bool {
    if !raw.contains(['%', '+']) {
        return raw == expected;
    }
    decode_query_component(raw) == expected
}

fn decode_query_component(raw: &str) -> Cow<'_, str> {
    if raw.contains('+') {
        let spaced = raw.replace('+', " ");
        return Cow::Owned(percent_decode_str(&spaced).decode_utf8_lossy().into_owned());
    }
    percent_decode_str(raw).decode_utf8_lossy()
}

/// A field selector the apiserver's `fields.ParseSelector` would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MalformedSelector;

/// Parses a field selector like `fields.ParseSelector` and returns where the value of a
/// `metadata.name=` / `metadata.name==` term is (still escaped), `Ok(None)` when there is none,
/// `Err` when the selector is malformed.
fn exact_name(selector: &str) -> Result<Option<std::ops::Range<usize>>, MalformedSelector> {
    if selector.is_empty() {
        return Ok(None);
    }
    let mut found = None;
    let mut start = 0;
    for end in term_ends(selector) {
        let term = &selector[start..end];
        let (field, operator, value_start) = split_term(term).ok_or(MalformedSelector)?;
        validate_escapes(&term[value_start..])?;
        if found.is_none() && field == "metadata.name" && operator != "!=" {
            found = Some(start + value_start..end);
        }
        start = end + 1;
    }
    Ok(found)
}

/// End offsets of the comma-separated terms, skipping backslash-escaped commas.
fn term_ends(selector: &str) -> impl Iterator<Item = usize> + '_ {
    let bytes = selector.as_bytes();
    let mut index = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while index < bytes.len() {
            match bytes[index] {
                b'\\' => index += 2,
                b',' => {
                    let end = index;
                    index += 1;
                    return Some(end);
                }
                _ => index += 1,
            }
        }
        done = true;
        Some(bytes.len())
    })
}

fn split_term(term: &str) -> Option<(&str, &'static str, usize)> {
    let bytes = term.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' {
            index += 2;
            continue;
        }
        for operator in ["!=", "==", "="] {
            if bytes[index..].starts_with(operator.as_bytes()) {
                return Some((&term[..index], operator, index + operator.len()));
            }
        }
        index += 1;
    }
    None
}

fn validate_escapes(value: &str) -> Result<(), MalformedSelector> {
    let mut escaped = false;
    for character in value.chars() {
        if escaped {
            if !matches!(character, '\\' | ',' | '=') {
                return Err(MalformedSelector);
            }
            escaped = false;
        } else if character == '\\' {
            escaped = true;
        } else if matches!(character, ',' | '=') {
            return Err(MalformedSelector);
        }
    }
    if escaped {
        Err(MalformedSelector)
    } else {
        Ok(())
    }
}

fn unescape_selector_value(value: &str) -> Cow<'_, str> {
    if !value.contains('\\') {
        return Cow::Borrowed(value);
    }
    let mut unescaped = String::with_capacity(value.len());
    let mut escaped = false;
    for character in value.chars() {
        if !escaped && character == '\\' {
            escaped = true;
        } else {
            unescaped.push(character);
            escaped = false;
        }
    }
    Cow::Owned(unescaped)
}

fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains(['/', '%'])
}

#[cfg(test)]
mod tests;
