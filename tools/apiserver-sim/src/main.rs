//! `sluice-apiserver-sim`: the apiserver simulator as its own process, for the perf harness and
//! for trying a proxy by hand. It binds `127.0.0.1:<port>` (port 0: chosen by the OS), prints
//! `https://127.0.0.1:<port>` and, with `--addresses-file`, writes `{"https": "127.0.0.1:<port>"}`
//! (the format `sluice --addresses-file` uses), then serves until it is killed. It keeps no
//! request records (nobody could read them), so a long load run does not grow it.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use sluice_apiserver_sim::{ApiServer, ApiServerOptions, TokenUser};

#[derive(Debug, Parser)]
#[command(name = "sluice-apiserver-sim", about, version)]
struct Cli {
    /// Server certificate (PEM).
    #[arg(long, value_name = "FILE")]
    cert: PathBuf,
    /// Server key (PEM).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// CA whose client certificates are accepted as callers (their CN).
    #[arg(long, value_name = "FILE")]
    client_ca: PathBuf,
    /// A bearer token accepted as a caller: TOKEN=NAME (repeatable).
    #[arg(long, value_name = "TOKEN=NAME", value_parser = key_value)]
    caller_token: Vec<(String, String)>,
    /// A bearer token the TokenReview endpoint accepts as USER: TOKEN=USER (repeatable).
    #[arg(long, value_name = "TOKEN=USER", value_parser = key_value)]
    review_token: Vec<(String, String)>,
    /// Pods to create: NAMESPACE=COUNT (repeatable); named pod-00000, pod-00001, ...
    #[arg(long, value_name = "NAMESPACE=COUNT", value_parser = namespace_count)]
    pods: Vec<(String, usize)>,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (default: hyper's).
    #[arg(long, value_name = "N")]
    max_concurrent_streams: Option<u32>,
    /// Write the bound address as JSON to this file once listening.
    #[arg(long, value_name = "PATH")]
    addresses_file: Option<PathBuf>,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() && !value.is_empty() => {
            Ok((key.to_string(), value.to_string()))
        }
        _ => Err(format!("expected KEY=VALUE, got `{text}`")),
    }
}

fn namespace_count(text: &str) -> Result<(String, usize), String> {
    let (namespace, count) = key_value(text)?;
    let count = count
        .parse()
        .map_err(|_| format!("`{count}` is not a pod count"))?;
    Ok((namespace, count))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut options =
        ApiServerOptions::new(&cli.cert, &cli.key, &cli.client_ca).without_request_records();
    for (token, caller) in &cli.caller_token {
        options = options.caller_token(token, caller);
    }
    if let Some(streams) = cli.max_concurrent_streams {
        options = options.max_concurrent_streams(streams);
    }
    let server = ApiServer::start_with(options).context("cannot start the simulator")?;
    for (token, user) in &cli.review_token {
        server.add_token(token, TokenUser::new(user, &[]));
    }
    for (namespace, count) in &cli.pods {
        for index in 0..*count {
            server.create_pod(namespace, &format!("pod-{index:05}"));
        }
    }
    if let Some(path) = &cli.addresses_file {
        // Written under another name and renamed, so a reader never sees half a file.
        let partial = path.with_extension("partial");
        let json = serde_json::json!({"https": server.address().to_string()}).to_string();
        std::fs::write(&partial, json)
            .and_then(|()| std::fs::rename(&partial, path))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", server.url())?;
    stdout.flush()?;
    // Serves on its own thread until the process is killed.
    loop {
        std::thread::park();
    }
}
