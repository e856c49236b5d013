use sluice_config::{LogFormat, LoggingConfig};
use tracing_subscriber::fmt::format;
use tracing_subscriber::EnvFilter;

mod lines;

use lines::{stderr_is_journal, Journald, JsonLines};

/// Changes the log filter of the running process (`logging.level` on a config reload).
pub struct LogFilterHandle {
    set: Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>,
    /// `RUST_LOG` was set at start: it keeps overriding `logging.level`.
    overridden: bool,
}

impl LogFilterHandle {
    /// Applies `level` (a `tracing` filter directive, validated with the config). `Ok(false)`:
    /// not applied because `RUST_LOG` overrides the config.
    pub fn set(&self, level: &str) -> Result<bool, String> {
        if self.overridden {
            return Ok(false);
        }
        let filter = EnvFilter::try_new(level).map_err(|error| error.to_string())?;
        (self.set)(filter).map(|()| true)
    }
}

/// Structured logs on stderr. `RUST_LOG`, when set, overrides `logging.level`. Returns the
/// handle that changes the filter later (`None` if logging was set up already).
pub fn init(config: &LoggingConfig) -> Option<LogFilterHandle> {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| EnvFilter::try_new(directives).ok());
    let overridden = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(&config.level));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // A reloadable filter costs a read lock only where an event passes the cached per-callsite
    // interest; the data plane's hot paths log nothing at the default levels.
    let result = match config.format {
        LogFormat::Text => {
            let text = format().with_thread_names(true);
            let builder = builder
                .event_format(Journald::new(text, stderr_is_journal()))
                .with_env_filter(filter)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            builder.try_init().map(|()| {
                Box::new(move |filter| handle.reload(filter).map_err(|e| e.to_string()))
                    as Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>
            })
        }
        LogFormat::Json => {
            let builder = builder
                .event_format(JsonLines)
                .with_env_filter(filter)
                .with_filter_reloading();
            let handle = builder.reload_handle();
            builder.try_init().map(|()| {
                Box::new(move |filter| handle.reload(filter).map_err(|e| e.to_string()))
                    as Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>
            })
        }
    };
    match result {
        Ok(set) => Some(LogFilterHandle { set, overridden }),
        Err(error) => {
            eprintln!("logging already initialised: {error}");
            None
        }
    }
}
