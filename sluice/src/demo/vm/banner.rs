//! The VM pillar's part of `sluice up`'s banner: how to see enforcement, or why it did not
//! start and the flows it would install.

use std::fmt::Write;
use std::path::Path;

use super::policy::{FALLBACK_OFPORT, POLICY};
use super::{VmDemo, VmPillar};

impl VmPillar {
    /// The banner's VM paragraph; `kubeconfig` is the control plane's admin kubeconfig.
    pub fn describe(&self, kubeconfig: &Path) -> String {
        match self {
            VmPillar::Running(demo) => demo.describe(kubeconfig),
            VmPillar::NotStarted {
                reason,
                vm1_ip,
                vm2_ip,
                flows,
            } => {
                let mut text = format!("VM policy demo: not started ({reason})\n");
                match flows {
                    Ok(flows) => {
                        let _ = writeln!(
                            text,
                            "  Its policy {POLICY:?} (vm1 {vm1_ip} on OpenFlow port {FALLBACK_OFPORT}: allow ICMP from vm2 {vm2_ip}, drop every other ingress)\n  compiles to these flows, as `sluice policy compile` prints them:"
                        );
                        for flow in flows.lines() {
                            let _ = writeln!(text, "    {flow}");
                        }
                    }
                    Err(error) => {
                        let _ = writeln!(text, "  (its policy did not compile: {error})");
                    }
                }
                text
            }
        }
    }
}

impl VmDemo {
    fn describe(&self, kubeconfig: &Path) -> String {
        let kubectl = format!("kubectl --kubeconfig {}", kubeconfig.display());
        let (vm1, vm2, vm1_ip, vm2_ip) = (&self.vm1, &self.vm2, self.vm1_ip, self.vm2_ip);
        let in_vm2 = format!("ip netns exec {vm2}");
        let probe = format!("{in_vm2} nc -zv -w 2 {vm1_ip} 22");
        format!(
            "VM policy demo: two network namespaces as VMs, joined by a veth pair; vm1's agent enforces\n\
             NetworkPolicy {POLICY:?} on vm1's Open vSwitch (userspace): allow ICMP from vm2, drop every other ingress.\n\
             \x20 vm1  {vm1_ip:<15} namespace {vm1}  Agented: `sluice vm-agent` took eth0 over (eth0~ on bridge br-vm)\n\
             \x20 vm2  {vm2_ip:<15} namespace {vm2}  Agentless: the peer\n\
             \x20 {kubectl} get vm      # vm1 AgentedConnected (within seconds), vm2 Agentless\n\
             \x20 {kubectl} get vmnp    # {POLICY}: Realized 1, Desired 1\n\
             \x20 {in_vm2} ping -c 3 {vm1_ip}    # allowed: ICMP from vm2\n\
             \x20 {probe}    # times out: dropped by the policy\n\
             \x20 {kubectl} delete vmnp {POLICY}\n\
             \x20 {probe}    # now refused at once: nothing listens, nothing drops\n\
             \x20 (the agent reaches the control plane at 127.0.0.1:6443 inside vm1, forwarded to the host;\n\
             \x20 its log: {})\n",
            self.agent_log.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn the_fallback_says_what_is_missing_in_one_line_then_prints_the_flows() {
        let pillar =
            VmPillar::not_started("needs root and Open vSwitch; missing: ovs-vswitchd".into());
        let text = pillar.describe(Path::new("/tmp/x/admin.kubeconfig"));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "VM policy demo: not started (needs root and Open vSwitch; missing: ovs-vswitchd)"
            )
        );
        let VmPillar::NotStarted {
            flows: Ok(flows),
            vm2_ip,
            ..
        } = &pillar
        else {
            panic!("the demo policy compiles: {pillar:?}");
        };
        assert!(flows.lines().count() > 3, "{flows}");
        for flow in flows.lines() {
            assert!(
                text.contains(&format!("    {flow}\n")),
                "{flow} missing from\n{text}"
            );
        }
        assert!(flows.contains(&format!("nw_src={vm2_ip}")), "{flows}");
        assert!(
            !text.contains("kubectl"),
            "nothing to try without the demo: {text}"
        );
    }

    #[test]
    fn the_running_demo_prints_the_commands_that_show_enforcement() {
        let pillar = VmPillar::Running(Box::new(VmDemo {
            vm1: "sluice-up-vm1-7".into(),
            vm2: "sluice-up-vm2-7".into(),
            vm1_ip: Ipv4Addr::new(10, 64, 7, 11),
            vm2_ip: Ipv4Addr::new(10, 64, 7, 12),
            agent_log: "/tmp/sluice-up-7/vm/vm-agent.log".into(),
            parts: super::super::Parts {
                dir: "/nonexistent/sluice-up-test".into(),
                agent: None,
                forwarder: None,
                ovs: None,
                vms: None,
            },
        }));
        let text = pillar.describe(Path::new("/k"));
        for expected in [
            "kubectl --kubeconfig /k get vm ",
            "kubectl --kubeconfig /k get vmnp ",
            "ip netns exec sluice-up-vm2-7 ping -c 3 10.64.7.11 ",
            "ip netns exec sluice-up-vm2-7 nc -zv -w 2 10.64.7.11 22 ",
            "kubectl --kubeconfig /k delete vmnp demo\n",
            "/tmp/sluice-up-7/vm/vm-agent.log",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }
    }
}
