//! Kubernetes API gateway: UpstreamCluster model, request info, dispatch policies, flow control,
//! and (later) the monoio HTTP/2 proxy. The modules here are the proxy's pure phases:
//! [`cluster`] (config and compiled snapshot), [`request_info`], [`identity`], [`dispatch`],
//! [`flow_control`], [`fair_share`], [`hop_by_hop`] and [`status`] (the errors the gateway answers itself).

pub mod cluster;
pub mod dispatch;
pub mod fair_share;
pub mod flow_control;
pub mod hop_by_hop;
pub mod identity;
pub mod request_info;
pub mod status;
