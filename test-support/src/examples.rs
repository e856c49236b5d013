//! Example objects shared by the tests of the crates that read them.

/// An `UpstreamCluster` using every field: three servers (one disabled), client and serving
/// TLS files relative to its file, three flow-control schemas, two dispatch policies, a fast
/// health check and anonymous access.
pub const UPSTREAM_CLUSTER: &str = r#"
apiVersion: proxy.sluice.dev/v1alpha1
kind: UpstreamCluster
metadata:
  name: cluster-a.example.com
spec:
  servers:
  - endpoint: https://10.0.0.1:6443
  - endpoint: https://10.0.0.2:6443
  - endpoint: https://10.0.0.3:6443
    disabled: true
  clientConfig:
    certFile: gateway.pem
    keyFile: gateway-key.pem
    caFile: /etc/ca.pem
  secureServing:
    certFile: serving.pem
    keyFile: serving-key.pem
    clientCAFile: client-ca.pem
    extraHostnames: [a.internal, 127.0.0.1]
  flowControl:
    schemas:
    - name: exempt
      exempt: {}
    - name: two
      maxRequestsInflight: {max: 2}
    - name: bucket
      tokenBucket: {qps: 10, burst: 5}
  dispatchPolicies:
  - name: reads
    upsteamSubset: [https://10.0.0.2:6443]
    flowControlSchemaName: bucket
    rules:
    - verbs: [get, list, watch]
      apiGroups: ["*"]
      resources: ["*"]
  - strategy: RoundRobin
    rules:
    - verbs: ["*"]
      apiGroups: ["*"]
      resources: ["*"]
    - verbs: [get]
      nonResourceURLs: ["/healthz", "/healthz/*", "/version"]
  healthCheck:
    interval: 250ms
  authentication:
    allowAnonymous: true
    tokenReviewFailureTTL: 5s
"#;
