//! `yarl-root`: the YARL root server. Run `yarl-root --help` for the flags; every flag is
//! also read from the environment as `YARL_<FLAG>` (e.g. `YARL_DB`).

use anyhow::Context as _;
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tracing_subscriber::EnvFilter;
use yarl_root::{app, db, AppState, Settings};

/// The YARL root server: sums limiters' counters and serves quotas from a database.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "YARL_LISTEN", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Quota database: sqlite://PATH (created on first start) or postgres://USER:PASS@HOST/DB.
    #[arg(long, env = "YARL_DB", default_value = "sqlite://yarl.db")]
    db: String,
    /// How often quotas are re-read from the database (e.g. 1s, 500ms, 2m).
    #[arg(long, env = "YARL_POLL_INTERVAL", default_value = "1s", value_parser = parse_interval)]
    poll_interval: Duration,
    /// File holding the bearer token the admin routes require.
    #[arg(long, env = "YARL_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding the bearer token POST /v1/sync requires.
    #[arg(long, env = "YARL_SYNC_TOKEN_FILE")]
    sync_token_file: Option<PathBuf>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 1s, 500ms, 2m)"))?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err("must be from 10ms to 1h".into());
    }
    Ok(d)
}

fn read_token(path: &Option<PathBuf>, what: &str) -> anyhow::Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} token file {}", path.display()))?;
    let token = raw.trim();
    anyhow::ensure!(!token.is_empty(), "the {what} token file {} is empty", path.display());
    anyhow::ensure!(
        token.bytes().all(|b| b.is_ascii_graphic()),
        "the {what} token in {} must be printable ASCII without spaces",
        path.display()
    );
    Ok(Some(token.to_owned()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        // Colour only on a terminal: under systemd or docker the codes end up in the journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let settings = Settings {
        poll_interval: args.poll_interval,
        admin_token: read_token(&args.admin_token_file, "admin")?,
        sync_token: read_token(&args.sync_token_file, "sync")?,
        ..Settings::default()
    };
    let store = db::open(&args.db)
        .await
        .with_context(|| format!("opening the quota database {}", db::redact(&args.db)))?;
    let state = AppState::new(store, settings);
    let loaded = state.load().await.context("loading quotas")?;
    tracing::info!(rows = loaded, epoch = state.epoch(), db = %db::redact(&args.db), "quotas loaded");
    let _background = state.spawn_background();

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(addr = %args.listen, "yarl-root listening");
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown_signal()).await?;
    tracing::info!("yarl-root stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_interval("0s").unwrap_err().contains("10ms to 1h"));
        assert!(parse_interval("soon").unwrap_err().contains("e.g. 1s"));
    }

    #[test]
    fn flags_and_env() {
        let a = Args::try_parse_from(["yarl-root"]).unwrap();
        assert_eq!(a.listen.to_string(), "127.0.0.1:7700");
        assert_eq!((a.db.as_str(), a.poll_interval), ("sqlite://yarl.db", Duration::from_secs(1)));
        let e = Args::try_parse_from(["yarl-root", "--poll-interval", "fast"]).unwrap_err();
        assert!(e.to_string().contains("--poll-interval"), "{e}");
    }
}
