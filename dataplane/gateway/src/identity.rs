//! Who a request is from, and how that identity travels to the apiserver: the gateway connects
//! with its own credentials and names the user in `Impersonate-*` headers, exactly as
//! client-go's impersonating transport does, so the apiserver authorizes the real user.

use std::collections::BTreeMap;

use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

pub const IMPERSONATE_USER: &str = "impersonate-user";
pub const IMPERSONATE_GROUP: &str = "impersonate-group";
pub const IMPERSONATE_UID: &str = "impersonate-uid";
pub const IMPERSONATE_EXTRA_PREFIX: &str = "impersonate-extra-";

/// The authenticated user (Kubernetes `user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        Self {
            name: name.into(),
            groups: groups.iter().map(|group| group.to_string()).collect(),
            ..Self::default()
        }
    }

    /// Kubernetes' anonymous user.
    pub fn anonymous() -> Self {
        Self::new("system:anonymous", &["system:unauthenticated"])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("{header} value is not valid in an HTTP header: {value:?}")]
    InvalidHeaderValue { header: String, value: String },
    #[error("header {header} is not valid UTF-8")]
    NonUtf8Header { header: String },
    #[error("requested impersonation of {header} without impersonating a user")]
    ImpersonationWithoutUser { header: String },
    #[error("Impersonate-User was sent more than once")]
    RepeatedImpersonateUser,
    #[error("invalid client certificate: {0}")]
    Certificate(String),
    #[error("client certificate has an empty subject common name")]
    EmptyCommonName,
}

/// Header name characters client-go leaves alone in an extra key (HTTP token characters, minus
/// `%` which starts an escape); everything else is percent-encoded.
const EXTRA_KEY_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'*')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// Removes what a client may not pass through: its `Authorization` (the gateway authenticates
/// upstream as itself) and any `Impersonate-*` header (honoured only after a SubjectAccessReview,
/// then re-added by [`write_impersonation_headers`]). Allocates nothing.
pub fn strip_client_identity(headers: &mut HeaderMap) {
    headers.remove(AUTHORIZATION);
    while let Some(name) = headers
        .keys()
        .find(|name| name.as_str().starts_with("impersonate-"))
        .cloned()
    {
        headers.remove(&name);
    }
}

/// The impersonation headers of one user, encoded once (when the user is authenticated and
/// cached) and copied onto every request of that user without re-encoding: a `HeaderValue`
/// clone only bumps a reference count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImpersonationHeaders {
    headers: HeaderMap,
}

impl ImpersonationHeaders {
    pub fn new(user: &UserInfo) -> Result<Self, IdentityError> {
        let mut headers = HeaderMap::new();
        write_impersonation_headers(user, &mut headers)?;
        Ok(Self { headers })
    }

    /// Appends the headers to a request whose client identity was already stripped.
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// Adds the impersonation headers for `user`: `Impersonate-User`, one `Impersonate-Group` per
/// group, `Impersonate-Uid` when known, and `Impersonate-Extra-<escaped key>` per extra value.
/// Call [`strip_client_identity`] first. Encodes on every call: per request, prefer a cached
/// [`ImpersonationHeaders`].
pub fn write_impersonation_headers(
    user: &UserInfo,
    headers: &mut HeaderMap,
) -> Result<(), IdentityError> {
    headers.insert(
        HeaderName::from_static(IMPERSONATE_USER),
        header_value(IMPERSONATE_USER, &user.name)?,
    );
    for group in &user.groups {
        headers.append(
            HeaderName::from_static(IMPERSONATE_GROUP),
            header_value(IMPERSONATE_GROUP, group)?,
        );
    }
    if !user.uid.is_empty() {
        headers.insert(
            HeaderName::from_static(IMPERSONATE_UID),
            header_value(IMPERSONATE_UID, &user.uid)?,
        );
    }
    for (key, values) in &user.extra {
        let name = format!(
            "{IMPERSONATE_EXTRA_PREFIX}{}",
            utf8_percent_encode(key, EXTRA_KEY_ESCAPES)
        );
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            IdentityError::InvalidHeaderValue {
                header: "Impersonate-Extra key".into(),
                value: key.clone(),
            }
        })?;
        for value in values {
            headers.append(name.clone(), header_value(name.as_str(), value)?);
        }
    }
    Ok(())
}

fn header_value(header: &str, value: &str) -> Result<HeaderValue, IdentityError> {
    HeaderValue::from_str(value).map_err(|_| IdentityError::InvalidHeaderValue {
        header: header.to_string(),
        value: value.to_string(),
    })
}

/// The identity a client asked to act as with its own `Impersonate-*` headers, as the apiserver
/// reads them (extra keys lower-cased and percent-decoded). `None` when it sent none.
pub fn requested_impersonation(headers: &HeaderMap) -> Result<Option<UserInfo>, IdentityError> {
    let text = |name: &str, value: &HeaderValue| {
        value
            .to_str()
            .map(str::to_string)
            .map_err(|_| IdentityError::NonUtf8Header {
                header: name.to_string(),
            })
    };
    let mut requested = UserInfo::default();
    let mut has_user = false;
    let mut other_header = None;
    for (name, value) in headers {
        let name = name.as_str();
        if name == IMPERSONATE_USER {
            if has_user {
                return Err(IdentityError::RepeatedImpersonateUser);
            }
            has_user = true;
            requested.name = text(name, value)?;
        } else if name == IMPERSONATE_GROUP {
            requested.groups.push(text(name, value)?);
            other_header.get_or_insert(name);
        } else if name == IMPERSONATE_UID {
            requested.uid = text(name, value)?;
            other_header.get_or_insert(name);
        } else if let Some(key) = name.strip_prefix(IMPERSONATE_EXTRA_PREFIX) {
            let key = percent_decode_str(key).decode_utf8_lossy().to_lowercase();
            requested
                .extra
                .entry(key)
                .or_default()
                .push(text(name, value)?);
            other_header.get_or_insert(name);
        }
    }
    match (has_user, other_header) {
        (true, _) => Ok(Some(requested)),
        (false, Some(header)) => Err(IdentityError::ImpersonationWithoutUser {
            header: header.to_string(),
        }),
        (false, None) => Ok(None),
    }
}

/// One `impersonate` permission a SubjectAccessReview must grant before a client's requested
/// identity is honoured (the checks kube-apiserver's impersonation filter makes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImpersonationCheck {
    pub api_group: &'static str,
    pub resource: &'static str,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl ImpersonationCheck {
    /// What [`crate::status::GatewayError::ImpersonationForbidden`] calls the target.
    pub fn kind(&self) -> &'static str {
        match self.resource {
            "serviceaccounts" => "serviceaccount",
            "groups" => "group",
            "uids" => "uid",
            "userextras" => "userextra",
            _ => "user",
        }
    }
}

/// The checks for `requested`, in the apiserver's order: the user (or service account), each
/// group, each extra value, the uid.
pub fn impersonation_checks(requested: &UserInfo) -> Vec<ImpersonationCheck> {
    let check =
        |api_group, resource, subresource: &str, namespace: &str, name: &str| ImpersonationCheck {
            api_group,
            resource,
            subresource: subresource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
    let mut checks = Vec::new();
    match requested
        .name
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((namespace, name)) => {
            checks.push(check("", "serviceaccounts", "", namespace, name));
        }
        None => checks.push(check("", "users", "", "", &requested.name)),
    }
    for group in &requested.groups {
        checks.push(check("", "groups", "", "", group));
    }
    for (key, values) in &requested.extra {
        for value in values {
            checks.push(check("authentication.k8s.io", "userextras", key, "", value));
        }
    }
    if !requested.uid.is_empty() {
        checks.push(check(
            "authentication.k8s.io",
            "uids",
            "",
            "",
            &requested.uid,
        ));
    }
    checks
}

/// The user of a verified client certificate (DER): CN is the name, each O a group, as
/// Kubernetes' x509 authenticator reads it. The caller has already verified the chain.
pub fn user_from_certificate(der: &[u8]) -> Result<UserInfo, IdentityError> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der)
        .map_err(|error| IdentityError::Certificate(error.to_string()))?;
    let subject = certificate.subject();
    let attribute_text = |attribute: &x509_parser::x509::AttributeTypeAndValue| {
        attribute
            .as_str()
            .map(str::to_string)
            .map_err(|error| IdentityError::Certificate(error.to_string()))
    };
    let name = match subject.iter_common_name().next() {
        Some(common_name) => attribute_text(common_name)?,
        None => String::new(),
    };
    if name.is_empty() {
        return Err(IdentityError::EmptyCommonName);
    }
    let groups = subject
        .iter_organization()
        .map(attribute_text)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(UserInfo {
        name,
        groups,
        ..UserInfo::default()
    })
}

#[cfg(test)]
mod tests;
