//! The Python app behind the front: FastAPI served by uvicorn on a private Unix socket (in a
//! 0700 folder only this process's user can enter). A request the front does not answer is
//! sent there as it came (less the hop-by-hop headers) and its answer streamed back as it
//! is made: a watch's events pass one by one, a slow client slows the app's sends, and a
//! client that goes away closes the app's request (docs/architecture.md §5).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::http::request::Parts;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

use crate::errors::Failure;

/// A Unix stream the pooling client can hold.
pub struct Unix(TokioIo<UnixStream>);

impl Connection for Unix {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Unix {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Unix {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Connections to the app's Unix socket (HTTP/1.1 for the HTTP port's app, HTTP/2 for the
/// gRPC port's: `grpc_port`).
#[derive(Clone)]
pub struct Connector(Arc<PathBuf>);

impl Connector {
    pub fn new(socket: PathBuf) -> Connector {
        Connector(Arc::new(socket))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Unix;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Unix>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(Unix(TokioIo::new(UnixStream::connect(&*path).await?))) })
    }
}

pub struct Upstream {
    client: Client<Connector, Full<Bytes>>,
}

const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"];

impl Upstream {
    pub fn new(socket: PathBuf) -> Upstream {
        let client = Client::builder(TokioExecutor::new())
            .set_host(false)
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(Connector::new(socket));
        Upstream { client }
    }

    /// The app's answer to the request, streamed; a 503 saying so when the app cannot be
    /// reached (it is starting or stopping).
    pub async fn forward(&self, mut parts: Parts, body: Bytes) -> Response<Either<Full<Bytes>, Incoming>> {
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let uri: Uri = match format!("http://qstate-app{pq}").parse() {
            Ok(u) => u,
            Err(_) => return unreachable_app(),
        };
        for h in HOP_BY_HOP {
            parts.headers.remove(h);
        }
        parts.headers.remove(TRANSFER_ENCODING);
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        if body.is_empty() && matches!(parts.method, hyper::Method::GET | hyper::Method::HEAD) {
            parts.headers.remove(CONTENT_LENGTH);
        }
        parts.uri = uri;
        parts.version = hyper::Version::HTTP_11;
        let req = Request::from_parts(parts, Full::new(body));
        match self.client.request(req).await {
            Ok(mut resp) => {
                resp.headers_mut().remove(CONNECTION);
                resp.map(Either::Right)
            }
            Err(_) => unreachable_app(),
        }
    }
}

fn unreachable_app() -> Response<Either<Full<Bytes>, Incoming>> {
    let f = Failure::unavailable(
        "this router's application is not answering (starting or stopping); retry".to_string(),
        1.0,
        "app",
        None,
        None,
    );
    let mut r = Response::new(Either::Left(Full::new(Bytes::from(f.body()))));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (k, v) in f.headers() {
        if let Ok(v) = HeaderValue::from_str(&v) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}
