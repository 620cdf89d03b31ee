//! Keeps each developer connection on the event loop that serves it.
//!
//! Pingora accepts on one worker thread and hands each new connection to a worker chosen at
//! random (`pingora_runtime::current_handle`), but the socket stays registered with the
//! accepting thread's reactor. With two workers, half the connections then had every readiness
//! event (each request arriving, each write becoming possible) seen by one thread's epoll and
//! passed to the other thread with an eventfd write and a wake-up (visible as eventfd writes
//! per request under `perf stat -e syscalls:sys_enter_write`).
//!
//! [`ThreadAffine`] moves a new connection's socket to the reactor of the worker that serves
//! it: it duplicates the descriptor, registers the duplicate with the current worker and drops
//! the original, which takes it out of the accepting reactor. Pingora's stream built around the
//! duplicate has no buffers (Pingora keeps their setter to itself), so the listener's write
//! buffer is put back in front of it; reads go straight into Pingora's own request buffer.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::protocols::l4::stream::Stream as TcpStream;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora_core::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter, ReadBuf};

use crate::conn_limits::{Limiter, Phase, Verdict, Watch};

/// A `ServerApp` whose connections are served by the worker their socket is registered with,
/// each one counted and watched by the connection limits ([`crate::conn_limits`]) when
/// [`ThreadAffine::limited`].
pub struct ThreadAffine<A> {
    inner: Arc<A>,
    write_buffer: usize,
    limits: Option<Limits>,
}

/// The connection limits of a listener.
struct Limits {
    limiter: Arc<Limiter>,
    /// The listener's name, for the refusal log line.
    name: &'static str,
    /// The listener's answer to a request head over the cap.
    too_large: &'static [u8],
}

impl<A> ThreadAffine<A> {
    /// Wraps `inner`; `write_buffer` is the size of the write buffer put in front of each moved
    /// connection. The listener itself should be unbuffered: its buffers are dropped with the
    /// original stream.
    pub fn new(inner: A, write_buffer: usize) -> Self {
        ThreadAffine {
            inner: Arc::new(inner),
            write_buffer,
            limits: None,
        }
    }

    /// Counts and watches every connection under `limiter`. The served app must move each
    /// request through its phases ([`set_phase`]): the head phase never ends by itself.
    pub fn limited(
        mut self,
        limiter: Arc<Limiter>,
        name: &'static str,
        too_large: &'static [u8],
    ) -> Self {
        self.limits = Some(Limits {
            limiter,
            name,
            too_large,
        });
        self
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for ThreadAffine<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A kept-alive connection comes back as the `Moved` stream: moved (and counted) once
        // only, and idle until its next request's first byte.
        let stream = match stream.as_any().downcast_ref::<Moved>() {
            Some(moved) => {
                if let Some(watch) = &moved.watch {
                    watch.set_phase(Phase::Idle);
                }
                stream
            }
            None => {
                let watch = match &self.limits {
                    Some(limits) => {
                        let accepted = tokio::time::Instant::now();
                        let peer = stream
                            .get_socket_digest()
                            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()));
                        // Refused: closed at once, before anything is read or allocated for it.
                        let slot = limits.limiter.admit(peer, limits.name)?;
                        Some(Watch::new(slot, accepted, limits.too_large))
                    }
                    None => None,
                };
                move_here(stream, self.write_buffer, watch)?
            }
        };
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// Re-registers a freshly accepted TCP stream with the current worker's reactor, under
/// `watch`. Any other stream (TLS) is left as it was, unwatched. `None` when the descriptor
/// cannot be duplicated (out of descriptors): the connection is closed.
fn move_here(stream: Stream, write_buffer: usize, watch: Option<Watch>) -> Option<Stream> {
    let Some(accepted) = stream.as_any().downcast_ref::<TcpStream>() else {
        return Some(stream);
    };
    let fd = accepted.as_raw_fd();
    let established_ts = accepted.established_ts;
    let peer = accepted
        .get_socket_digest()
        .and_then(|d| d.peer_addr().cloned());
    // SAFETY: `stream` owns this descriptor and is alive here; the borrow ends with the
    // duplication.
    let duplicate = match unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            log::warn!("closing a new connection: cannot duplicate its descriptor: {e}");
            return None;
        }
    };
    // The duplicate shares the socket's open file description, so it is non-blocking already.
    let socket = match tokio::net::TcpStream::from_std(std::net::TcpStream::from(duplicate)) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("closing a new connection: cannot register it: {e}");
            return None;
        }
    };
    let mut moved = TcpStream::from(socket);
    moved.established_ts = established_ts;
    let digest = SocketDigest::from_raw_fd(moved.as_raw_fd());
    if let Some(peer) = peer {
        let _ = digest.peer_addr.set(Some(peer));
    }
    moved.set_socket_digest(digest);
    // Dropping the original deregisters it from the accepting reactor and closes its
    // descriptor; the connection lives on in the duplicate.
    drop(stream);
    Some(Box::new(Moved {
        io: BufWriter::with_capacity(write_buffer, moved),
        hold: AtomicBool::new(false),
        watch,
    }))
}

/// Moves the request on `stream` to `phase` (see [`crate::conn_limits`]); nothing for a stream
/// that is not watched.
pub fn set_phase(stream: &Stream, phase: Phase) {
    if let Some(Moved {
        watch: Some(watch), ..
    }) = stream.as_any().downcast_ref::<Moved>()
    {
        watch.set_phase(phase);
    }
}

/// Keeps what the next flush of `stream` would send in its write buffer, to go out with the
/// flush after it; false (and nothing changed) for a stream that is not a moved connection.
///
/// Why: Pingora flushes every chunk of a chunked answer, then writes the terminating
/// `0\r\n\r\n` and flushes again. When a stream's last events and its end arrive together,
/// that was two sends, each a loopback transmit and a wake-up of the client, for bytes that
/// are ready at once. Held, they leave in one. Only for a write that a flush follows at once
/// (the answer's end): nothing waits on the network in between.
pub fn hold_next_flush(stream: &Stream) -> bool {
    match stream.as_any().downcast_ref::<Moved>() {
        Some(moved) => {
            moved.hold.store(true, Ordering::Relaxed);
            true
        }
        None => false,
    }
}

/// A moved connection: Pingora's TCP stream behind a write buffer, whether the next flush is
/// held ([`hold_next_flush`]), and the connection's limits.
#[derive(Debug)]
struct Moved {
    io: BufWriter<TcpStream>,
    hold: AtomicBool,
    watch: Option<Watch>,
}

impl AsyncRead for Moved {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let Some(watch) = this.watch.as_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        watch.before_read();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => match watch.after_read(buf.filled().len() - before) {
                Verdict::Fine => Poll::Ready(Ok(())),
                Verdict::HeadTooLarge => {
                    // Best effort, straight to the socket (nothing of this request is in the
                    // write buffer yet): a small answer fits the socket's send buffer.
                    let _ = Pin::new(this.io.get_mut()).poll_write(cx, watch.too_large);
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "request head over server.limits.max_header_bytes",
                    )))
                }
            },
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match watch.on_pending(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Moved {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.hold.swap(false, Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for Moved {
    async fn shutdown(&mut self) {
        // Flushes what is buffered, then shuts the socket's write side, as Pingora's own does.
        let _ = AsyncWriteExt::shutdown(&mut self.io).await;
    }
}

impl UniqueID for Moved {
    fn id(&self) -> UniqueIDType {
        self.io.get_ref().id()
    }
}

impl Ssl for Moved {}

impl GetTimingDigest for Moved {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.io.get_ref().get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.io.get_ref().get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.io.get_ref().get_write_pending_time()
    }
}

impl GetProxyDigest for Moved {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.io.get_ref().get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.io.get_mut().set_proxy_digest(digest)
    }
}

impl GetSocketDigest for Moved {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.io.get_ref().get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.io.get_mut().set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for Moved {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.io.get_mut().try_peek(buf).await
    }
}

/// A request on this connection is over: until the next one starts, the connection is idle
/// (and closed after `server.limits.idle_timeout_seconds`). Not while its body is still
/// unread: Pingora may drain it before the next request, and those bytes are no head.
pub fn request_done(session: &mut crate::Session) {
    if !session.is_body_done() {
        return;
    }
    if let Some(stream) = session.stream() {
        set_phase(stream, crate::conn_limits::Phase::Idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use tokio::io::AsyncReadExt;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A connected pair on loopback: the client's end, and the accepted end, non-blocking as
    /// Pingora's listener leaves it.
    fn connected() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (socket, _) = listener.accept().expect("accept");
        socket.set_nonblocking(true).expect("non-blocking");
        (client, socket)
    }

    /// A connection accepted on one runtime and moved on another keeps working after the first
    /// runtime is gone, because it is registered with the second one's reactor (left where it
    /// was accepted, its I/O fails once that reactor has shut down). Its writes wait in the
    /// buffer until flushed, as with Pingora's own buffered stream.
    #[test]
    fn a_moved_connection_lives_on_the_serving_runtime() {
        let (mut client, socket) = connected();

        let accepting = runtime();
        let accepted: Stream = accepting.block_on(async {
            let socket = tokio::net::TcpStream::from_std(socket).expect("register");
            Box::new(TcpStream::from(socket))
        });
        drop(accepting);

        runtime().block_on(async move {
            let mut moved = move_here(accepted, 16 * 1024, None).expect("moved");
            assert!(moved.as_any().is::<Moved>(), "the stream was not moved");

            client.write_all(b"ping").expect("client write");
            let mut got = [0u8; 4];
            moved
                .read_exact(&mut got)
                .await
                .expect("read on the serving runtime");
            assert_eq!(&got, b"ping");

            moved.write_all(b"pong").await.expect("buffered write");
            client.set_nonblocking(true).expect("client non-blocking");
            let early = client.read(&mut got);
            assert_eq!(
                early.map_err(|e| e.kind()),
                Err(std::io::ErrorKind::WouldBlock),
                "bytes left the buffer before the flush"
            );
            moved.flush().await.expect("flush");
            client.set_nonblocking(false).expect("client blocking");
            client.read_exact(&mut got).expect("client read");
            assert_eq!(&got, b"pong");
        });
    }

    /// A held flush keeps the bytes buffered, once: the flush after it sends them together with
    /// what was written in between. A stream that was not moved cannot be held.
    #[test]
    fn a_held_flush_sends_with_the_next_one() {
        let (mut client, socket) = connected();

        runtime().block_on(async move {
            let accepted: Stream = Box::new(TcpStream::from(
                tokio::net::TcpStream::from_std(socket).expect("register"),
            ));
            assert!(!hold_next_flush(&accepted), "a stream not moved was held");
            let mut moved = move_here(accepted, 16 * 1024, None).expect("moved");

            assert!(hold_next_flush(&moved));
            moved.write_all(b"last events;").await.expect("write");
            moved.flush().await.expect("held flush");
            client.set_nonblocking(true).expect("client non-blocking");
            let mut got = [0u8; 17];
            assert_eq!(
                client.read(&mut got).map_err(|e| e.kind()),
                Err(std::io::ErrorKind::WouldBlock),
                "a held flush sent its bytes"
            );

            moved.write_all(b"0\r\n\r\n").await.expect("write the end");
            moved.flush().await.expect("flush");
            client.set_nonblocking(false).expect("client blocking");
            client.read_exact(&mut got).expect("client read");
            assert_eq!(&got, b"last events;0\r\n\r\n");

            // Held once only: the next flush sends.
            moved.write_all(b"more").await.expect("write");
            moved.flush().await.expect("flush");
            let mut more = [0u8; 4];
            client.read_exact(&mut more).expect("client read");
            assert_eq!(&more, b"more");
        });
    }
}
