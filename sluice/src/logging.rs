use sluice_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

/// Structured logs on stderr. `RUST_LOG`, when set, overrides `logging.level`.
pub fn init(config: &LoggingConfig) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(&config.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_thread_names(true)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let result = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(error) = result {
        eprintln!("logging already initialised: {error}");
    }
}
