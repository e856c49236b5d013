//! Panics the API server contains: a connection's task, a watch's body, a VM agent's span
//! watch or the Events' writer that panics ends; the server goes on. Each is logged at error
//! level and counted in `sluice_task_panics_total{task}` on the control plane's `/metrics`,
//! the family (and so the alert, `SluiceTaskPanics`) the data plane counts its own in.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::LazyLock;

use futures_util::FutureExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What panicked: the `task` label, a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Task {
    Connection,
    Watch,
    SpanWatch,
    Events,
}

impl Task {
    const ALL: [Task; 4] = [Task::Connection, Task::Watch, Task::SpanWatch, Task::Events];

    fn label(self) -> &'static str {
        match self {
            Task::Connection => "controlplane-connection",
            Task::Watch => "controlplane-watch",
            Task::SpanWatch => "controlplane-span-watch",
            Task::Events => "controlplane-events",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

/// Process-wide: a watch's body is made where no server state is at hand (`reply::render`).
static PANICS: LazyLock<Family<TaskLabels, Counter>> = LazyLock::new(|| {
    let family = Family::default();
    // Every task shows from the start at 0, so `increase()` sees the first panic.
    for task in Task::ALL {
        drop(family.get_or_create(&TaskLabels { task: task.label() }));
    }
    family
});

pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        "sluice_task_panics",
        "Tasks that panicked and were ended while the process went on, by task",
        PANICS.clone(),
    );
}

/// Counts and logs a panic of `task`.
pub(crate) fn record(task: Task, message: &str) {
    PANICS
        .get_or_create(&TaskLabels { task: task.label() })
        .inc();
    tracing::error!(
        task = task.label(),
        panic = message,
        "task panicked; it was ended, the server goes on"
    );
}

/// Panics of `task` counted so far (tests).
#[cfg(test)]
pub(crate) fn count(task: Task) -> u64 {
    PANICS
        .get_or_create(&TaskLabels { task: task.label() })
        .get()
}

/// `future`, with a panic caught, counted and logged (`None` then).
pub(crate) fn contained<F: Future>(
    task: Task,
    future: F,
) -> impl Future<Output = Option<F::Output>> {
    AssertUnwindSafe(future)
        .catch_unwind()
        .map(move |outcome| match outcome {
            Ok(output) => Some(output),
            Err(payload) => {
                record(task, message_of(payload.as_ref()));
                None
            }
        })
}

/// The text a panic carried, if any.
pub(crate) fn message_of(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn a_contained_panic_is_counted_and_ends_only_its_task() {
        let before = count(Task::Events);
        let ended = tokio::spawn(contained(Task::Events, async { panic!("planted") }))
            .await
            .unwrap();
        assert_eq!(ended, None::<()>);
        assert_eq!(count(Task::Events), before + 1);
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // Every task's series shows, panicked or not (other tests count panics meanwhile).
        for task in Task::ALL {
            let series = format!("sluice_task_panics_total{{task=\"{}\"}} ", task.label());
            assert!(text.contains(&series), "{text}");
        }
        assert_eq!(
            contained(Task::Events, async { 7 }).await,
            Some(7),
            "a task that does not panic gives its output"
        );
    }
}
