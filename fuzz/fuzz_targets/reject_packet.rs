//! The packets a VM sends into a Reject rule: `sluice_policy_engine::reject::build_reject_reply`.
//! A reply is never itself answered (it is a TCP RST or an ICMP error), and it is addressed back
//! to the sender's MAC.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice_policy_engine::reject::build_reject_reply;

fuzz_target!(|data: &[u8]| {
    let Some((_, reply)) = build_reject_reply(data) else {
        return;
    };
    assert_eq!(&reply[0..6], &data[6..12]);
    assert_eq!(&reply[6..12], &data[0..6]);
    assert!(
        build_reject_reply(&reply).is_none(),
        "a reject reply would be answered"
    );
});
