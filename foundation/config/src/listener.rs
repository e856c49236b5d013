//! Listener blocks: address, TLS, and the limits that keep a slow or silent peer from holding
//! a connection (and its memory) for free.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::raw::{RawListener, RawServerTls};
use crate::validate::{duration, readable_file, socket_address, unsigned, Errors};

/// Every listener has its own block; issues that add endpoints add fields here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenersConfig {
    pub admin: ListenerConfig,
    /// Where agents open their tunnels (present when `tunnel` is configured).
    pub agent: Option<ListenerConfig>,
    /// Where clients call agents (present when `tunnel` is configured).
    pub external: Option<ListenerConfig>,
    /// Where other nodes forward calls (present when `redis` is configured).
    pub private: Option<ListenerConfig>,
    /// Where Kubernetes clients connect (TLS; present when `gateway` is configured).
    pub gateway: Option<ListenerConfig>,
}

impl ListenersConfig {
    /// The data listeners by their config name (`listeners.<name>`), present or not: what
    /// walks every listener (the files a start loads, the certificates it serves) names them
    /// as the config file does.
    pub fn data_listeners(&self) -> [(&'static str, Option<&ListenerConfig>); 4] {
        [
            ("agent", self.agent.as_ref()),
            ("external", self.external.as_ref()),
            ("private", self.private.as_ref()),
            ("gateway", self.gateway.as_ref()),
        ]
    }
}

/// Address and limits of one listener. Each worker binds its own socket to the address with
/// `SO_REUSEPORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub address: SocketAddr,
    pub backlog: u32,
    /// Connections one worker serves at once on this listener; past it the worker stops
    /// accepting until one closes (the kernel backlog absorbs the burst).
    pub max_connections_per_worker: usize,
    /// How long a connection may take, and hold on, before it is closed.
    pub limits: ConnectionLimits,
    /// Serve TLS (HTTP/2 via ALPN) instead of cleartext.
    pub tls: Option<ServerTlsConfig>,
}

/// Certificate and key of a TLS listener, and optionally the CA its clients must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

/// How long a peer may take and hold a connection. The admin endpoint uses the header and idle
/// timeouts; the data listeners (agent, external, private, gateway) use all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest TLS handshake plus HTTP/2 preface (or, on HTTP/1.1, until the first byte).
    pub handshake_timeout: Duration,
    /// Longest wait for the first complete request head after the handshake.
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/2: GOAWAY).
    pub idle_timeout: Duration,
    /// How often an HTTP/2 connection is probed with PING; `None`: never.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Connections are asked to go away (GOAWAY, in-flight requests finish) after this age,
    /// spread by up to a tenth either way so reconnects do not come in a wave; `None`: never.
    pub max_connection_age: Option<Duration>,
    /// Most connections one source IP may hold on this listener at once; `None`: no cap.
    pub max_connections_per_ip: Option<u32>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(20),
            max_connection_age: Some(Duration::from_secs(2 * 3600)),
            max_connections_per_ip: None,
        }
    }
}

/// A duration where `0s` means "off".
fn optional_duration(
    leaf: &crate::raw::Leaf,
    path: &str,
    default: Option<Duration>,
    errors: &mut Errors,
) -> Option<Duration> {
    let value = duration(leaf, path, default.unwrap_or(Duration::ZERO), errors);
    (!value.is_zero()).then_some(value)
}

fn positive_duration(
    leaf: &crate::raw::Leaf,
    path: &str,
    default: Duration,
    errors: &mut Errors,
) -> Duration {
    let value = duration(leaf, path, default, errors);
    if value.is_zero() {
        errors.push(path, "must be longer than 0s");
        return default;
    }
    value
}

fn limits(raw: &RawListener, path: &str, errors: &mut Errors) -> ConnectionLimits {
    let defaults = ConnectionLimits::default();
    let field = |name: &str| format!("{path}.{name}");
    let per_ip = unsigned(
        &raw.max_connections_per_ip,
        &field("max_connections_per_ip"),
        0,
        (0, 1_000_000),
        errors,
    ) as u32;
    ConnectionLimits {
        handshake_timeout: positive_duration(
            &raw.handshake_timeout,
            &field("handshake_timeout"),
            defaults.handshake_timeout,
            errors,
        ),
        header_timeout: positive_duration(
            &raw.header_timeout,
            &field("header_timeout"),
            defaults.header_timeout,
            errors,
        ),
        idle_timeout: positive_duration(
            &raw.idle_timeout,
            &field("idle_timeout"),
            defaults.idle_timeout,
            errors,
        ),
        keepalive_interval: optional_duration(
            &raw.keepalive_interval,
            &field("keepalive_interval"),
            defaults.keepalive_interval,
            errors,
        ),
        keepalive_timeout: positive_duration(
            &raw.keepalive_timeout,
            &field("keepalive_timeout"),
            defaults.keepalive_timeout,
            errors,
        ),
        max_connection_age: optional_duration(
            &raw.max_connection_age,
            &field("max_connection_age"),
            defaults.max_connection_age,
            errors,
        ),
        max_connections_per_ip: (per_ip > 0).then_some(per_ip),
    }
}

pub(crate) fn listener(
    raw: &RawListener,
    path: &str,
    default_address: &str,
    errors: &mut Errors,
) -> ListenerConfig {
    let address = socket_address(
        &raw.address,
        &format!("{path}.address"),
        default_address,
        errors,
    );
    ListenerConfig {
        address,
        backlog: unsigned(
            &raw.backlog,
            &format!("{path}.backlog"),
            1024,
            (1, 65_535),
            errors,
        ) as u32,
        max_connections_per_worker: unsigned(
            &raw.max_connections_per_worker,
            &format!("{path}.max_connections_per_worker"),
            1024,
            (1, 1_000_000),
            errors,
        ) as usize,
        limits: limits(raw, path, errors),
        tls: raw
            .tls
            .as_ref()
            .and_then(|tls| server_tls(tls, &format!("{path}.tls"), errors)),
    }
}

fn server_tls(raw: &RawServerTls, path: &str, errors: &mut Errors) -> Option<ServerTlsConfig> {
    let cert_file = readable_file(&raw.cert_file, &format!("{path}.cert_file"), true, errors);
    let key_file = readable_file(&raw.key_file, &format!("{path}.key_file"), true, errors);
    let client_ca_file = readable_file(
        &raw.client_ca_file,
        &format!("{path}.client_ca_file"),
        false,
        errors,
    );
    Some(ServerTlsConfig {
        cert_file: cert_file?,
        key_file: key_file?,
        client_ca_file,
    })
}
