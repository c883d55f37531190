//! A connection closed gracefully: when hyper is done with a connection whose client still
//! has bytes on the way (a body hyper refused to read, such as a chunked body of an HTTP/1.0
//! request, answered 400), closing the socket at once makes the kernel reset it, and the
//! client loses the answer it was about to read. So the socket lingers: its write side is shut
//! (the client sees the answer end), what still arrives is read and dropped, for at most
//! `LINGER` or `LINGER_BYTES`, then it closes (a lingering close, as Apache's httpd does).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

pub struct Lingering(Option<TcpStream>);

impl Lingering {
    pub fn new(stream: TcpStream) -> Lingering {
        Lingering(Some(stream))
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.0.as_mut().expect("a stream until dropped")
    }
}

impl AsyncRead for Lingering {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.stream()).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_shutdown(cx)
    }

    // not vectored: hyper then flattens an answer's head and body into one buffer and one
    // `write` (one `sendto` a request under strace), as the front did before `pipeline_flush`
    // was dropped, not a `writev` of the two (loadtest/results/router.md, 2026-12-02 16:07)
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(mut stream) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let _ = stream.shutdown().await;
            let drain = async {
                let mut buf = vec![0u8; 16 << 10];
                let mut seen = 0;
                while seen < LINGER_BYTES {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen += n,
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
        });
    }
}
