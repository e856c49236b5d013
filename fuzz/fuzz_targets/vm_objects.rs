//! What VM agents send and the VMManager reads: a `VirtualMachine` or
//! `VirtualMachineRuntimeInfo` body checked by its kind's validation, the VMManager's pure
//! state and status building over it (as the VM and as its runtime info), and the policy span
//! index built from it. Hostile objects are field errors or ignored, never a panic.
#![no_main]
use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_apiserver::kinds::{self, PolicyResource, SpanIndex};
use sluice_vm_manager::state::{heartbeat, vm_status, VmInputs};

fuzz_target!(|data: &[u8]| {
    let Ok(object) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = (kinds::virtual_machine().validate)(&object);
    let _ = (kinds::runtime_info().validate)(&object);
    let _ = kinds::receives_policies(Some(&object));
    let inputs = VmInputs {
        vm: &object,
        runtime_info: Some(&object),
        seen: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
        // Within the timeout of `now`: the restart grace's path is taken for Connected VMs.
        listed: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_050),
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_090),
        timeout: Duration::from_secs(90),
    };
    let _ = heartbeat(&inputs);
    let _ = vm_status(&inputs);
    let index = SpanIndex::new([&object], [&object]);
    for resource in [
        PolicyResource::NetworkPolicy,
        PolicyResource::AddressGroup,
        PolicyResource::AppliedToGroup,
    ] {
        let _ = index.in_span(resource, &object, "vm1");
        let _ = index.span(resource, &object);
    }
});
