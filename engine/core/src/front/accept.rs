//! Connections: the accept loop (on the first front thread), which hands each connection to
//! the thread with the fewest open, and each thread's connections served until they close
//! (HTTP/1.1, keep-alive, pipelining; TLS when the port has certificates).

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::handle::{handle, Ctx, Reached};
use super::linger::Lingering;
use crate::settings::Fault;

/// A front thread as the acceptor sees it: where its connections go, and how many it has.
pub struct Lane {
    pub conns: mpsc::UnboundedSender<std::net::TcpStream>,
    pub open: Arc<AtomicUsize>,
}

/// The accept loop (on the first thread): each connection to the thread with the fewest open,
/// so that keep-alive clients spread over the threads (accepting on every thread at once left
/// one thread with all of wrk's 32 connections, the one awake when they came). A panic while
/// a connection is handed out loses that connection, not the loop (`qstate_router_engine_panics_total{at="accept"}`).
pub async fn accept(ctx: Arc<Ctx>, listener: TcpListener, lanes: Vec<Lane>, mut stopped: watch::Receiver<bool>) {
    let accepted_n = AtomicU64::new(0);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // one connection gone before it was taken: the next
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) => continue,
            // out of file descriptors or memory: a pause, not a loop spinning on the error
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let nth = accepted_n.fetch_add(1, Ordering::Relaxed) + 1;
        let handed = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if ctx.engine.settings.load().fault == Some(Fault::AcceptPanic { nth }) {
                panic!("planted fault router.accept-panic@{nth}: QSTATE_FAULT");
            }
            let _ = stream.set_nodelay(true);
            let Ok(stream) = stream.into_std() else { return };
            let lane = lanes.iter().min_by_key(|l| l.open.load(Ordering::Relaxed)).expect("a thread");
            lane.open.fetch_add(1, Ordering::Relaxed);
            let _ = lane.conns.send(stream);
        }));
        if handed.is_err() {
            ctx.engine.metrics.panicked("accept");
        }
    }
}

/// One thread's connections, each served here until it closes; on `stop`, no new one, and
/// the ones open finish what they are answering.
pub async fn serve(
    ctx: Arc<Ctx>,
    mut inbox: mpsc::UnboundedReceiver<std::net::TcpStream>,
    open: Arc<AtomicUsize>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stopped: watch::Receiver<bool>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    // no pipeline_flush: with it, hyper 1.12 buffers the answer it writes itself to a request
    // it cannot parse (a 400, a 414) and closes the connection without sending it
    http.keep_alive(true).timer(hyper_util::rt::TokioTimer::new());
    loop {
        let handed = tokio::select! {
            s = inbox.recv() => s,
            _ = stopped.wait_for(|s| *s) => break,
        };
        let Some(stream) = handed else { break };
        // counted open until its task ends, however it ends
        let opened = Opened(open.clone());
        let Ok(stream) = TcpStream::from_std(stream) else { continue };
        let c = ctx.clone();
        // how the client reached this port: what the app is told when the request says none
        let reached = Reached { address: stream.local_addr().ok(), tls: tls.is_some() };
        let service = hyper::service::service_fn(move |req| handle(c.clone(), req, reached));
        match &tls {
            None => {
                let conn = graceful.watch(http.serve_connection(TokioIo::new(Lingering::new(stream)), service));
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(opened);
                });
            }
            Some(acceptor) => {
                let (acceptor, http, w) = (acceptor.clone(), http.clone(), graceful.watcher());
                tokio::spawn(async move {
                    if let Ok(s) = acceptor.accept(Lingering::new(stream)).await {
                        let _ = w.watch(http.serve_connection(TokioIo::new(s), service)).await;
                    }
                    drop(opened);
                });
            }
        }
    }
    graceful.shutdown().await;
}

/// One connection of a thread's count, given back when dropped.
struct Opened(Arc<AtomicUsize>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
