//! Who a caller is: a role and a subject (the gateway's, node's or VM's name).

use std::fmt;
use std::str::FromStr;

/// What a caller may do; see the table in [`crate::auth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Admin,
    Gateway,
    Node,
    VmAgent,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Gateway, Role::Node, Role::VmAgent];

    /// The name used on the command line, in certificates (O=) and in user names.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Gateway => "gateway",
            Role::Node => "node",
            Role::VmAgent => "vm-agent",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = AuthError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == name)
            .ok_or_else(|| AuthError::UnknownRole(name.chars().take(64).collect()))
    }
}

/// Why a caller could not be identified (answered 401 without saying which credential was
/// close: the message names the rule, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("unknown role {0:?}: expected admin, gateway, node or vm-agent")]
    UnknownRole(String),
    #[error("invalid subject {0:?}: a lowercase RFC 1123 name of at most 253 characters")]
    InvalidSubject(String),
    #[error("the client certificate names no role: its subject needs exactly one O= (admin, gateway, node or vm-agent)")]
    CertificateWithoutRole,
    #[error("the bearer token is not one this control plane issued, or was revoked")]
    UnknownToken,
    #[error("the system's random number generator failed: {0}")]
    Random(String),
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub role: Role,
    /// The gateway's, node's or VM's name (for `vm-agent`, the VM whose span it may read).
    pub subject: String,
}

impl Identity {
    /// A checked identity: the subject is a DNS-1123 subdomain, as object names are, so it can
    /// be matched against a VM's name and shown in messages and logs.
    pub fn new(role: Role, subject: &str) -> Result<Self, AuthError> {
        if !is_subdomain(subject) {
            return Err(AuthError::InvalidSubject(
                subject.chars().take(64).collect(),
            ));
        }
        Ok(Self {
            role,
            subject: subject.to_string(),
        })
    }

    /// From a verified client certificate: CN is the subject, the one O is the role (the
    /// convention of Kubernetes client certificates, where O names the group).
    pub fn from_certificate(common_name: &str, organizations: &[&str]) -> Result<Self, AuthError> {
        let [role] = organizations else {
            return Err(AuthError::CertificateWithoutRole);
        };
        Identity::new(role.parse()?, common_name)
    }

    /// The user name in Status messages, as Kubernetes writes service accounts.
    pub fn user_name(&self) -> String {
        format!("sluice:{}:{}", self.role, self.subject)
    }
}

/// RFC 1123 subdomain: lowercase alphanumerics, `-` and `.`, starting and ending alphanumeric.
fn is_subdomain(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_through_their_names() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!(matches!(
            "root".parse::<Role>(),
            Err(AuthError::UnknownRole(_))
        ));
    }

    #[test]
    fn subjects_are_object_names() {
        assert!(Identity::new(Role::VmAgent, "vm-1.example").is_ok());
        for bad in ["", "VM1", "-vm", "vm-", "a b", "vm_1", &"a".repeat(254)] {
            assert!(
                matches!(
                    Identity::new(Role::Node, bad),
                    Err(AuthError::InvalidSubject(_))
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_certificate_needs_exactly_one_role() {
        let identity = Identity::from_certificate("gw-1", &["gateway"]).unwrap();
        assert_eq!(identity.user_name(), "sluice:gateway:gw-1");
        assert_eq!(
            Identity::from_certificate("gw-1", &[]),
            Err(AuthError::CertificateWithoutRole)
        );
        assert_eq!(
            Identity::from_certificate("gw-1", &["gateway", "admin"]),
            Err(AuthError::CertificateWithoutRole)
        );
        assert!(matches!(
            Identity::from_certificate("gw-1", &["system:masters"]),
            Err(AuthError::UnknownRole(_))
        ));
    }
}
