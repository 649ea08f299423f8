//! The accept loop: plain HTTP or HTTPS, with the limits `axum::serve` does not have.
//!
//! * **Connections** are capped ([`ServeOptions::max_connections`]), and so are those of one
//!   address ([`ServeOptions::max_connections_per_address`]; an IPv6 /64 counts as one
//!   address): past a cap a new connection is closed at once rather than left waiting in the
//!   kernel's backlog, so idle connections from one place cannot keep out the limiters.
//! * **Headers** must arrive within [`ServeOptions::header_timeout`]; hyper also applies it
//!   to an idle keep-alive connection waiting for its next request, so it is the idle
//!   timeout too. Bodies have their own deadline per route (see `crate::guard`).
//! * **TLS handshakes** must finish within the header timeout as well.
//! * **Shutdown**: the listener closes, connections finish the request they are in, and
//!   whatever is still open after [`ServeOptions::shutdown_grace`] is dropped, so a stop
//!   never takes longer than that whatever clients do.

use crate::tls::TlsFiles;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// Limits of the accept loop.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Serve HTTPS with these files.
    pub tls: Option<Arc<TlsFiles>>,
    /// Deadline for a TLS handshake and for a request's headers (and idle keep-alive).
    pub header_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
    /// Most open connections from one address (an IPv6 /64 counts as one): limiters behind
    /// one NAT address count together.
    pub max_connections_per_address: usize,
    /// How long open connections get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            tls: None,
            header_timeout: Duration::from_secs(10),
            max_connections: 4_096,
            max_connections_per_address: 512,
            shutdown_grace: Duration::from_secs(8),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains connections for at
/// most the grace period.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    let per_address = PerAddress::new(opts.max_connections_per_address);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::metrics::note_refused_connection();
            drop(tcp);
            continue;
        };
        let Some(mine) = per_address.enter(peer.ip()) else {
            crate::metrics::note_refused_connection();
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let watcher = graceful.watcher();
        let app = app.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            let _slot = (slot, mine);
            match &opts.tls {
                None => connection(tcp, peer, app, &opts, watcher).await,
                Some(files) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(files.config());
                    match tokio::time::timeout(opts.header_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => connection(tls, peer, app, &opts, watcher).await,
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(opts.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after {:?}; closing them", opts.shutdown_grace);
    }
}

/// Open connections per address, each held by a [`AddressSlot`].
#[derive(Clone)]
struct PerAddress {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    cap: usize,
}

/// One open connection of an address; dropping it frees its place.
struct AddressSlot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    addr: IpAddr,
}

impl PerAddress {
    fn new(cap: usize) -> Self {
        PerAddress { open: Arc::default(), cap }
    }

    /// A place for a connection from `ip`, if that address holds fewer than the cap. The
    /// table holds an entry per address with connections open, so at most
    /// `max_connections` entries.
    fn enter(&self, ip: IpAddr) -> Option<AddressSlot> {
        let addr = address_of(ip);
        let mut open = self.open.lock();
        let n = open.entry(addr).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(AddressSlot { open: self.open.clone(), addr })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

/// The address a connection counts against: IPv4 as it is (also when mapped into IPv6), an
/// IPv6 address by its /64, the smallest network one holder usually has.
fn address_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

async fn connection<IO>(
    io: IO,
    peer: SocketAddr,
    app: Router,
    opts: &ServeOptions,
    watcher: hyper_util::server::graceful::Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = app.map_request(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(Lingering::new(io)), TowerToHyperService::new(svc));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

/// Most of a body left unread by the answer that is read and dropped so the connection can
/// take the next request: hyper's own read buffer, so a body that was sent whole with its
/// headers is usually in already.
const DRAIN_BYTES: u64 = 64 * 1024;
/// Longest the rest of such a body is waited for.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// An answer given before the request's body was read to its end (401 before the token
/// layer lets the body through, 413 on a declared length, 415, a sync refused by the memory
/// gate): the rest of a small body is read and dropped, so the connection goes on; a larger
/// one, a chunked one, or one that does not come within [`DRAIN_TIME`] gets the answer
/// marked `Connection: close`. hyper closes such a connection after the answer but does not
/// say so (unless the rest was in its buffer already), and a client that pools it sends its
/// next request into a closed socket (hyper's client reports `IncompleteMessage`). With the
/// header the client opens a new connection; [`Lingering`] lets it finish sending first.
pub(crate) async fn close_if_body_left(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use http_body_util::BodyExt as _;
    use hyper::body::Body as _;
    use std::sync::atomic::Ordering;
    let watch = Arc::new(BodyWatch::default());
    watch.ended.store(req.body().is_end_stream(), Ordering::Relaxed);
    let req = req.map(|inner| axum::body::Body::new(Watched { inner, watch: watch.clone() }));
    let mut resp = next.run(req).await;
    if watch.ended.load(Ordering::Relaxed) {
        return resp;
    }
    let left = watch.left.lock().take();
    let drained = match left {
        Some(mut body) if body.size_hint().upper().is_some_and(|n| n <= DRAIN_BYTES) => {
            let drain = async {
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        return false;
                    }
                }
                true
            };
            tokio::time::timeout(DRAIN_TIME, drain).await.unwrap_or(false)
        }
        _ => false,
    };
    if !drained {
        resp.headers_mut()
            .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    resp
}

/// What [`close_if_body_left`] shares with the body it watches.
#[derive(Default)]
struct BodyWatch {
    ended: std::sync::atomic::AtomicBool,
    /// The body, handed back when it is dropped before its end.
    left: Mutex<Option<axum::body::Body>>,
}

/// A request body that records when it has been read to its end.
struct Watched {
    inner: axum::body::Body,
    watch: Arc<BodyWatch>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if !self.watch.ended.load(std::sync::atomic::Ordering::Relaxed) {
            *self.watch.left.lock() = Some(std::mem::take(&mut self.inner));
        }
    }
}

impl hyper::body::Body for Watched {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.watch.ended.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Longest a closing connection reads and drops what the client still sends: a body the
/// size of the largest a route refuses (256 MiB) drains in that time at 500 Mbit/s.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// A closing connection on which nothing arrives for this long closes at once.
const LINGER_IDLE: Duration = Duration::from_secs(1);
/// ... and one on which nothing arrived at all closes after this: a client idle on a
/// keep-alive connection when the server stops has nothing more to send, and the stop
/// should not wait a second for it.
const LINGER_FIRST: Duration = Duration::from_millis(100);

/// A connection that, when hyper closes it, first sends its FIN and then reads and drops
/// what the client still sends, for at most [`LINGER_TIME`] (or until nothing came for
/// [`LINGER_IDLE`], [`LINGER_FIRST`] if nothing came at all), before the socket closes. An answer sent before the body was read (413 on a declared length, 401)
/// would otherwise meet a client still sending: closing a socket with unread data sends a
/// reset, and a client that gets it while writing reports a broken pipe instead of the
/// answer (hyper's client does; so does curl at times). nginx calls this lingering close.
/// The client's reading is not a way to hold the connection: it stays within the
/// connection caps, and within the shutdown grace when the server stops.
struct Lingering<IO> {
    io: IO,
    /// Once closing: the end of the linger, and the idle deadline.
    linger: Option<[std::pin::Pin<Box<tokio::time::Sleep>>; 2]>,
}

impl<IO> Lingering<IO> {
    fn new(io: IO) -> Self {
        Lingering { io, linger: None }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Lingering<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.linger.is_none() {
            std::task::ready!(std::pin::Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.linger = Some([
                Box::pin(tokio::time::sleep(LINGER_TIME)),
                Box::pin(tokio::time::sleep(LINGER_FIRST)),
            ]);
        }
        let Some([end, idle]) = this.linger.as_mut() else { unreachable!() };
        let mut scratch = [std::mem::MaybeUninit::<u8>::uninit(); 16 * 1024];
        loop {
            if end.as_mut().poll(cx).is_ready() || idle.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = tokio::io::ReadBuf::uninit(&mut scratch);
            match std::pin::Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                // The client closed (or failed): nothing left to wait for.
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    idle.as_mut().reset(tokio::time::Instant::now() + LINGER_IDLE)
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route that refuses a body by its declared length answers before reading it; the
    /// client, still sending, must get that answer and not a reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_still_sending_gets_the_early_answer() {
        let app = Router::new()
            .route(
                "/x",
                axum::routing::put(|| async { (axum::http::StatusCode::PAYLOAD_TOO_LARGE, "no") }),
            )
            .route(
                "/read",
                axum::routing::put(|b: axum::body::Bytes| async move { b.len().to_string() }),
            )
            .route("/get", axum::routing::get(|| async { "ok" }))
            .route(
                "/refuse",
                axum::routing::put(|| async { (axum::http::StatusCode::UNAUTHORIZED, "no") }),
            )
            .layer(axum::middleware::from_fn(close_if_body_left));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, app, ServeOptions::default(), std::future::pending()));
        let client = reqwest::Client::new();
        let mut failed = vec![];
        // Just over an admin route's limit, and past what a few socket buffers hold.
        for (i, len) in [(1 << 20) + 1; 20].into_iter().chain([16 << 20; 10]).enumerate() {
            let r = client.put(format!("http://{addr}/x")).body(vec![b'a'; len]).send().await;
            match r {
                Ok(r) if r.status() == 413 && r.headers()["connection"] == "close" => {}
                Ok(r) if r.status() == 413 => failed.push(format!("{i}: {:?}", r.headers())),
                Ok(r) => failed.push(format!("{i}: {}", r.status())),
                Err(e) => failed.push(format!("{i}: {e:?}")),
            }
        }
        assert!(failed.is_empty(), "{failed:?}");
        // Answers to requests whose body was read, or that had none, keep the connection,
        // and so do early answers to a small body (read and dropped after the answer).
        for (path, body) in [
            ("/get", None),
            ("/read", Some(vec![b'a'; 100_000])),
            ("/refuse", Some(vec![b'a'; 60_000])),
            ("/refuse", Some(vec![b'a'; 10])),
        ] {
            let url = format!("http://{addr}{path}");
            let r = match body {
                None => client.get(url).send().await.unwrap(),
                Some(b) => client.put(url).body(b).send().await.unwrap(),
            };
            assert!(r.status() == 200 || path == "/refuse" && r.status() == 401, "{path}");
            assert!(r.headers().get("connection").is_none(), "{path}: {:?}", r.headers());
        }
    }

    #[test]
    fn one_address_holds_at_most_its_cap_and_gets_places_back() {
        let p = PerAddress::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let (x, y) = (p.enter(a).unwrap(), p.enter(a).unwrap());
        assert!(p.enter(a).is_none(), "the third from one address");
        assert!(p.enter("10.0.0.2".parse().unwrap()).is_some(), "another address");
        drop(x);
        assert!(p.enter(a).is_some(), "a place freed");
        drop(y);
        // An IPv6 /64 is one address; a mapped IPv4 address is that IPv4 address.
        let (v6a, v6b): (IpAddr, IpAddr) =
            ("2001:db8::1".parse().unwrap(), "2001:db8::ffff:1".parse().unwrap());
        let _h = (p.enter(v6a).unwrap(), p.enter(v6b).unwrap());
        assert!(p.enter("2001:db8:0:0:1::2".parse().unwrap()).is_none());
        assert!(p.enter("2001:db8:0:1::1".parse().unwrap()).is_some(), "another /64");
        assert_eq!(address_of("::ffff:10.0.0.1".parse().unwrap()), a);
    }
}
