//! The router's public HTTP port (docs/architecture.md §5, native front): the reads (point,
//! batch, several states, series) are answered here through the read core, on the front's own
//! threads; every other request goes to the Python app (FastAPI, the API's definition) over a
//! private Unix socket, streamed both ways (watch's Server-Sent Events included). Tokens, the
//! request budget (one in-flight limit for both paths, the body limit) and the metrics are kept
//! here for every request, so both paths see the same rules.
//!
//! - `accept`: the accept loop and the connections each thread serves;
//! - `handle`: one request: who asks, its budget, the core or the app, a panic caught;
//! - `linger`: a connection's close that lets the client read its answer;
//! - `upstream`: the app behind the front; `tls`: the port's certificates;
//! - `grpc_port`: the router's public gRPC port, `Get`/`MultiGet` answered here, every other
//!   call passed to the Python gRPC server behind it.

mod accept;
pub mod grpc_port;
mod handle;
mod linger;
pub mod tls;
mod upstream;

use std::io;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::engine::Engine;
use accept::{accept, serve, Lane};
use handle::Ctx;
pub use handle::PRINCIPAL_HEADER;
use upstream::Upstream;

/// The running front: its threads, and how to stop them.
///
/// Each thread runs a runtime of its own (tokio's current-thread flavour) and serves the
/// connections handed to it, start to end; the first thread also accepts, and hands each new
/// connection to the thread with the fewest open. A request then wakes one thread, the one
/// its connection lives on: under tokio's multi-thread runtime every wake-up from a socket
/// also woke an idle worker to look for work to steal, 2.2 context switches and 78 µs of CPU
/// a one-key read against 1.0 and 46 µs here (docs/architecture.md §5, the native front).
pub struct Front {
    stop: watch::Sender<bool>,
    end: watch::Sender<bool>,
    done: std::sync::mpsc::Receiver<()>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

pub struct FrontConfig {
    pub listener: StdListener,
    pub tls: Option<(PathBuf, PathBuf)>,
    pub upstream: PathBuf,
    pub threads: usize,
}

impl Front {
    pub fn start(engine: Arc<Engine>, cfg: FrontConfig) -> io::Result<Front> {
        let tls = match &cfg.tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        cfg.listener.set_nonblocking(true)?;
        let (done_tx, done) = std::sync::mpsc::channel();
        // dropped on an error below: the threads started end with it
        let mut front = Front { stop: watch::channel(false).0, end: watch::channel(false).0, done, threads: vec![] };
        let inflight = Arc::new(AtomicUsize::new(0));
        let n = cfg.threads.max(1);
        let (mut lanes, mut inboxes) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (conns, inbox) = mpsc::unbounded_channel();
            let open = Arc::new(AtomicUsize::new(0));
            lanes.push(Lane { conns, open: open.clone() });
            inboxes.push((inbox, open));
        }
        let mut acceptor = Some((cfg.listener, lanes));
        for (inbox, open) in inboxes {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let accepting = match acceptor.take() {
                Some((listener, lanes)) => {
                    let _g = runtime.enter();
                    Some((TcpListener::from_std(listener)?, lanes))
                }
                None => None,
            };
            // a thread's own connection to the app (hyper's pool spawns on the runtime asking)
            let ctx = Arc::new(Ctx {
                engine: engine.clone(),
                upstream: Upstream::new(cfg.upstream.clone()),
                inflight: inflight.clone(),
            });
            let (tls, stopped, mut ended, done_tx) =
                (tls.clone(), front.stop.subscribe(), front.end.subscribe(), done_tx.clone());
            let thread = std::thread::Builder::new().name("qstate-front".into()).spawn(move || {
                runtime.block_on(async {
                    let accepting_ctx = ctx.clone();
                    let accept = async {
                        if let Some((listener, lanes)) = accepting {
                            accept(accepting_ctx, listener, lanes, stopped.clone()).await;
                        }
                    };
                    tokio::select! {
                        _ = async { tokio::join!(accept, serve(ctx, inbox, open, tls, stopped.clone())) } => {}
                        _ = ended.wait_for(|e| *e) => {}
                    }
                });
                let _ = done_tx.send(());
                // the engine's channels to other shards may live on this runtime: it ends
                // when every thread has (or the grace is over)
                runtime.block_on(async {
                    let _ = ended.wait_for(|e| *e).await;
                });
                runtime.shutdown_timeout(Duration::from_millis(100));
            })?;
            front.threads.push(thread);
        }
        Ok(front)
    }

    /// Stop accepting, let the requests under way finish (at most `grace`), then end.
    pub fn stop(&mut self, grace: Duration) {
        self.stop.send_replace(true);
        let until = Instant::now() + grace;
        for _ in 0..self.threads.len() {
            if self.done.recv_timeout(until.saturating_duration_since(Instant::now())).is_err() {
                break;
            }
        }
        self.end.send_replace(true);
        // each thread's runtime is gone (and with it the listener and the connections) when
        // this returns; a request still under way is dropped at its next await
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop(Duration::from_millis(0));
    }
}
