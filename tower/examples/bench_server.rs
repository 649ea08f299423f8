//! The servers `make bench-tower` measures (scripts/bench-tower.sh drives them with wrk):
//! the same axum hello-world on four loopback ports, served the same way
//! (`into_make_service_with_connect_info`, which tower-governor's peer-IP key needs):
//!
//! 1. `plain`: no layer;
//! 2. `governor`: tower-governor's documented keyed setup (`GovernorLayer` with the default
//!    peer-IP key extractor), a quota so large it never rejects; per process;
//! 3. `yarl1`: yarl-tower, every request accounted to one quota (a leaf with two
//!    ancestors), limiting cluster-wide: the limiter syncs with a real root every second;
//! 4. `yarl1m`: the same, a quota named by the request path, random across a million.
//!
//! Usage: `bench_server ROOT_URL QUOTAS PORT_PLAIN PORT_GOVERNOR PORT_YARL1 PORT_YARL1M`.
//! It waits (at most 10 minutes) until its limiter holds `QUOTAS` quotas from the root, then
//! listens on the four ports and prints `ready`. Ctrl-C or SIGTERM stops it, with the
//! limiter's last sync round. `BENCH_THREADS` sets the runtime's worker threads (default 1).

use axum::routing::get;
use axum::Router;
use http::request::Parts;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use yarl_tower::{Quotas, Yarl};

/// The leaf every `yarl1` request is accounted to (the same one `make bench-nginx` uses).
const ONE: &str = "s3_bucket-0123456_read";

async fn hello() -> &'static str {
    "Hello, World!"
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, quotas, ports @ ..] = args.as_slice() else {
        return Err(
            "usage: bench_server ROOT_URL QUOTAS PORT_PLAIN PORT_GOVERNOR PORT_YARL1 PORT_YARL1M"
                .into(),
        );
    };
    let quotas: u64 = quotas.parse()?;
    let ports: Vec<u16> = ports.iter().map(|p| p.parse()).collect::<Result<_, _>>()?;
    if ports.len() != 4 {
        return Err("four ports: plain, governor, yarl1, yarl1m".into());
    }
    let threads = std::env::var("BENCH_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?
        .block_on(serve(root.clone(), quotas, ports))
}

async fn serve(
    root: String,
    quotas: u64,
    ports: Vec<u16>,
) -> Result<(), Box<dyn std::error::Error>> {
    let yarl = Yarl::builder()
        .roots([root])
        .capacity(u32::try_from(quotas + quotas / 8)?.max(1024))
        .start()?;
    let start = Instant::now();
    while yarl.limiter().quota_count() < quotas {
        if start.elapsed() > Duration::from_secs(600) {
            return Err(format!(
                "the limiter holds {} of {quotas} quotas after 10 minutes",
                yarl.limiter().quota_count()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("bench_server: {quotas} quotas synced in {:.1} s", start.elapsed().as_secs_f64());

    let plain = Router::new().route("/{*path}", get(hello));
    // tower-governor's README setup: keyed by peer IP (the default extractor), per process.
    // One element per nanosecond and a huge burst: it decides on every request and never
    // rejects, like the yarl quotas below.
    let governor = Router::new().route("/{*path}", get(hello)).layer(GovernorLayer::new(
        GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(u32::MAX)
            .finish()
            .ok_or("governor config")?,
    ));
    let yarl1 = Router::new().route("/{*path}", get(hello)).layer(yarl.layer(
        |_: &Parts, q: &mut Quotas| {
            q.account(ONE, 1);
        },
    ));
    let yarl1m = Router::new().route("/{*path}", get(hello)).layer(yarl.layer(
        |req: &Parts, q: &mut Quotas| {
            q.account(req.uri.path().trim_start_matches('/').to_owned(), 1);
        },
    ));

    let mut servers = tokio::task::JoinSet::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    for (port, app) in ports.into_iter().zip([plain, governor, yarl1, yarl1m]) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let mut stop = stop_rx.clone();
        servers.spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await
        });
    }
    println!("ready");
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    while servers.join_next().await.is_some() {}
    let status = yarl.shutdown().await;
    let rounds = status.map_or(0, |s| s.rounds);
    eprintln!("bench_server: stopped after {rounds} sync rounds");
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
