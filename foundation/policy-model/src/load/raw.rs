//! The document as written by people: lenient types (strings, wide integers) so that validation,
//! not deserialization, reports most mistakes, and reports all of them at once.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawDocument {
    #[serde(default)]
    pub address_groups: Vec<RawAddressGroup>,
    #[serde(default)]
    pub applied_to_groups: Vec<RawAppliedToGroup>,
    #[serde(default)]
    pub policies: Vec<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawAddressGroup {
    pub name: String,
    #[serde(default)]
    pub members: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawAppliedToGroup {
    pub name: String,
    #[serde(default)]
    pub members: Vec<RawVmInterface>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawVmInterface {
    pub name: String,
    /// Omitted: the agent looks the port up by `name` on its bridge (a VM's internal port,
    /// whose number only the VM's own switch knows).
    pub ofport: Option<i64>,
    #[serde(default)]
    pub ips: Vec<String>,
    pub mac: Option<String>,
    /// The VM (named as its vm-agent's identity) whose bridge the interface is attached to: the
    /// control plane sends a group to the VMs its members are on. Not part of the compiled
    /// model: an agent enforces every interface it is given.
    pub vm: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawPolicy {
    pub name: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub applied_to: Vec<String>,
    pub policy_types: Option<Vec<String>>,
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawRule {
    pub name: Option<String>,
    pub direction: String,
    pub action: String,
    #[serde(default)]
    pub peers: RawPeers,
    #[serde(default)]
    pub services: Vec<RawService>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawPeers {
    #[serde(default)]
    pub address_groups: Vec<String>,
    #[serde(default)]
    pub ip_blocks: Vec<RawIpBlock>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawIpBlock {
    pub cidr: String,
    #[serde(default)]
    pub except: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawService {
    pub protocol: String,
    pub port: Option<i64>,
    pub end_port: Option<i64>,
    pub icmp_type: Option<i64>,
    pub icmp_code: Option<i64>,
}
