//! A tonic gRPC service served from threads of its own, each a current-thread tokio runtime
//! accepting on the same listening socket (the kernel hands each connection to one of them),
//! as the native HTTP front's threads are (docs/architecture.md §5): a call then wakes the one
//! thread its connection lives on. On the engine's multi-thread runtime every wake-up also
//! woke its worker's park and the I/O driver in turn (a third of the owner's reader's CPU a
//! call went to the scheduler and epoll, `loadtest/results/cluster_reads.md`).
//!
//! Used by the router's gRPC port (`front::grpc_port`) and the shard's reader (`reader`).

use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

/// How long the calls under way may take once stopped (a kept-alive channel of another
/// process is closed then, not waited for).
const GRACE: Duration = Duration::from_secs(1);

/// A read failure as gRPC says it: the class's code, the message, the trailers a client
/// reads back (`errors::Failure::trailers`).
pub fn status(f: &crate::errors::Failure) -> tonic::Status {
    let mut meta = tonic::metadata::MetadataMap::new();
    for (k, v) in f.trailers() {
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(v.as_str()) {
            meta.insert(k, v);
        }
    }
    tonic::Status::with_metadata(tonic::Code::from(f.grpc_code() as i32), f.message.clone(), meta)
}

/// The serving threads; dropping it (or `stop`) ends them.
pub struct Served {
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

/// Serve `svc` on `listener` from `threads` threads named `name`, with TLS when given.
pub fn serve<S>(
    name: &str,
    listener: StdListener,
    threads: usize,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    svc: S,
) -> std::io::Result<Served>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    listener.set_nonblocking(true)?;
    let mut builder = Server::builder().tcp_nodelay(true);
    if let Some((cert, key)) = tls {
        builder = builder
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
            .map_err(|e| std::io::Error::other(format!("{name}: TLS: {e}")))?;
    }
    let (stop, _) = watch::channel(false);
    let mut served = Served { stop, threads: Vec::new() };
    for _ in 0..threads.max(1) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listener = {
            let _g = runtime.enter();
            tokio::net::TcpListener::from_std(listener.try_clone()?)?
        };
        let (builder, svc, mut stopped, label) =
            (builder.clone(), svc.clone(), served.stop.subscribe(), name.to_string());
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            runtime.block_on(async move {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                let mut signal = stopped.clone();
                let serving = builder.serve_with_incoming_shutdown(svc, incoming, async move {
                    let _ = signal.wait_for(|s| *s).await;
                });
                let stopping = async {
                    let _ = stopped.wait_for(|s| *s).await;
                    tokio::time::sleep(GRACE).await;
                };
                tokio::select! {
                    r = serving => if let Err(e) = r {
                        eprintln!("qstate: {label} stopped: {e}");
                    },
                    _ = stopping => {}
                }
            });
        })?;
        served.threads.push(thread);
    }
    Ok(served)
}

impl Served {
    /// Stop accepting; the calls under way have `GRACE`, then the threads end.
    pub fn stop(&mut self) {
        self.stop.send_replace(true);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
    }
}
