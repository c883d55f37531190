//! The reader's port: a gRPC server (tonic, HTTP/2) answering `qstate.shard.v1.Shard/MultiGet`
//! on the engine's runtime, every other method UNIMPLEMENTED (they are the shard's own port's).
//! A call must carry the cluster token as the shard's own port asks it (`authorization:
//! Bearer ...`, compared in constant time); TLS with the shard's certificates when it has
//! them (docs/security.md).

use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::sync::Arc;
use std::task::{Context, Poll};

use subtle::ConstantTimeEq;
use tonic::body::Body;
use tonic::codegen::{http, Body as HttpBody, BoxFuture};
use tonic::metadata::MetadataMap;

use super::{multi_get, Reader};
use crate::engine::Engine;
use crate::errors::{panic_message, Failure};
use crate::grpc_threads::{self, status, Served};
use crate::shardpb::{LookupReply, LookupRequest};

const MULTI_GET: &str = "/qstate.shard.v1.Shard/MultiGet";
/// The largest message either way (the shard's own port's, `CHANNEL_OPTIONS`).
const MAX_MESSAGE: usize = 64 << 20;

/// What the reader's port serves with.
pub struct ReaderConfig {
    pub listener: StdListener,
    /// PEM certificate chain and key: TLS
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
    /// the cluster token a caller must send
    pub token: Option<String>,
    /// threads serving it (`grpc_threads`)
    pub threads: usize,
}

/// The running port; dropping it (or `stop`) ends it.
pub struct ReaderServer {
    pub reader: Arc<Reader>,
    served: Served,
}

impl ReaderServer {
    pub fn start(engine: Arc<Engine>, reader: Reader, cfg: ReaderConfig) -> std::io::Result<ReaderServer> {
        let reader = Arc::new(reader);
        let svc = Svc(Arc::new(Inner { engine, reader: reader.clone(), token: cfg.token }));
        let served = grpc_threads::serve("qstate-reader", cfg.listener, cfg.threads, cfg.tls, svc)?;
        Ok(ReaderServer { reader, served })
    }

    pub fn stop(&mut self) {
        self.served.stop();
    }
}

struct Inner {
    engine: Arc<Engine>,
    reader: Arc<Reader>,
    token: Option<String>,
}

impl Inner {
    fn admits(&self, meta: &MetadataMap) -> bool {
        let Some(want) = &self.token else { return true };
        let got = meta.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        got.is_some_and(|g| g.as_bytes().ct_eq(want.as_bytes()).into())
    }
}

#[derive(Clone)]
struct Svc(Arc<Inner>);

/// One MultiGet call (tonic's unary form).
struct Call(Arc<Inner>);

impl tower_service::Service<tonic::Request<LookupRequest>> for Call {
    type Response = tonic::Response<LookupReply>;
    type Error = tonic::Status;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<LookupRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            if !inner.admits(req.metadata()) {
                return Err(tonic::Status::unauthenticated("this shard's reader asks for the cluster token"));
            }
            let (engine, reader) = (inner.engine.clone(), inner.reader.clone());
            // a panic in a read (a planted one, a bug) answers this call, never ends the port
            let task = tokio::spawn(async move { multi_get(&engine, &reader, req.into_inner()).await });
            match task.await {
                Ok(Ok(reply)) => Ok(tonic::Response::new(reply)),
                Ok(Err(f)) => Err(status(&f)),
                Err(j) => {
                    inner.reader.panics.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let what = if j.is_panic() { panic_message(&*j.into_panic()) } else { String::new() };
                    Err(status(&Failure::engine(format!(
                        "the shard's reader failed on this call ({what}); it goes on"
                    ))))
                }
            }
        })
    }
}

impl<B> tower_service::Service<http::Request<B>> for Svc
where
    B: HttpBody + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move {
            if req.uri().path() != MULTI_GET {
                let s = tonic::Status::unimplemented(format!(
                    "{} is not served by the shard's reader: ask the shard server's own port",
                    req.uri().path()
                ));
                return Ok(s.into_http());
            }
            let codec = tonic_prost::ProstCodec::<LookupReply, LookupRequest>::default();
            let mut grpc =
                tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(MAX_MESSAGE), Some(MAX_MESSAGE));
            Ok(grpc.unary(Call(inner), req).await)
        })
    }
}
