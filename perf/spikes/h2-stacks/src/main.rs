//! One HTTP/2 server, three stacks, the same answer: which HTTP/2 stack costs least per request
//! on monoio? See README.md for why and how to run it.
//!
//! - `h2`: the h2 crate over Sluice's gathering adapter (`sluice_grpc::gather`), the stack the
//!   tunnel node serves clients with;
//! - `hyper`: hyper's HTTP/2 server over the same adapter, as the gateway serves clients;
//! - `fork`: monoio-http's fork of h2, which reads and writes monoio's owned buffers directly.
//!
//! Every stack answers each request from a task of its own (hyper does so itself), with the
//! gateway's small GET: 200, two headers and a body of 267 bytes (`--body N` to change it).

use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use monoio::net::{TcpListener, TcpStream};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The answer's body, chosen once at start (`--body`); static so a clone costs no refcount.
static BODY: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();

#[derive(Clone, Copy, PartialEq)]
enum Stack {
    H2,
    Hyper,
    Fork,
}

struct Options {
    stack: Stack,
    tls: Option<Arc<rustls::ServerConfig>>,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: h2-stacks-spike h2|hyper|fork [--body BYTES] [--tls CERT KEY]";
    let stack = match args.next().as_deref() {
        Some("h2") => Stack::H2,
        Some("hyper") => Stack::Hyper,
        Some("fork") => Stack::Fork,
        _ => panic!("{usage}"),
    };
    let mut body_len = 267;
    let mut tls = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--body" => body_len = args.next().and_then(|n| n.parse().ok()).expect(usage),
            "--tls" => {
                let cert = args.next().expect(usage);
                let key = args.next().expect(usage);
                tls = Some(
                    sluice_grpc::tls::server_config(cert.as_ref(), key.as_ref(), None)
                        .expect("the certificate and key load"),
                );
            }
            _ => panic!("{usage}"),
        }
    }
    let _ = BODY.set(vec![b'x'; body_len].leak());
    let options = Rc::new(Options { stack, tls });
    let mut uring = io_uring::IoUring::builder();
    uring.setup_coop_taskrun();
    let mut runtime = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(1024)
        .uring_builder(uring)
        .enable_timer()
        .build()
        .expect("an io_uring runtime (Linux 5.19 or later)");
    runtime.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        println!("{}", listener.local_addr().expect("bound"));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            monoio::spawn(serve(options.clone(), stream));
        }
    });
}

async fn serve(options: Rc<Options>, stream: TcpStream) {
    let served = match (options.stack, &options.tls) {
        (Stack::Fork, None) => fork::serve(stream).await,
        (Stack::Fork, Some(tls)) => {
            let acceptor = monoio_rustls::TlsAcceptor::from(tls.clone());
            match acceptor.accept(stream).await {
                Ok(stream) => fork::serve(stream).await,
                Err(error) => Err(error.to_string()),
            }
        }
        (stack, None) => {
            let io = sluice_grpc::frames::FrameIo(
                sluice_grpc::transport::compat(stream).expect("wrapped"),
            );
            compat::serve(stack, io).await
        }
        (stack, Some(tls)) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.clone());
            let gathered = sluice_grpc::transport::compat(stream).expect("wrapped");
            match acceptor.accept(gathered).await {
                Ok(stream) => compat::serve(stack, sluice_grpc::frames::FrameIo(stream)).await,
                Err(error) => Err(error.to_string()),
            }
        }
    };
    if let Err(error) = served {
        eprintln!("connection: {error}");
    }
}

fn answer_head() -> http::Response<()> {
    let mut response = http::Response::new(());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body().len()),
    );
    response
}

fn body() -> Bytes {
    Bytes::from_static(BODY.get().copied().unwrap_or_default())
}

/// The h2 crate and monoio-http's fork share h2's server API, so one body serves both: accept
/// each stream and answer it from a task of its own.
macro_rules! serve_with {
    ($($h2:ident)::+, $io:expr) => {{
        let mut connection = $($h2)::+::server::Builder::new()
            .max_concurrent_streams(1000)
            .handshake::<_, Bytes>($io)
            .await
            .map_err(|error| error.to_string())?;
        while let Some(accepted) = connection.accept().await {
            let (_request, mut respond) = accepted.map_err(|error| error.to_string())?;
            monoio::spawn(async move {
                if let Ok(mut send) = respond.send_response(answer_head(), false) {
                    let _ = send.send_data(body(), true);
                }
            });
        }
        Ok(())
    }};
}

mod compat {
    use super::*;
    use tokio::io::{AsyncRead, AsyncWrite};

    pub(super) async fn serve<T>(stack: Stack, io: T) -> Result<(), String>
    where
        T: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        match stack {
            Stack::Hyper => serve_hyper(io).await,
            _ => serve_h2(io).await,
        }
    }

    async fn serve_h2<T>(io: T) -> Result<(), String>
    where
        T: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        serve_with!(h2, io)
    }

    #[derive(Clone, Copy)]
    struct LocalExec;

    impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
        fn execute(&self, future: F) {
            monoio::spawn(future);
        }
    }

    async fn serve_hyper<T>(io: T) -> Result<(), String>
    where
        T: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let service = hyper::service::service_fn(|_request| async {
            let (head, ()) = answer_head().into_parts();
            let full = http_body_util::Full::new(body());
            Ok::<_, Infallible>(http::Response::from_parts(head, full))
        });
        hyper::server::conn::http2::Builder::new(LocalExec)
            .timer(monoio_compat::hyper::MonoioTimer)
            .max_concurrent_streams(1000)
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .await
            .map_err(|error| error.to_string())
    }
}

mod fork {
    use super::*;
    use monoio::io::{AsyncReadRent, AsyncWriteRent};
    use monoio_http::h2;

    pub(super) async fn serve<T>(io: T) -> Result<(), String>
    where
        T: AsyncReadRent + AsyncWriteRent + Unpin + 'static,
    {
        serve_with!(h2, io)
    }
}
