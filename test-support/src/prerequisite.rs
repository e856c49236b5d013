//! The one place that decides what a test does when something it needs is missing here (a
//! program, root, a kernel feature). In CI (`CI` set and not empty, as `scripts/test.sh` reads
//! it) a missing prerequisite fails the test with a message naming it and how CI provides it:
//! a test that passes without running proves nothing, and CI's machine is the one that must run
//! everything. Elsewhere (a developer's laptop) the test may skip, but only loudly.

use std::process::{Command, Stdio};

/// `true` when `present`. Otherwise, in CI, panics naming `what` is missing and `provided_by`
/// (how `scripts/test.sh` or CI's machine provides it); outside CI, prints a loud reason on
/// stderr and returns `false`, so the test returns at once. The test is named after the calling
/// thread (libtest names each test's thread after the test).
#[must_use = "the test must return when its prerequisite is missing"]
pub fn prerequisite(what: &str, present: bool, provided_by: &str) -> bool {
    let thread = std::thread::current();
    prerequisite_of(
        thread.name().unwrap_or("this test"),
        what,
        present,
        provided_by,
    )
}

/// [`prerequisite`] for a test named by the caller (a case run on another thread).
pub(crate) fn prerequisite_of(test: &str, what: &str, present: bool, provided_by: &str) -> bool {
    match decide(in_ci(), test, what, present, provided_by) {
        Decision::Run => true,
        Decision::Skip(reason) => {
            eprintln!("\n!!! {reason} !!!\n");
            false
        }
        Decision::Fail(reason) => panic!("{reason}"),
    }
}

/// Whether `program` runs (found on PATH and executable).
pub fn program_on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether this test process runs as root (network namespaces, packages, eBPF need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What `provided_by` says about root, for tests that need it: CI runs the suite as root.
pub const ROOT_IN_CI: &str = "CI runs scripts/test.sh as root; run the test as root here";

/// Whether this is a CI run: `CI` set and not empty, as `scripts/test.sh` reads it.
fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| !value.is_empty())
}

#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Run,
    Skip(String),
    Fail(String),
}

fn decide(ci: bool, test: &str, what: &str, present: bool, provided_by: &str) -> Decision {
    if present {
        Decision::Run
    } else if ci {
        Decision::Fail(format!(
            "{test}: {what} is missing, and CI is set, where every test must run: {provided_by}"
        ))
    } else {
        Decision::Skip(format!(
            "SKIPPED {test}: {what} is missing ({provided_by}); this test did NOT run"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_prerequisite_fails_in_ci_naming_it_and_how_ci_provides_it() {
        let decision = decide(
            true,
            "t",
            "etcd",
            false,
            "scripts/test.sh installs etcd-server",
        );
        assert_eq!(
            decision,
            Decision::Fail(
                "t: etcd is missing, and CI is set, where every test must run: \
                 scripts/test.sh installs etcd-server"
                    .into()
            )
        );
    }

    #[test]
    fn outside_ci_a_missing_prerequisite_skips_loudly() {
        let Decision::Skip(reason) = decide(false, "t", "root", false, ROOT_IN_CI) else {
            panic!("not a skip");
        };
        assert!(reason.starts_with("SKIPPED t: root is missing"), "{reason}");
        assert!(reason.contains("did NOT run"), "{reason}");
    }

    #[test]
    fn a_present_prerequisite_runs_the_test_in_and_out_of_ci() {
        assert_eq!(decide(true, "t", "etcd", true, "-"), Decision::Run);
        assert_eq!(decide(false, "t", "etcd", true, "-"), Decision::Run);
    }

    #[test]
    fn programs_are_looked_up_on_path() {
        assert!(program_on_path("sh"));
        assert!(!program_on_path("sluice-no-such-program-here"));
    }

    #[test]
    #[should_panic(expected = "sluice-no-such-program-here is missing")]
    fn the_helper_itself_fails_or_skips_by_the_environment() {
        // Whatever CI says, a missing prerequisite never lets the body run: fail in CI, and
        // outside CI the returned `false` is turned into the panic this test expects.
        let present = program_on_path("sluice-no-such-program-here");
        if !prerequisite(
            "sluice-no-such-program-here",
            present,
            "nothing provides it",
        ) {
            panic!("sluice-no-such-program-here is missing (skipped)");
        }
    }
}
