//! `sluice vm-agent`: enforces the VM NetworkPolicies of a policy file (or a directory of them,
//! or its span on the control plane: [`feed`]) on one OVS bridge and hot reloads them. Flows stay on the bridge when the agent stops (enforcement survives an
//! agent restart; the next run replaces them atomically under a new cookie round).

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sluice_ovs::{ClientConfig, OvsdbClient, OvsdbError};
use sluice_policy_engine::{EngineConfig, EngineMetrics, PolicyEngine, RejectMeter};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

mod feed;

/// Options of one agent run (the command-line flags).
#[derive(Debug, Clone)]
pub struct VmAgentOptions {
    pub bridge: String,
    /// A policy file or directory; `None` with `controlplane`.
    pub policies: Option<PathBuf>,
    /// Watch this VM's span of policies on the control plane instead of a file.
    pub controlplane: Option<sluice_config::ControlPlaneSource>,
    pub ovs_rundir: PathBuf,
    pub db_socket: Option<PathBuf>,
    pub admin: SocketAddr,
    /// Also how often the Reject meter's dropped packets are read.
    pub stats_interval: Duration,
    pub reject_meter: RejectMeter,
}

/// How often the policy file's modification time is checked.
const RELOAD_POLL: Duration = Duration::from_millis(200);
/// Pause before retrying a replay the switch was not ready for.
const REPLAY_RETRY: Duration = Duration::from_millis(100);

pub fn run(options: VmAgentOptions) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sluice vm-agent: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_agent(options)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice vm-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

struct AgentMetrics {
    reloads: Counter,
    reload_errors: Counter,
}

async fn run_agent(options: VmAgentOptions) -> anyhow::Result<()> {
    let engine_metrics = EngineMetrics::default();
    let agent_metrics = AgentMetrics {
        reloads: Counter::default(),
        reload_errors: Counter::default(),
    };
    let mut registry = Registry::default();
    engine_metrics.register(&mut registry);
    registry.register(
        "sluice_policy_reloads",
        "Policy file changes realized",
        agent_metrics.reloads.clone(),
    );
    registry.register(
        "sluice_policy_reload_errors",
        "Policy file changes refused (invalid file or refused by OVS); the last good state stays",
        agent_metrics.reload_errors.clone(),
    );
    let mut from_controlplane = match &options.controlplane {
        Some(source) => Some(feed::spawn(
            source,
            &mut registry,
            agent_metrics.reload_errors.clone(),
        )?),
        None => None,
    };
    let ready = Arc::new(AtomicBool::new(false));
    let listener = TcpListener::bind(options.admin)
        .await
        .with_context(|| format!("binding the admin address {}", options.admin))?;
    let admin = listener.local_addr()?;
    tracing::info!(%admin, "admin endpoint listening");
    // Tests and scripts read the chosen port from here when the address ends in :0.
    println!("admin listening on {admin}");
    tokio::spawn(serve_admin(
        listener,
        Arc::new(Mutex::new(registry)),
        ready.clone(),
    ));

    let db_socket = options
        .db_socket
        .clone()
        .unwrap_or_else(|| options.ovs_rundir.join("db.sock"));
    let mut ovsdb = OvsdbClient::connect(&db_socket, Duration::from_secs(10))
        .await
        .with_context(|| format!("connecting to OVSDB at {}", db_socket.display()))?;
    match ovsdb.create_bridge(&options.bridge).await {
        Ok(()) => tracing::info!(bridge = %options.bridge, "bridge created"),
        Err(OvsdbError::AlreadyExists { .. }) => {}
        Err(error) => return Err(error).context("creating the bridge"),
    }

    let mut file_stamp = options.policies.as_deref().map(stamp);
    let initial = match (&options.policies, &mut from_controlplane) {
        (Some(path), _) => {
            sluice_policy::load::load_path(path).map_err(|error| anyhow::anyhow!("{error}"))?
        }
        (None, Some(policies)) => first_policies(policies).await,
        (None, None) => anyhow::bail!("give --policies or --controlplane"),
    };
    let config = EngineConfig {
        mgmt_socket: options.ovs_rundir.join(format!("{}.mgmt", options.bridge)),
        client: ClientConfig::default(),
        control_plane: Vec::new(),
        stats_interval: options.stats_interval,
        reject_meter: options.reject_meter,
    };
    let mut engine = PolicyEngine::start(&config, initial, engine_metrics).await?;
    let _responder = engine.spawn_reject_responder();
    let mut ovsdb = Some(ovsdb);
    // Set when our flows are on the switch but `flow-restore-wait` may still hold it back.
    let mut restore_wait_due = !clear_flow_restore_wait(&mut ovsdb, &db_socket).await;
    let mut connection = engine.client().connection_generation();
    connection.borrow_and_update();
    ready.store(true, Ordering::Release);

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut reload_tick = tokio::time::interval(RELOAD_POLL);
    let mut stats_tick = tokio::time::interval(config.stats_interval);
    let mut replay_due = false;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            changed = connection.changed(), if !replay_due => {
                if changed.is_err() {
                    anyhow::bail!("the OpenFlow client stopped");
                }
                replay_due = true;
            }
            _ = tokio::time::sleep(REPLAY_RETRY), if replay_due => {}
            _ = reload_tick.tick() => {
                if restore_wait_due {
                    restore_wait_due = !clear_flow_restore_wait(&mut ovsdb, &db_socket).await;
                }
                if let Some(path) = &options.policies {
                    let now = Some(stamp(path));
                    if now != file_stamp {
                        file_stamp = now;
                        reload(&mut engine, path, &agent_metrics).await;
                    }
                }
            }
            changed = next_policies(&mut from_controlplane) => {
                match changed {
                    Some(set) => realize(&mut engine, set, &agent_metrics, "the control plane").await,
                    None => anyhow::bail!("the control-plane feed stopped"),
                }
            }
            _ = stats_tick.tick() => {
                if let Err(error) = engine.poll_stats().await {
                    tracing::debug!(%error, "flow stats not read");
                }
            }
        }
        if replay_due {
            connection.borrow_and_update();
            match engine.replay().await {
                Ok(_) => {
                    replay_due = false;
                    restore_wait_due = !clear_flow_restore_wait(&mut ovsdb, &db_socket).await;
                }
                Err(error) => tracing::warn!(%error, "replay failed, retrying"),
            }
        }
    }
    tracing::info!("stopping; the flows stay on the bridge");
    Ok(())
}

/// Clears `other_config:flow-restore-wait` once the agent's flows are on the switch (see
/// [`OvsdbClient::clear_flow_restore_wait`]); reconnects to OVSDB when needed. Returns false when
/// it could not tell or clear (retried later), logged.
async fn clear_flow_restore_wait(ovsdb: &mut Option<OvsdbClient>, db_socket: &Path) -> bool {
    if ovsdb.is_none() {
        match OvsdbClient::connect(db_socket, Duration::from_secs(2)).await {
            Ok(client) => *ovsdb = Some(client),
            Err(error) => {
                tracing::warn!(%error, "OVSDB unreachable; flow-restore-wait not checked");
                return false;
            }
        }
    }
    let Some(client) = ovsdb.as_mut() else {
        return false;
    };
    match client.clear_flow_restore_wait().await {
        Ok(true) => {
            tracing::info!("flows restored: cleared other_config:flow-restore-wait");
            true
        }
        Ok(false) => true,
        Err(error) => {
            tracing::warn!(%error, "flow-restore-wait not checked; retrying");
            *ovsdb = None;
            false
        }
    }
}

/// What a policy file looked like when last read: inode (a rename puts a new one in place),
/// modification time and length.
type FileStamp = (PathBuf, u64, Option<SystemTime>, u64);

/// The stamps of the policy file, or of every policy file of the directory: a file that
/// changes, appears or disappears changes the result. `None` when the path cannot be read.
fn stamp(path: &Path) -> Option<Vec<FileStamp>> {
    let files = if path.is_dir() {
        sluice_policy::load::policy_files(path).ok()?
    } else {
        vec![path.to_path_buf()]
    };
    Some(
        files
            .into_iter()
            .filter_map(|file| {
                let metadata = std::fs::metadata(&file).ok()?;
                Some((
                    file,
                    metadata.ino(),
                    metadata.modified().ok(),
                    metadata.len(),
                ))
            })
            .collect(),
    )
}

/// The first policies from the control plane; an empty set if none come within 10 s (the
/// agent then enforces what arrives later).
async fn first_policies(
    policies: &mut tokio::sync::watch::Receiver<Option<Arc<sluice_policy::model::PolicySet>>>,
) -> sluice_policy::model::PolicySet {
    let first =
        tokio::time::timeout(Duration::from_secs(10), policies.wait_for(Option::is_some)).await;
    match first
        .ok()
        .and_then(|got| got.ok().and_then(|set| set.as_deref().cloned()))
    {
        Some(set) => set,
        None => {
            tracing::warn!("no policies from the control plane within 10s; starting with none");
            sluice_policy::model::PolicySet::default()
        }
    }
}

/// The next policy set from the control plane; pending forever without one.
async fn next_policies(
    feed: &mut Option<tokio::sync::watch::Receiver<Option<Arc<sluice_policy::model::PolicySet>>>>,
) -> Option<sluice_policy::model::PolicySet> {
    let Some(receiver) = feed else {
        return std::future::pending().await;
    };
    receiver.changed().await.ok()?;
    let set = receiver.borrow_and_update().as_deref().cloned();
    Some(set.unwrap_or_default())
}

/// Realizes a new policy set from `source` (the file or the control plane, for the logs).
async fn realize(
    engine: &mut PolicyEngine,
    desired: sluice_policy::model::PolicySet,
    metrics: &AgentMetrics,
    source: &str,
) {
    match engine.apply_set(desired).await {
        Ok(summary) => {
            metrics.reloads.inc();
            tracing::info!(
                %source,
                generation = summary.generation,
                flow_mods = summary.flow_mods,
                "policies realized"
            );
        }
        Err(error) => {
            metrics.reload_errors.inc();
            tracing::error!(%source, %error, "policy change not realized; the last good policies stay");
        }
    }
}

async fn reload(engine: &mut PolicyEngine, path: &Path, metrics: &AgentMetrics) {
    let desired = match sluice_policy::load::load_path(path) {
        Ok(desired) => desired,
        Err(error) => {
            metrics.reload_errors.inc();
            for file in &error.sources {
                for field in &file.errors {
                    tracing::error!(file = %file.origin, path = %field.path, reason = %field.reason, "policies refused; the last good policies stay");
                }
            }
            return;
        }
    };
    realize(engine, desired, metrics, &path.display().to_string()).await;
}

/// How long an admin client may take to send its request head (and to take the answer).
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Admin connections served at once; more wait in the kernel backlog.
const ADMIN_MAX_CONNECTIONS: usize = 64;

/// `/metrics`, `/healthz`, `/readyz` over HTTP/1.1, one request per connection. A few lines
/// on tokio rather than a server framework: three fixed GET routes scraped every few seconds.
/// A client gets `ADMIN_REQUEST_TIMEOUT` for its head and the answer; a failing accept (out of
/// descriptors) backs off instead of spinning.
async fn serve_admin(
    listener: TcpListener,
    registry: Arc<Mutex<Registry>>,
    ready: Arc<AtomicBool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "admin accept failed; pausing 100ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let answered = tokio::time::timeout(
                ADMIN_REQUEST_TIMEOUT,
                answer_admin(&mut stream, &registry, &ready),
            );
            let _ = answered.await;
        });
    }
}

/// Reads one request head and answers it.
async fn answer_admin(
    stream: &mut tokio::net::TcpStream,
    registry: &Mutex<Registry>,
    ready: &AtomicBool,
) {
    let mut buf = vec![0u8; 4096];
    let mut filled = 0;
    let path = loop {
        let Ok(read) = stream.read(&mut buf[filled..]).await else {
            return;
        };
        if read == 0 {
            return;
        }
        filled += read;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(_)) => break request.path.unwrap_or("/").to_string(),
            Ok(httparse::Status::Partial) if filled < buf.len() => continue,
            _ => return,
        }
    };
    let (status, body) = match path.as_str() {
        "/metrics" => {
            let mut text = String::new();
            let encoded = match registry.lock() {
                Ok(registry) => prometheus_client::encoding::text::encode(&mut text, &registry),
                Err(_) => Err(std::fmt::Error),
            };
            match encoded {
                Ok(()) => ("200 OK", text),
                Err(_) => ("500 Internal Server Error", "encoding failed\n".to_string()),
            }
        }
        "/healthz" => ("200 OK", "ok\n".to_string()),
        "/readyz" if ready.load(Ordering::Acquire) => ("200 OK", "ready\n".to_string()),
        "/readyz" => ("503 Service Unavailable", "not realized yet\n".to_string()),
        _ => ("404 Not Found", "not found\n".to_string()),
    };
    let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
    let _ = stream.write_all(response.as_bytes()).await;
}
