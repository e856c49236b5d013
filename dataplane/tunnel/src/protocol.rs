//! What the node and the agent agree on: the tunnel's gRPC paths and metadata names.

/// The agent's bidirectional stream that becomes a tunnel.
pub const CONNECT_PATH: &str = "/sluice.tunnel.v1.ReverseTunnel/Connect";
/// The method a node answers itself instead of relaying.
pub const LIST_AGENTS_PATH: &str = "/sluice.agents.v1.Agents/ListConnectedAgents";
/// The service carrying HTTP exchanges to an agent's Kubernetes API forwarder
/// (`sluice.kubernetes.v1.KubernetesApi`): only a node's gateway may call it (in process, or on
/// the private endpoint with the node's credential), never a client of the external endpoint.
pub const KUBERNETES_API_SERVICE: &str = "/sluice.kubernetes.v1.KubernetesApi/";
/// Metadata naming the agent a call is for.
pub const AGENT_ID_HEADER: &str = "sluice-agent-id";
/// Metadata an agent sends when it connects.
pub const CONNECTION_ID_HEADER: &str = "sluice-agent-connection-id";
pub const AGENT_VERSION_HEADER: &str = "sluice-agent-version";
/// The call's deadline, relayed as metadata to the agent's backend.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
