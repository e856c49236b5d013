//! Kubernetes API gateway: UpstreamCluster model, request info, dispatch policies, flow control, and the monoio HTTP/2 proxy.
