//! Pingora 0.9 as a peer proxy for sluice-perf: every request goes to one upstream over HTTP/2
//! (TLS or cleartext), many streams per upstream connection, on one single-threaded runtime.
//!
//! ```text
//! sluice-perf-pingora --conf pingora.yaml --listen ADDR --upstream ADDR
//!                     [--tls CERT KEY] [--upstream-tls SNI] [--max-h2-streams N]
//! ```
//!
//! `--conf` is Pingora's own server configuration (YAML, written by the harness: one thread, no
//! work stealing, no grace period on SIGTERM). With `--tls` the listener is TLS with ALPN h2 and
//! http/1.1 (the gateway scenario); without it, cleartext with HTTP/2 prior knowledge accepted
//! beside HTTP/1.1 (h2c, the tunnel scenario's gRPC hop). `--upstream-tls SNI` speaks TLS to the
//! upstream without verifying its certificate, as HAProxy's `ssl verify none` does.

use std::net::SocketAddr;

use async_trait::async_trait;
use pingora_core::apps::HttpServerOptions;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
struct Args {
    conf: String,
    listen: SocketAddr,
    upstream: SocketAddr,
    tls: Option<(String, String)>,
    upstream_sni: Option<String>,
    max_h2_streams: usize,
}

/// Reads the command line (without the program name). Every error names what was wrong.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut conf = None;
    let mut listen = None;
    let mut upstream = None;
    let mut tls = None;
    let mut upstream_sni = None;
    // Pingora's default is one stream per upstream connection; HAProxy and Sluice multiplex.
    let mut max_h2_streams = 1000;
    while let Some(flag) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{flag} needs {what}"));
        match flag.as_str() {
            "--conf" => conf = Some(value("a file")?),
            "--listen" | "--upstream" => {
                let text = value("an address")?;
                let address: SocketAddr = text
                    .parse()
                    .map_err(|error| format!("{flag} {text}: {error}"))?;
                if flag == "--listen" {
                    listen = Some(address);
                } else {
                    upstream = Some(address);
                }
            }
            "--tls" => {
                let cert = value("a certificate and a key")?;
                tls = Some((cert, value("a key after the certificate")?));
            }
            "--upstream-tls" => upstream_sni = Some(value("a server name")?),
            "--max-h2-streams" => {
                let text = value("a number")?;
                max_h2_streams = text
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("--max-h2-streams {text}: not a positive number"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        conf: conf.ok_or("--conf is required")?,
        listen: listen.ok_or("--listen is required")?,
        upstream: upstream.ok_or("--upstream is required")?,
        tls,
        upstream_sni,
        max_h2_streams,
    })
}

/// The upstream every request goes to, HTTP/2 only (prior knowledge on cleartext).
fn upstream_peer(args: &Args) -> HttpPeer {
    let sni = args.upstream_sni.clone().unwrap_or_default();
    let mut peer = HttpPeer::new(args.upstream, args.upstream_sni.is_some(), sni);
    peer.options.set_http_version(2, 2);
    peer.options.max_h2_streams = args.max_h2_streams;
    peer.options.verify_cert = false;
    peer.options.verify_hostname = false;
    peer
}

/// Forwards every request, unchanged, to one upstream.
struct OneUpstream {
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for OneUpstream {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> pingora_core::Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }
}

fn run(args: Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.conf)
        .map_err(|error| format!("cannot read {}: {error}", args.conf))?;
    let conf = ServerConf::from_yaml(&text).map_err(|error| format!("{}: {error}", args.conf))?;
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = pingora_proxy::http_proxy_service(
        &server.configuration,
        OneUpstream {
            peer: upstream_peer(&args),
        },
    );
    let listen = args.listen.to_string();
    match &args.tls {
        Some((cert, key)) => {
            let mut settings = TlsSettings::intermediate(cert, key)
                .map_err(|error| format!("TLS files {cert}, {key}: {error}"))?;
            settings.enable_h2();
            service.add_tls_with_settings(&listen, None, settings);
        }
        None => {
            let mut options = HttpServerOptions::default();
            options.h2c = true;
            if let Some(proxy) = service.app_logic_mut() {
                proxy.server_options = Some(options);
            }
            service.add_tcp(&listen);
        }
    }
    server.add_service(service);
    server.run_forever()
}

fn main() {
    if let Err(error) = parse_args(std::env::args().skip(1)).and_then(run) {
        eprintln!("sluice-perf-pingora: {error}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        parse_args(line.split_whitespace().map(str::to_string))
    }

    #[test]
    fn the_gateway_and_the_tunnel_command_lines() {
        let gateway = parse(
            "--conf p.yaml --listen 127.0.0.1:1 --upstream 127.0.0.1:2 --tls c.pem k.pem \
             --upstream-tls kube.perf.test",
        )
        .unwrap();
        assert_eq!(gateway.tls, Some(("c.pem".into(), "k.pem".into())));
        assert_eq!(gateway.max_h2_streams, 1000);
        let peer = upstream_peer(&gateway);
        assert_eq!(peer.sni, "kube.perf.test");
        assert!(peer.is_tls() && !peer.options.verify_cert);
        assert_eq!(peer.options.alpn.get_min_http_version(), 2);

        let tunnel =
            parse("--conf p.yaml --listen 127.0.0.1:1 --upstream 127.0.0.1:2 --max-h2-streams 9")
                .unwrap();
        let peer = upstream_peer(&tunnel);
        assert!(!peer.is_tls());
        assert_eq!(peer.options.max_h2_streams, 9);
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        assert_eq!(
            parse("--listen 127.0.0.1:1 --upstream 127.0.0.1:2"),
            Err("--conf is required".into())
        );
        assert!(parse("--conf p --listen nowhere")
            .unwrap_err()
            .contains("--listen nowhere"));
        assert_eq!(parse("--conf"), Err("--conf needs a file".into()));
        assert!(parse("--max-h2-streams 0")
            .unwrap_err()
            .contains("not a positive"));
        assert_eq!(parse("--bogus"), Err("unknown argument --bogus".into()));
    }
}
