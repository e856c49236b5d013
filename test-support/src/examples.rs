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

/// A `policy.sluice.dev/v1alpha1` `NetworkPolicy` (the `web` policy of the VM agent's
/// `three-vms.yaml` fixture as an object): namespaced source, two ordered rules, peers from an
/// address group and an IP block, port and ICMP services.
pub const NETWORK_POLICY: &str = r#"
apiVersion: policy.sluice.dev/v1alpha1
kind: NetworkPolicy
metadata:
  name: web
spec:
  namespace: default
  priority: 10
  appliedTo: [web-vms]
  rules:
    - name: http-from-clients
      direction: Ingress
      action: Allow
      peers:
        addressGroups: [web-clients]
        ipBlocks: [{cidr: 10.2.0.0/16, except: [10.2.3.0/24]}]
      services: [{protocol: TCP, port: 80, endPort: 90}]
    - name: refuse-ping
      direction: Ingress
      action: Reject
      services: [{protocol: ICMP, icmpType: 8}]
"#;

/// A `policy.sluice.dev/v1alpha1` `AddressGroup`: the peers `NETWORK_POLICY` allows.
pub const ADDRESS_GROUP: &str = r#"
apiVersion: policy.sluice.dev/v1alpha1
kind: AddressGroup
metadata:
  name: web-clients
spec:
  members: [10.0.0.2, 10.0.1.0/24, "fd00::2"]
"#;

/// A `policy.sluice.dev/v1alpha1` `AppliedToGroup`: two interfaces on two VMs (each with its
/// own bridge, so both may use OpenFlow port 1); `NETWORK_POLICY` applies to it.
pub const APPLIED_TO_GROUP: &str = r#"
apiVersion: policy.sluice.dev/v1alpha1
kind: AppliedToGroup
metadata:
  name: web-vms
spec:
  members:
    - {name: vm1-eth0, vm: vm1, ofport: 1, ips: [10.0.0.1, "fd00::1"], mac: "02:00:0a:00:00:01"}
    - {name: vm4-eth0, vm: vm4, ofport: 1, ips: [10.0.0.4]}
"#;
