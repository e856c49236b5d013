//! The overload state machine: pressure in, action transitions out. No I/O, so every threshold
//! and the hysteresis are tested without a process under load.

use sluice_config::OverloadConfig;

use crate::Action;

/// One action turning on (`active`) or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub action: Action,
    pub active: bool,
}

/// Which actions are active, given the pressure samples seen so far.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Pressure (0..=1) at or above which each action turns on, by [`Action::index`].
    thresholds: [f64; 2],
    /// An active action turns off only below its threshold minus this, so a process hovering at
    /// a threshold does not flip its listeners on and off every sample.
    margin: f64,
    active: [bool; 2],
}

impl Machine {
    pub fn new(config: &OverloadConfig) -> Self {
        let ratio = |percent: u8| f64::from(percent) / 100.0;
        Self {
            thresholds: [
                ratio(config.stop_accepting_percent),
                ratio(config.shed_new_requests_percent),
            ],
            margin: ratio(config.recover_margin_percent),
            active: [false; 2],
        }
    }

    pub fn is_active(&self, action: Action) -> bool {
        self.active[action.index()]
    }

    /// Feeds one sample's pressure (the highest of the resources' used/limit ratios); returns
    /// the transitions it caused, by action.
    pub fn observe(&mut self, pressure: f64) -> [Option<Transition>; 2] {
        let mut changes = [None; 2];
        for action in Action::ALL {
            let index = action.index();
            let threshold = self.thresholds[index];
            let next = if self.active[index] {
                pressure >= threshold - self.margin
            } else {
                pressure >= threshold
            };
            if next != self.active[index] {
                self.active[index] = next;
                changes[index] = Some(Transition {
                    action,
                    active: next,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(stop: u8, shed: u8, margin: u8) -> Machine {
        Machine::new(&OverloadConfig {
            stop_accepting_percent: stop,
            shed_new_requests_percent: shed,
            recover_margin_percent: margin,
            ..OverloadConfig::default()
        })
    }

    fn turned(changes: [Option<Transition>; 2]) -> Vec<(Action, bool)> {
        changes
            .into_iter()
            .flatten()
            .map(|change| (change.action, change.active))
            .collect()
    }

    #[test]
    fn each_action_turns_on_at_its_own_threshold() {
        let mut machine = machine(95, 98, 5);
        assert!(turned(machine.observe(0.5)).is_empty());
        assert!(turned(machine.observe(0.949)).is_empty());
        assert_eq!(
            turned(machine.observe(0.95)),
            [(Action::StopAccepting, true)]
        );
        assert!(!machine.is_active(Action::ShedNewRequests));
        assert_eq!(
            turned(machine.observe(0.98)),
            [(Action::ShedNewRequests, true)]
        );
        assert!(turned(machine.observe(0.99)).is_empty(), "no repeat");
    }

    #[test]
    fn a_jump_past_both_thresholds_turns_both_on_at_once() {
        let mut machine = machine(95, 98, 5);
        assert_eq!(
            turned(machine.observe(1.2)),
            [
                (Action::StopAccepting, true),
                (Action::ShedNewRequests, true)
            ]
        );
    }

    #[test]
    fn an_action_turns_off_only_below_its_threshold_minus_the_margin() {
        let mut machine = machine(95, 98, 5);
        machine.observe(0.99);
        // Between threshold - margin and threshold: both stay on (no flapping at the edge).
        assert!(turned(machine.observe(0.94)).is_empty());
        assert!(machine.is_active(Action::StopAccepting));
        assert!(machine.is_active(Action::ShedNewRequests));
        assert_eq!(
            turned(machine.observe(0.929)),
            [(Action::ShedNewRequests, false)]
        );
        assert!(turned(machine.observe(0.90)).is_empty());
        assert_eq!(
            turned(machine.observe(0.899)),
            [(Action::StopAccepting, false)]
        );
        // And back on only at the threshold itself.
        assert!(turned(machine.observe(0.94)).is_empty());
        assert_eq!(
            turned(machine.observe(0.96)),
            [(Action::StopAccepting, true)]
        );
    }

    #[test]
    fn pressure_hovering_at_a_threshold_makes_one_transition() {
        let mut machine = machine(95, 98, 5);
        let mut transitions = 0;
        for step in 0..1000 {
            let wobble = if step % 2 == 0 { 0.951 } else { 0.949 };
            transitions += turned(machine.observe(wobble)).len();
        }
        assert_eq!(transitions, 1);
    }

    #[test]
    fn thresholds_in_any_order_are_independent() {
        // Shedding first, then refusing connections: each action only follows its own line.
        let mut machine = machine(80, 60, 10);
        assert_eq!(
            turned(machine.observe(0.6)),
            [(Action::ShedNewRequests, true)]
        );
        assert_eq!(
            turned(machine.observe(0.8)),
            [(Action::StopAccepting, true)]
        );
        assert_eq!(
            turned(machine.observe(0.45)),
            [
                (Action::StopAccepting, false),
                (Action::ShedNewRequests, false)
            ]
        );
    }
}
