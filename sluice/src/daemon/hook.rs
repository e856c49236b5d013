//! What a command adds to a daemon run besides its config. `sluice up`'s demo serves an echo
//! backend, points its agent at the bound listeners and prints how to try it; the daemon calls
//! the hook at two fixed points of its start and drops it after the drain, so the demo's child
//! processes and directory outlive every connection that could use them.

use std::net::SocketAddr;

use sluice_config::Config;
use sluice_runtime::ServerBuilder;

pub trait RunHook {
    /// After the node and gateway are wired and before the agent is: may bind listeners of its
    /// own and point the config at what was bound.
    fn wire(&self, config: &mut Config, server: &mut ServerBuilder) -> anyhow::Result<()>;

    /// Once every listener is bound and the workers serve.
    fn announce(
        &self,
        workers: usize,
        driver: &str,
        addresses: &[(String, SocketAddr)],
    ) -> anyhow::Result<()>;
}
