//! `yarl-s3-app`: the S3-style application behind nginx in `make run`; see the library docs.

use anyhow::Context;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use yarl_s3_app::store::{Limits, Store};
use yarl_s3_app::AppState;
use yarl_tower::Yarl;

/// An S3-style object store that accounts each handler's YARL quota.
#[derive(Parser, Debug)]
#[command(version)]
struct Config {
    /// Address to listen on.
    #[arg(long, env = "S3_APP_LISTEN", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// A root server to sync with (repeat, or separate with commas).
    #[arg(long = "root", env = "YARL_ROOTS", value_delimiter = ',')]
    roots: Vec<String>,
    /// File with the bearer token for the roots (their --sync-token-file).
    #[arg(long, env = "YARL_SYNC_TOKEN_FILE")]
    sync_token_file: Option<PathBuf>,
    /// PEM file of the CA certificates that verify https:// roots.
    #[arg(long, env = "YARL_SYNC_CA")]
    sync_ca: Option<PathBuf>,
    /// How often to sync with the roots.
    #[arg(long, env = "YARL_SYNC_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    sync_interval: Duration,
    /// Timeout of one sync call to one root.
    #[arg(long, env = "YARL_SYNC_TIMEOUT", default_value = "500ms", value_parser = humantime::parse_duration)]
    sync_timeout: Duration,
    /// Virtual-host requests are <bucket>.<domain>.
    #[arg(long, default_value = "s3.example.net")]
    domain: String,
    /// Largest object, bytes.
    #[arg(long, default_value_t = Limits::default().max_object_bytes)]
    max_object_bytes: usize,
    /// Most objects in one bucket.
    #[arg(long, default_value_t = Limits::default().max_objects)]
    max_objects: usize,
    /// Most buckets.
    #[arg(long, default_value_t = Limits::default().max_buckets)]
    max_buckets: usize,
    /// Most bytes of all objects together.
    #[arg(long, default_value_t = Limits::default().max_total_bytes)]
    max_total_bytes: usize,
    /// Print one JSON line per request on stdout.
    #[arg(long)]
    access_log: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let c = Config::parse();
    let mut b = Yarl::builder()
        .roots(c.roots.iter().map(|r| r.trim()).filter(|r| !r.is_empty()))
        .interval(c.sync_interval)
        .timeout(c.sync_timeout);
    if let Some(path) = &c.sync_token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the sync token file {}", path.display()))?;
        b = b.token(token.trim());
    }
    if let Some(ca) = c.sync_ca {
        b = b.ca_file(ca);
    }
    let yarl = b.start().context("cannot start the limiter")?;
    let limits = Limits {
        max_buckets: c.max_buckets,
        max_objects: c.max_objects,
        max_object_bytes: c.max_object_bytes,
        max_total_bytes: c.max_total_bytes,
    };
    let state = AppState { store: Arc::new(Store::new(limits)), yarl: yarl.clone() };
    let svc = yarl_s3_app::service(state, c.domain.clone(), c.access_log);
    let listener = tokio::net::TcpListener::bind(c.listen)
        .await
        .with_context(|| format!("cannot listen on {}", c.listen))?;
    eprintln!(
        "yarl-s3-app: listening on {}, buckets at <bucket>.{} or /<bucket>, roots {:?}",
        c.listen, c.domain, c.roots
    );
    axum::serve(listener, tower::make::Shared::new(svc))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // One last sync round: what this process counted reaches the roots before it exits.
    let status = yarl.shutdown().await;
    let ok = status.iter().flat_map(|s| &s.roots).filter(|r| r.ok == Some(true)).count();
    eprintln!("yarl-s3-app: stopped (last sync reached {ok} root(s))");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
