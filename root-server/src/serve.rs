//! The accept loop: plain HTTP or HTTPS, with the limits `axum::serve` does not have.
//!
//! * **Connections** are capped ([`ServeOptions::max_connections`]); past the cap a new
//!   connection is closed at once rather than left waiting in the kernel's backlog.
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
use std::future::Future;
use std::net::SocketAddr;
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
    /// How long open connections get to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            tls: None,
            header_timeout: Duration::from_secs(10),
            max_connections: 4_096,
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
        let _ = tcp.set_nodelay(true);
        let watcher = graceful.watcher();
        let app = app.clone();
        let opts = opts.clone();
        tokio::spawn(async move {
            let _slot = slot;
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
