//! The `name=value` sizes, comma-separated, that a scale part takes from its environment
//! variable (`SLUICE_PERF_FANOUT`, `SLUICE_PERF_VMS`) for runs smaller than the plan.

use anyhow::{bail, Context};

/// `plan`, or `apply(plan, spec)` when `variable` is set, its errors naming the variable.
pub fn from_env<P>(
    variable: &str,
    plan: P,
    apply: impl FnOnce(P, &str) -> anyhow::Result<P>,
) -> anyhow::Result<P> {
    match std::env::var(variable) {
        Ok(spec) => apply(plan, &spec).with_context(|| format!("{variable}={spec:?}")),
        Err(_) => Ok(plan),
    }
}

/// The (name, value) pairs of `spec`.
pub fn pairs(spec: &str) -> impl Iterator<Item = anyhow::Result<(&str, &str)>> {
    spec.split(',').filter(|pair| !pair.is_empty()).map(|pair| {
        pair.split_once('=')
            .with_context(|| format!("{pair:?} is not name=value"))
    })
}

/// `value` as a count above zero.
pub fn positive_count(name: &str, value: &str) -> anyhow::Result<usize> {
    match value.parse::<usize>() {
        Ok(count) if count > 0 => Ok(count),
        _ => bail!("{name} must be a positive count, not {value:?}"),
    }
}
