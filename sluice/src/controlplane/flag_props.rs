//! Property tests of the limit flags' parsers (`--connection-share`, `--watch-share`,
//! `--request-share`: `ROLE=RESERVED/PER_IDENTITY`; `--write-budget`, `--role-write-budget`:
//! `ROLE=WRITES/BURST,BYTES/BURST`). They live in the binary, which the fuzz workspace cannot
//! link, so fuzz/README.md points here: generated flags, and byte mutations of valid ones, go
//! through clap as `main` parses them. proptest is not a dependency of this crate; a seeded
//! xorshift keeps every run the same.
#![allow(clippy::unwrap_used)]

use clap::Parser;
use sluice_apiserver::auth::Role;
use sluice_apiserver::server::ServerLimits;

use super::{LimitArgs, StoreLimitArgs};

#[derive(Debug, Parser)]
struct Flags {
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    store: StoreLimitArgs,
}

fn parse(flag: &str, value: &str) -> Result<Flags, clap::Error> {
    Flags::try_parse_from(["sluice", flag, value])
}

use crate::mutation::Rng;

const ROLES: [Role; 4] = [Role::Admin, Role::Gateway, Role::Node, Role::VmAgent];
const SHARE_FLAGS: [&str; 3] = ["--connection-share", "--watch-share", "--request-share"];
const BUDGET_FLAGS: [&str; 2] = ["--write-budget", "--role-write-budget"];

/// A byte edit of `text`: replace, insert or delete, from an alphabet near the grammar's.
fn mutate(rng: &mut Rng, text: &str) -> String {
    crate::mutation::mutate(rng, text, b"0123456789=/,.-+eE xX_aAn\xc3\xa9\0", 3)
}

fn shares(flags: &Flags) -> Vec<super::limits::ShareArg> {
    let limits = &flags.limits;
    [
        &limits.connection_share,
        &limits.watch_share,
        &limits.request_share,
    ]
    .into_iter()
    .flatten()
    .copied()
    .collect()
}

fn budgets(flags: &Flags) -> Vec<super::store_limits::BudgetArg> {
    let store = &flags.store;
    [&store.write_budget, &store.role_write_budget]
        .into_iter()
        .flatten()
        .copied()
        .collect()
}

#[test]
fn a_share_prints_back_as_the_flag_it_was_parsed_from() {
    let mut rng = Rng(0x5eed_5a4e);
    for _ in 0..2000 {
        let role = ROLES[rng.below(ROLES.len())];
        let (reserved, per_identity) = (rng.next() as usize >> rng.below(64), rng.below(1 << 20));
        let flag = SHARE_FLAGS[rng.below(SHARE_FLAGS.len())];
        let text = format!("{role}={reserved}/{per_identity}");
        let [share] = shares(&parse(flag, &text).unwrap())[..] else {
            panic!("{flag} {text}: not one share")
        };
        assert_eq!(share.role, role);
        assert_eq!(
            (share.share.reserved, share.share.per_identity),
            (reserved, per_identity)
        );
    }
}

#[test]
fn a_budget_prints_back_as_the_flag_it_was_parsed_from() {
    let mut rng = Rng(0x00b0_d6e7);
    for _ in 0..2000 {
        let role = ROLES[rng.below(ROLES.len())];
        // Any finite f64 of either sign: Display prints the shortest text that reads back.
        let mut number = || loop {
            let value = f64::from_bits(rng.next());
            if value.is_finite() {
                return value;
            }
        };
        let values = [number(), number(), number(), number()];
        let flag = BUDGET_FLAGS[rng.below(BUDGET_FLAGS.len())];
        let text = format!(
            "{role}={}/{},{}/{}",
            values[0], values[1], values[2], values[3]
        );
        let [budget] = budgets(&parse(flag, &text).unwrap())[..] else {
            panic!("{flag} {text}: not one budget")
        };
        assert_eq!(budget.role, role);
        let parsed = [
            budget.writes.per_second,
            budget.writes.burst,
            budget.bytes.per_second,
            budget.bytes.burst,
        ];
        assert_eq!(parsed, values, "{text}");
    }
}

/// Mutated flags: refused with a message, or accepted as a value that prints back to itself;
/// a budget `apply` accepts has every rate above 0 and every burst at least 1.
#[test]
fn mutated_flags_are_refused_or_read_back_the_same() {
    let mut rng = Rng(0xf1a6);
    let mut accepted = [0; 2];
    let seeds = [
        "vm-agent=2000/16",
        "node=1000/64",
        "vm-agent=2/20,16384/524288",
        "admin=0.5/1e3,1/1",
    ];
    for round in 0..20_000 {
        let text = mutate(&mut rng, seeds[round % seeds.len()]);
        if text.contains('\0') {
            continue;
        }
        for flag in SHARE_FLAGS {
            let Ok(flags) = parse(flag, &text) else {
                continue;
            };
            accepted[0] += 1;
            for share in shares(&flags) {
                let printed = format!(
                    "{}={}/{}",
                    share.role, share.share.reserved, share.share.per_identity
                );
                assert_eq!(shares(&parse(flag, &printed).unwrap()), [share], "{text:?}");
            }
        }
        for flag in BUDGET_FLAGS {
            let Ok(flags) = parse(flag, &text) else {
                continue;
            };
            accepted[1] += 1;
            for budget in budgets(&flags) {
                let (w, b) = (budget.writes, budget.bytes);
                let printed = format!(
                    "{}={}/{},{}/{}",
                    budget.role, w.per_second, w.burst, b.per_second, b.burst
                );
                assert_eq!(
                    budgets(&parse(flag, &printed).unwrap()),
                    [budget],
                    "{text:?}"
                );
                if flags.store.apply(&mut ServerLimits::default()).is_ok() {
                    for rate in [w, b] {
                        assert!(
                            rate.per_second > 0.0 && rate.burst >= 1.0,
                            "{text:?} accepted"
                        );
                    }
                }
            }
        }
    }
    // Most mutations keep a flag readable, so the read-back is checked thousands of times.
    assert!(
        accepted.iter().all(|&count| count > 1000),
        "accepted {accepted:?}"
    );
}
