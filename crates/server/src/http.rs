//! The HTTP layer under the router: the accept loop with its connection cap, hyper's header
//! read timeout, the stall limit on clients that stop reading, JSON bodies for the answers hyper writes itself, and graceful shutdown.
//!
//! Shutdown runs in phases ([`Phase`]): on the signal the server drains (it still accepts, so
//! `/health` can answer 503, but refuses new work), in-flight generations get up to
//! `shutdown_grace` to finish; then the rest are cancelled (streams end with a `server_shutdown`
//! error event and `[DONE]`, waiting requests get 503), connections close and `serve_on` returns.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

use crate::error::ApiError;
use crate::AppState;

/// Where the server is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    /// The signal came: no new work, `/health` says 503, in-flight generations continue.
    Draining,
    /// The grace is over: the remaining generations are cancelled and connections close.
    Closing,
}

/// The shutdown phase and the count of generations in flight, shared by every request.
pub struct Lifecycle {
    phase: watch::Sender<Phase>,
    in_flight: Arc<AtomicUsize>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle { phase: watch::Sender::new(Phase::Running), in_flight: Arc::new(AtomicUsize::new(0)) }
    }
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }
    fn set(&self, p: Phase) {
        self.phase.send_if_modified(|cur| {
            let changed = *cur < p;
            if changed {
                *cur = p;
            }
            changed
        });
    }
    /// Counts one generation until the guard is dropped, unless `cap` are in flight already.
    pub(crate) fn generation(&self, cap: usize) -> Option<InFlight> {
        self.in_flight.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < cap).then_some(n + 1)).ok()?;
        Some(InFlight(self.in_flight.clone()))
    }
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// One generation in flight (see [`Lifecycle::generation`]).
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves once the phase reaches `p` (at once if it has; never if the sender is gone first).
pub(crate) async fn reached(rx: &mut watch::Receiver<Phase>, p: Phase) {
    if rx.wait_for(|cur| *cur >= p).await.is_err() {
        std::future::pending::<()>().await
    }
}

/// How long closing waits for connections to finish writing their last responses.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// Unsent bytes a socket holds before writes wait (`TCP_NOTSENT_LOWAT`). Without it Linux
/// autotunes a socket's send buffer to megabytes (on loopback at once), so a client that stops
/// reading would take thousands of tokens before its writes wait and the stall limit starts.
#[cfg(any(target_os = "linux", target_os = "android"))]
const NOTSENT_LOWAT: u32 = 16 << 10;

fn limit_unsent(stream: &TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_notsent_lowat(NOTSENT_LOWAT) {
        tracing::debug!(error = %e, "cannot set TCP_NOTSENT_LOWAT");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = stream;
}

/// Connections past the cap that are still answered 503 at once (more are closed unanswered).
const MAX_REFUSING: usize = 64;

/// Serve until `shutdown` resolves, then drain, cancel what is left after the grace, and return.
pub async fn serve_on(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let app = crate::router(state.clone());
    let max_conns = state.cfg.max_connections.max(1);
    let conns = Arc::new(Semaphore::new(max_conns));
    let acceptor = tokio::spawn(accept_loop(listener, state.clone(), app, conns.clone()));

    shutdown.await;
    let grace = state.cfg.shutdown_grace;
    tracing::info!(in_flight = state.life.in_flight(), grace_s = grace.as_secs_f64(), "shutting down: draining");
    state.life.set(Phase::Draining);
    let deadline = tokio::time::Instant::now() + grace;
    while state.life.in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = state.life.in_flight();
    if left > 0 {
        tracing::warn!(cancelled = left, "shutdown grace over: cancelling the generations still running");
    }
    state.life.set(Phase::Closing);
    acceptor.abort();
    let _ = acceptor.await;
    let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
    while conns.available_permits() < max_conns && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!("shut down");
    Ok(())
}

async fn accept_loop(listener: TcpListener, state: AppState, app: axum::Router, conns: Arc<Semaphore>) {
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin or stop.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        limit_unsent(&stream);
        match conns.clone().try_acquire_owned() {
            Ok(permit) => {
                let (state, app) = (state.clone(), app.clone());
                tokio::spawn(async move {
                    serve_connection(stream, remote, state, app).await;
                    drop(permit);
                });
            }
            Err(_) => match refusing.clone().try_acquire_owned() {
                Ok(permit) => {
                    tracing::warn!(%remote, "connection cap reached: answering 503");
                    let header_timeout = state.cfg.header_timeout;
                    tokio::spawn(async move {
                        refuse_connection(stream, header_timeout).await;
                        drop(permit);
                    });
                }
                Err(_) => drop(stream),
            },
        }
    }
}

fn http1(header_timeout: Duration) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new());
    b.header_read_timeout(if header_timeout.is_zero() { None } else { Some(header_timeout) });
    b
}

async fn serve_connection(stream: TcpStream, remote: SocketAddr, state: AppState, app: axum::Router) {
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(remote));
        app.clone().oneshot(req.map(Body::new))
    });
    let io = TokioIo::new(JsonAutoErrors::new(StallLimit::new(stream, state.cfg.stall_timeout)));
    let conn = http1(state.cfg.header_timeout).serve_connection(io, svc);
    tokio::pin!(conn);
    let mut phase = state.life.subscribe();
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
            return;
        }
        _ = reached(&mut phase, Phase::Closing) => {}
    }
    // Closing: finish the response being written (streams end with their error event), then close.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(CLOSE_WAIT, conn).await;
}

/// Past the connection cap: read the request (briefly), answer 503 and close.
async fn refuse_connection(stream: TcpStream, header_timeout: Duration) {
    let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The server has too many open connections; retry later.").code("too_many_connections");
        e.retry_after = Some(1);
        let mut r = if crate::anthropic::is_messages_path(req.uri().path()) { crate::anthropic::error_response(&e) } else { e.into_response() };
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        Ok::<_, Infallible>(r)
    });
    let t = header_timeout.min(Duration::from_secs(2)).max(Duration::from_millis(100));
    let mut b = http1(t);
    b.keep_alive(false);
    let conn = b.serve_connection(TokioIo::new(JsonAutoErrors::new(StallLimit::new(stream, t))), svc);
    let _ = tokio::time::timeout(t * 2, conn).await;
}

/// The answer for a status hyper writes itself, as OpenAI's error object.
fn auto_error(status: u16) -> Option<ApiError> {
    let (code, msg, sc) = match status {
        400 => ("bad_request", "The request is not valid HTTP/1.1.", StatusCode::BAD_REQUEST),
        414 => ("uri_too_long", "The request's URI is longer than this server accepts.", StatusCode::URI_TOO_LONG),
        431 => ("headers_too_large", "The request's headers are larger than this server accepts.", StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        _ => return None,
    };
    Some(ApiError::new(sc, "invalid_request_error", msg).code(code))
}

/// hyper answers requests it cannot parse (400, 414, 431) itself, with an empty body that no
/// service sees. Such a response is recognised as it is written (a whole head of one of those
/// statuses with no Content-Type, which the router's responses always have) and replaced by
/// the same status with the JSON error object.
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let status: u16 = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    let e = auto_error(status)?;
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    if head_end + 4 != buf.len() {
        return None;
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    if head.contains("\r\ncontent-type:") || head.contains("\r\ntransfer-encoding:") {
        return None;
    }
    let body = e.body().to_string();
    let head_text = String::from_utf8_lossy(&buf[..head_end]);
    let date = head_text.lines().find(|l| l.to_ascii_lowercase().starts_with("date:")).map(|l| format!("{l}\r\n"));
    let reason = e.status.canonical_reason().unwrap_or("");
    Some(
        format!("HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{}\r\n{body}", body.len(), date.unwrap_or_default())
            .into_bytes(),
    )
}

/// A socket whose automatic hyper error answers go out as JSON (see [`replacement`]).
pub(crate) struct JsonAutoErrors<T> {
    inner: T,
    pending: Vec<u8>,
    written: usize,
}

impl<T> JsonAutoErrors<T> {
    pub(crate) fn new(inner: T) -> Self {
        JsonAutoErrors { inner, pending: Vec::new(), written: 0 }
    }
}

impl<T: AsyncWrite + Unpin> JsonAutoErrors<T> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonAutoErrors<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonAutoErrors<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(r) = replacement(buf) {
            self.pending = r;
            self.written = 0;
            // Accepted: what is left goes out on the next write, flush or shutdown.
            if let Poll::Ready(Err(e)) = self.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A socket whose writes fail once one has waited `limit` for the peer to take data (the
/// socket's send buffer full because the client stopped reading). hyper then ends the
/// connection and drops the response body, which cancels its generation and frees the session,
/// as a disconnect does. Any progress restarts the clock; a zero limit never fails.
pub(crate) struct StallLimit<T> {
    inner: T,
    limit: Option<Duration>,
    /// Running while a write (or flush) is pending; reset when one completes.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> StallLimit<T> {
    pub(crate) fn new(inner: T, limit: Duration) -> Self {
        StallLimit { inner, limit: (!limit.is_zero()).then_some(limit), timer: None }
    }

    fn watch<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let Some(limit) = self.limit else { return Poll::Pending };
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timer = None;
        tracing::info!(stall_s = limit.as_secs_f64(), "client stopped reading: closing the connection");
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading the response")))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallLimit<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallLimit<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, r)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, r)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C still shuts down");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::replacement;

    #[test]
    fn only_hyper_automatic_heads_are_replaced() {
        let hyper_414 = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n";
        let r = String::from_utf8(replacement(hyper_414).expect("replaced")).unwrap();
        assert!(r.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{r}");
        assert!(r.contains("content-type: application/json"), "{r}");
        assert!(r.contains("date: Thu, 01 Jan 2026"), "{r}");
        let body: serde_json::Value = serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "uri_too_long", "{r}");
        // The router's own responses carry a Content-Type (and a body): left alone.
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}").is_none());
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n").is_some());
    }
}
