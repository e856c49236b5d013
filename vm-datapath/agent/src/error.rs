//! The agent's one error type: what stopped it (or kept it from starting), and whether starting
//! it again as it is may work. Callers decide on [`VmAgentError::retryable`], never on the text.

use std::net::SocketAddr;
use std::path::PathBuf;

use sluice_config_error::InvalidSources;
use sluice_ovs::OvsdbError;
use sluice_policy_engine::EngineError;
use sluice_watch_client::WatchError;

#[derive(Debug, thiserror::Error)]
pub enum VmAgentError {
    /// Neither a policy file nor a control plane was given.
    #[error("give --policies or --controlplane")]
    NoPolicySource,
    /// The tokio runtime could not be built (threads, descriptors).
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The admin address is taken or not ours.
    #[error("binding the admin address {address}: {source}")]
    AdminBind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// OVSDB could not be reached or refused to create the bridge.
    #[error("{what}: {source}")]
    Ovsdb {
        what: &'static str,
        #[source]
        source: OvsdbError,
    },
    /// The policy file or directory does not load.
    #[error("{0}")]
    Policies(#[source] InvalidSources),
    /// The policy engine could not start or withdraw its flows.
    #[error("{0}")]
    Engine(#[source] EngineError),
    /// A watch or the reporter on the control plane could not be set up.
    #[error("{0}")]
    Watch(#[source] WatchError),
    /// The saved policy state could not be read or written (see `lifecycle/persist.rs`).
    #[error("{path}: {source}")]
    SavedStateIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The saved policy state is not one (damaged, or another program's file).
    #[error("{path}: not a saved policy state: {source}")]
    SavedStateFormat {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The saved policy state is larger than any the agent writes.
    #[error("{path}: larger than {limit} bytes")]
    SavedStateTooLarge { path: PathBuf, limit: u64 },
    /// The agent's VirtualMachine does not read: `field` is not what the API allows.
    #[error("{field}: expected {expected}")]
    VirtualMachineField {
        field: &'static str,
        expected: &'static str,
    },
    /// A task the agent cannot run without ended.
    #[error("the {0} stopped")]
    Stopped(Stopped),
}

/// The tasks whose end stops the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    OpenFlowClient,
    VirtualMachineWatch,
    PolicyWatches,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Stopped::OpenFlowClient => "OpenFlow client",
            Stopped::VirtualMachineWatch => "VirtualMachine watch",
            Stopped::PolicyWatches => "policy watches",
        })
    }
}

impl VmAgentError {
    /// Whether running the agent again with the same options may succeed (a supervisor's
    /// restart helps): false when the options or the policy file must change first.
    pub fn retryable(&self) -> bool {
        match self {
            // The file or the object must change first.
            VmAgentError::NoPolicySource
            | VmAgentError::Policies(_)
            | VmAgentError::SavedStateFormat { .. }
            | VmAgentError::SavedStateTooLarge { .. }
            | VmAgentError::VirtualMachineField { .. } => false,
            VmAgentError::Engine(error) => !matches!(error, EngineError::Compile(_)),
            VmAgentError::Watch(error) => error.retryable(),
            VmAgentError::Runtime(_)
            | VmAgentError::AdminBind { .. }
            | VmAgentError::Ovsdb { .. }
            | VmAgentError::SavedStateIo { .. }
            | VmAgentError::Stopped(_) => true,
        }
    }
}

impl From<EngineError> for VmAgentError {
    fn from(error: EngineError) -> Self {
        VmAgentError::Engine(error)
    }
}

impl From<WatchError> for VmAgentError {
    fn from(error: WatchError) -> Self {
        VmAgentError::Watch(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_needs_new_options_is_final() {
        assert!(!VmAgentError::NoPolicySource.retryable());
        assert!(!VmAgentError::Policies(InvalidSources::default()).retryable());
        assert!(VmAgentError::Stopped(Stopped::OpenFlowClient).retryable());
        assert!(VmAgentError::Ovsdb {
            what: "creating the bridge",
            source: OvsdbError::Closed,
        }
        .retryable());
        assert!(!VmAgentError::Watch(WatchError::Config("bad URL".into())).retryable());
        assert!(VmAgentError::Watch(WatchError::Http("reset".into())).retryable());
        let damaged = serde_json::from_slice::<serde_json::Value>(b"{")
            .expect_err("half an object is not JSON");
        assert!(!VmAgentError::SavedStateFormat {
            path: PathBuf::from("enforced.json"),
            source: damaged,
        }
        .retryable());
        assert!(!VmAgentError::VirtualMachineField {
            field: "spec.management",
            expected: "Agented",
        }
        .retryable());
    }

    #[test]
    fn messages_name_what_stopped() {
        let error = VmAgentError::Stopped(Stopped::VirtualMachineWatch);
        assert_eq!(error.to_string(), "the VirtualMachine watch stopped");
    }
}
