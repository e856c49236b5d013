//! Priority space, rule numbers, cookies and Reject tags.
//!
//! Every rule gets a *rule number* from its policy's priority and its position:
//! `rule_number = policy_priority * MAX_RULES_PER_POLICY + rule_index + 1` (1..=64,000). It is
//! the conjunction id, sits in the low 32 bits of the cookie of every flow the rule produces, and
//! fixes the rule's OpenFlow priority: `RULE_PRIORITY_TOP - (rule_number - 1)`, i.e. 65,000 for
//! the first rule of priority-0 policy down to 1,001 for rule 64 of priority-999 policy. Lower
//! policy priority numbers and earlier rules therefore win, and the default drops (priority
//! [`DEFAULT_DROP_PRIORITY`]) stay below every rule.
//!
//! Unlike Antrea's priority assigner, which packs priorities and reshuffles them on demand, the
//! mapping is a pure function of the policy itself. That costs range (at most 1,000 policy
//! priorities of 64 rules each, checked with an error) but means adding or deleting one policy
//! never renumbers another, so the incremental diff stays minimal and equals a full recompile.
//! Rules of one policy never share an OpenFlow priority, so conjunction clause flows of different
//! rules never need merging.
//!
//! Cookie layout (64 bits): `round << 48 | kind << 40 | rule_number`. `round` is the agent run
//! (all flows of a run share it, so a restarted agent can delete the previous run's flows by
//! cookie mask after installing its own); `kind` tells pipeline, rule, default-drop and
//! control-traffic flows apart. Modifying a flow never changes its cookie because the cookie
//! is determined by the same rule number as the priority.

use crate::model::Direction;

pub use sluice_policy_model::limits::{MAX_POLICY_PRIORITY, MAX_RULES_PER_POLICY};
/// OpenFlow priority of rule number 1.
pub const RULE_PRIORITY_TOP: u16 = 65_000;
/// Lowest OpenFlow priority a rule can get.
pub const RULE_PRIORITY_BOTTOM: u16 =
    RULE_PRIORITY_TOP - (MAX_POLICY_PRIORITY + 1) * MAX_RULES_PER_POLICY + 1;
/// Per-interface default drops, below every rule.
pub const DEFAULT_DROP_PRIORITY: u16 = 100;
// Default drops must stay below every rule.
const _: () = assert!(RULE_PRIORITY_BOTTOM > DEFAULT_DROP_PRIORITY);

/// What a flow is for, stored in cookie bits 40..48.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CookieKind {
    Pipeline = 1,
    Rule = 2,
    DefaultDrop = 3,
    ControlTraffic = 4,
}

impl CookieKind {
    fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            1 => CookieKind::Pipeline,
            2 => CookieKind::Rule,
            3 => CookieKind::DefaultDrop,
            4 => CookieKind::ControlTraffic,
            _ => return None,
        })
    }
}

/// Mask selecting the round bits of a cookie, for "delete every flow of round N" requests.
pub const COOKIE_ROUND_MASK: u64 = 0xffff << 48;

pub fn cookie(round: u16, kind: CookieKind, rule_number: u32) -> u64 {
    u64::from(round) << 48 | (kind as u64) << 40 | u64::from(rule_number)
}

/// A cookie taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieParts {
    pub round: u16,
    pub kind: CookieKind,
    /// 0 for flows that belong to no rule.
    pub rule_number: u32,
}

pub fn parse_cookie(cookie: u64) -> Option<CookieParts> {
    let kind = CookieKind::from_bits(((cookie >> 40) & 0xff) as u8)?;
    Some(CookieParts {
        round: (cookie >> 48) as u16,
        kind,
        rule_number: (cookie & 0xffff_ffff) as u32,
    })
}

/// The rule number of rule `rule_index` of a policy, or `None` if out of the documented space.
pub fn rule_number(policy_priority: u16, rule_index: usize) -> Option<u32> {
    let index = u16::try_from(rule_index).ok()?;
    if policy_priority > MAX_POLICY_PRIORITY || index >= MAX_RULES_PER_POLICY {
        return None;
    }
    Some(u32::from(policy_priority) * u32::from(MAX_RULES_PER_POLICY) + u32::from(index) + 1)
}

/// Inverse of [`rule_number`]: (policy priority, rule index).
pub fn rule_position(rule_number: u32) -> Option<(u16, usize)> {
    let zero_based = rule_number.checked_sub(1)?;
    let per_policy = u32::from(MAX_RULES_PER_POLICY);
    let policy_priority = u16::try_from(zero_based / per_policy).ok()?;
    if policy_priority > MAX_POLICY_PRIORITY {
        return None;
    }
    Some((policy_priority, (zero_based % per_policy) as usize))
}

/// OpenFlow priority of a rule's flows. `rule_number` must come from [`rule_number`].
pub fn rule_flow_priority(rule_number: u32) -> u16 {
    let offset = u16::try_from(rule_number.saturating_sub(1)).unwrap_or(u16::MAX);
    RULE_PRIORITY_TOP
        .saturating_sub(offset)
        .max(RULE_PRIORITY_BOTTOM)
}

/// The `userdata` of a Reject rule's controller action: which rule rejected the packet, so the
/// agent can answer it (TCP RST / ICMP unreachable) and count it.
/// Encoding: `[1 (format), direction (0 ingress, 1 egress), rule_number as u32 big-endian]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectTag {
    pub direction: Direction,
    pub rule_number: u32,
}

impl RejectTag {
    const FORMAT: u8 = 1;

    pub fn encode(&self) -> Vec<u8> {
        let direction = match self.direction {
            Direction::Ingress => 0,
            Direction::Egress => 1,
        };
        let mut bytes = vec![Self::FORMAT, direction];
        bytes.extend_from_slice(&self.rule_number.to_be_bytes());
        bytes
    }

    /// `None` for anything this version did not encode (packet-ins come from the network).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let [format, direction, a, b, c, d] = *bytes else {
            return None;
        };
        if format != Self::FORMAT {
            return None;
        }
        let direction = match direction {
            0 => Direction::Ingress,
            1 => Direction::Egress,
            _ => return None,
        };
        Some(Self {
            direction,
            rule_number: u32::from_be_bytes([a, b, c, d]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn priority_space_bounds() {
        assert_eq!(rule_number(0, 0), Some(1));
        assert_eq!(rule_flow_priority(1), RULE_PRIORITY_TOP);
        let last = rule_number(MAX_POLICY_PRIORITY, 63).expect("in range");
        assert_eq!(last, 64_000);
        assert_eq!(rule_flow_priority(last), 1_001);
        assert_eq!(RULE_PRIORITY_BOTTOM, 1_001);
        assert_eq!(rule_number(MAX_POLICY_PRIORITY + 1, 0), None);
        assert_eq!(rule_number(0, 64), None);
    }

    #[test]
    fn earlier_rules_and_lower_policy_numbers_win() {
        let p0r0 = rule_flow_priority(rule_number(0, 0).expect("n"));
        let p0r1 = rule_flow_priority(rule_number(0, 1).expect("n"));
        let p1r0 = rule_flow_priority(rule_number(1, 0).expect("n"));
        assert!(p0r0 > p0r1 && p0r1 > p1r0);
    }

    proptest! {
        #[test]
        fn rule_numbers_round_trip(priority in 0..=MAX_POLICY_PRIORITY, index in 0..usize::from(MAX_RULES_PER_POLICY), round: u16) {
            let number = rule_number(priority, index).expect("in range");
            prop_assert_eq!(rule_position(number), Some((priority, index)));
            let parts = parse_cookie(cookie(round, CookieKind::Rule, number)).expect("cookie");
            prop_assert_eq!(parts, CookieParts { round, kind: CookieKind::Rule, rule_number: number });
            let tag = RejectTag { direction: Direction::Egress, rule_number: number };
            prop_assert_eq!(RejectTag::decode(&tag.encode()), Some(tag));
        }

        #[test]
        fn reject_tag_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            let _ = RejectTag::decode(&bytes);
        }
    }
}
