//! The takeover's one error type, and the host's (netlink, OVSDB) beneath it.

use std::time::Duration;

use crate::record::RecordError;

/// What one host operation (a netlink request, an OVSDB transaction, an ioctl) failed with.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Boxed: a netlink error can carry a whole message.
    #[error("netlink: {0}")]
    Netlink(Box<rtnetlink::Error>),
    #[error(transparent)]
    Ovsdb(#[from] sluice_ovs::OvsdbError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("link `{0}` does not exist")]
    NoSuchLink(String),
    #[error("{what} did not happen within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    #[error("{0}")]
    Invalid(String),
}

impl From<rtnetlink::Error> for HostError {
    fn from(error: rtnetlink::Error) -> Self {
        HostError::Netlink(Box::new(error))
    }
}

/// How far the rollback after a failed step got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rollback {
    /// Every completed step was undone: the host is as it was before.
    Complete,
    /// Some undo operations failed (each named with its error): the host is half-way.
    Incomplete(Vec<String>),
}

impl std::fmt::Display for Rollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rollback::Complete => write!(f, "rolled back completely"),
            Rollback::Incomplete(failures) => {
                write!(f, "rollback incomplete: {}", failures.join("; "))
            }
        }
    }
}

/// Why taking over, recovering or restoring an uplink failed.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    #[error("uplink `{uplink}` cannot be renamed: `{uplink}~` would exceed the {max}-byte interface name limit")]
    NameTooLong { uplink: String, max: usize },
    #[error("uplink `{0}` does not exist")]
    NoSuchUplink(String),
    #[error("{what}: {source}")]
    Observe {
        what: String,
        #[source]
        source: Box<HostError>,
    },
    #[error("the takeover record is unreadable: {0}")]
    Record(#[from] RecordError),
    #[error("step `{step}` failed: {source}; {rollback}")]
    Step {
        step: String,
        #[source]
        source: Box<HostError>,
        rollback: Rollback,
    },
    #[error("opening a netlink socket: {0}")]
    Netlink(std::io::Error),
}

impl UplinkError {
    /// The name of the step that failed, for a [`UplinkError::Step`].
    pub fn step(&self) -> Option<&str> {
        match self {
            UplinkError::Step { step, .. } => Some(step),
            _ => None,
        }
    }
}

/// Wraps an observation's error with what was being observed.
pub(crate) fn observing(what: impl Into<String>) -> impl FnOnce(HostError) -> UplinkError {
    let what = what.into();
    move |source| UplinkError::Observe {
        what,
        source: Box::new(source),
    }
}
