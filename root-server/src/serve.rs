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
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
