//! `yarl-root`: the YARL root server. Run `yarl-root --help` for the flags; every flag is
//! also read from the environment as `YARL_<FLAG>` (e.g. `YARL_DB`).
//!
//! `yarl-root quotas export|apply` is a client of a running root instead (quotas as code,
//! see `yarl_root::quotas_file`).

use anyhow::Context as _;
use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::EnvFilter;
use yarl_root::quotas_file::{self, Client};
use yarl_root::serve::{serve, ServeOptions};
use yarl_root::tls::TlsFiles;
use yarl_root::{app, db, AppState, Settings};

// A root's state is a million-quota hash table, counters, a change log and per-session
// interest: hundreds of MiB touched at random, one cache miss after another on every delta.
// With 4 KiB pages nearly each of those misses also misses the TLB and walks the page
// table; with 2 MiB pages it mostly does not, and those walks are a large share of a sync's
// CPU (`cargo bench -p yarl-core --bench root` shows it). glibc's malloc only takes that
// setting from the environment (GLIBC_TUNABLES) before the process starts; jemalloc reads
// it from this symbol.
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: every heap mapping advised for transparent huge pages (Linux's
/// default THP mode, `madvise`, honours it; `never` ignores it harmlessly).
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"thp:always,metadata_thp:auto\0";

/// The YARL root server: sums limiters' counters and serves quotas from a database.
#[derive(Debug, Parser)]
// A `quotas` command is a client: it takes none of the server's flags (see `parse_args`
// for their variables).
#[command(version, about, args_conflicts_with_subcommands = true)]
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
    /// How long a sync waits for its turn before 503 + Retry-After: keep it under the
    /// limiters' sync timeout (nginx `yarl_sync_timeout`, 500ms by default).
    #[arg(long, env = "YARL_SYNC_QUEUE_WAIT", default_value = "250ms", value_parser = parse_interval)]
    sync_queue_wait: Duration,
    /// Syncs decoded and applied at once (default: one per core plus one per stripe, at
    /// least 2; with one stripe, one per core).
    #[arg(long, env = "YARL_SYNC_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..=1024))]
    sync_concurrency: Option<u16>,
    /// States the counters are split into, each behind its own lock, so that syncs apply
    /// on that many cores at once (1 to 64; default: one per core, at most 4).
    #[arg(long, env = "YARL_STRIPES", value_parser = clap::value_parser!(u32).range(1..=64))]
    stripes: Option<u32>,
    /// Most open connections from one address (an IPv6 /64 counts as one address), of the
    /// 4,096 a root holds: limiters behind one NAT address count together.
    #[arg(long, env = "YARL_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_connections_per_address: u32,
    /// File holding the bearer token the admin routes require.
    #[arg(long, env = "YARL_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding the bearer token POST /v1/sync requires.
    #[arg(long, env = "YARL_SYNC_TOKEN_FILE")]
    sync_token_file: Option<PathBuf>,
    /// PEM certificate chain: serve HTTPS (needs --tls-key). Re-read on SIGHUP or when the
    /// file changes.
    #[arg(long, env = "YARL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "YARL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Listen on a non-loopback address without both token files: anyone who reaches the
    /// port can change quotas and counters. Logged as a warning at every start.
    #[arg(long, env = "YARL_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// The shard of the counter space this root aggregates, INDEX/COUNT (e.g. 0/2), when
    /// the counters are split across groups of roots; every root of shard INDEX gets the
    /// same value, and limiters list the roots per shard. Quotas are served whole.
    #[arg(long, env = "YARL_SHARD")]
    shard: Option<yarl_core::Shard>,
    /// How long after its first sync this root takes limiters' hints (their view of the
    /// counters, which restores a restarted or new root); later hints are refused, since a
    /// forged one could hold a long window's counter at its ceiling. Raise it if limiters
    /// back off longer than this from a root that was down.
    #[arg(long, env = "YARL_HINT_WINDOW", default_value = "2m", value_parser = parse_interval)]
    hint_window: Duration,
    /// Which of the roots of its shard this one is, INDEX/COUNT (e.g. 1/2 for the second of
    /// two): each root grants limiters shares of its own part of every quota's
    /// `max_in_flight` (the parts sum to the cap), so every root of a shard needs its own
    /// index and the same count, the number of roots limiters list for the shard. Absent:
    /// the only root, which owns all of each cap.
    #[arg(long, env = "YARL_REPLICA")]
    replica: Option<yarl_core::Shard>,
    /// How long a share of a `max_in_flight` quota holds after the sync it answered: a
    /// limiter that stops syncing (dead, or cut off) stops admitting on it then, and this
    /// root hands it to others (200ms to 60s; a few sync intervals).
    #[arg(long, env = "YARL_IN_FLIGHT_LEASE", default_value = "3s", value_parser = parse_lease)]
    in_flight_lease: Duration,
    /// A live root of this root's shard to copy the counters and limiter sessions from at
    /// start (its URL, e.g. http://10.0.0.2:7700; repeat it, or separate with commas, to
    /// try several in turn). Without it, or when none answers, a restarted root rebuilds
    /// its counters from the limiters' hints, which can miss a sync interval of counts.
    /// Asked with this root's admin token: roots of a shard share it.
    #[arg(long = "copy-from", env = "YARL_COPY_FROM", value_delimiter = ',', value_parser = parse_root_url)]
    copy_from: Vec<String>,
    /// PEM certificates to check an https --copy-from root against, instead of the
    /// system's CAs.
    #[arg(long, env = "YARL_COPY_CA_FILE")]
    copy_ca_file: Option<PathBuf>,
    /// Without a command, `yarl-root` is the server.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Quotas as code: export the live quotas as YAML, apply a reviewed YAML file.
    #[command(subcommand)]
    Quotas(QuotasCommand),
}

#[derive(Debug, clap::Subcommand)]
enum QuotasCommand {
    /// Print every live quota (templates included) as YAML, sorted by name.
    Export {
        /// Only quotas whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        root: RootArgs,
    },
    /// Print how the root's quotas differ from FILE, then write the difference in one
    /// all-or-nothing batch.
    Apply {
        /// The YAML file, as `quotas export` writes it.
        file: PathBuf,
        /// Print the difference only.
        #[arg(long)]
        dry_run: bool,
        /// Also delete the root's quotas that FILE does not list (without it they are left
        /// alone).
        #[arg(long)]
        prune: bool,
        /// Only quotas whose name starts with this: FILE may list no other (as `export
        /// --prefix` writes it), and `--prune` deletes only under it.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        root: RootArgs,
    },
}

/// How a `quotas` command reaches the root.
#[derive(Debug, clap::Args)]
struct RootArgs {
    /// The root's admin API.
    #[arg(long, env = "YARL_URL", default_value = quotas_file::DEFAULT_URL)]
    url: String,
    /// File holding the admin bearer token (sent as `Authorization: Bearer …`).
    #[arg(long, env = "YARL_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// PEM certificates to check an `https` root against, instead of the system's CAs (a
    /// private CA, as `--tls-cert` roots often have).
    #[arg(long, env = "YARL_CA_FILE")]
    ca_file: Option<PathBuf>,
}

impl RootArgs {
    fn client(&self) -> anyhow::Result<Client> {
        let token = self.admin_token_file.as_deref().map(quotas_file::read_token).transpose()?;
        Ok(Client::new(&self.url, token, self.ca_file.as_deref())?)
    }
}

async fn quotas(cmd: QuotasCommand) -> anyhow::Result<()> {
    use std::io::Write as _;
    let out = match cmd {
        QuotasCommand::Export { prefix, root } => {
            let client = root.client()?;
            let quotas = client.list(&prefix).await?;
            let source = if prefix.is_empty() {
                client.url().to_owned()
            } else {
                format!("{} --prefix {prefix}", client.url())
            };
            quotas_file::render(&source, &quotas)?
        }
        QuotasCommand::Apply { file, dry_run, prune, prefix, root } => {
            // The file first: a typo is reported without touching the network.
            let desired = quotas_file::read(&file)?;
            quotas_file::check_prefix(&file, &desired, &prefix)?;
            let client = root.client()?;
            let current = client.list(&prefix).await?;
            let plan = quotas_file::plan(&desired, &current, prune);
            let mut out = quotas_file::render_plan(&plan);
            if !dry_run && !plan.is_empty() {
                // Shown before the write, so a refused batch still says what was tried.
                std::io::stdout().write_all(out.as_bytes())?;
                let applied = client.apply(&plan).await?;
                out = format!(
                    "applied: {} quota{} written, epoch {}\n",
                    applied.count,
                    if applied.count == 1 { "" } else { "s" },
                    applied.last_epoch.unwrap_or_default()
                );
            }
            out
        }
    };
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

/// The command line. A `quotas` command ignores the server flags' YARL_* variables: they
/// are often set for the server on the host where an operator runs it, and one the client
/// does not use must not stop it.
fn parse_args() -> Args {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let mut cmd = Args::command();
    if std::env::args_os().nth(1).is_some_and(|a| a == "quotas") {
        cmd = cmd.mut_args(|a| a.env(None));
    }
    Args::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}

/// Refuses an open root on a network address: without both tokens anyone who reaches it
/// could change quotas and counters, so that takes `--insecure-no-auth`, said out loud.
fn check_exposure(args: &Args) -> anyhow::Result<()> {
    let open = args.admin_token_file.is_none() || args.sync_token_file.is_none();
    if args.insecure_no_auth {
        tracing::warn!(
            addr = %args.listen,
            "--insecure-no-auth: {}",
            if open {
                "routes without a token file are open to anyone who can reach this address"
            } else {
                "given, but both token files are set, so every route needs its token"
            }
        );
        return Ok(());
    }
    if open && !args.listen.ip().is_loopback() {
        let missing: Vec<&str> = [
            args.admin_token_file.is_none().then_some("--admin-token-file"),
            args.sync_token_file.is_none().then_some("--sync-token-file"),
        ]
        .into_iter()
        .flatten()
        .collect();
        anyhow::bail!(
            "refusing to listen on {} without authentication: {} not set. Give both \
             --admin-token-file and --sync-token-file (YARL_ADMIN_TOKEN_FILE, \
             YARL_SYNC_TOKEN_FILE), listen on a loopback address, or pass --insecure-no-auth \
             to run an open root on purpose",
            args.listen,
            missing.join(" and ")
        );
    }
    Ok(())
}

/// Warns when users outside a token file's owner and group can use it. The group is
/// trusted: the recommended file is 0640 root:yarl, the service reading it through its group.
fn check_token_mode(path: &Path, what: &str) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(m) = std::fs::metadata(path) {
            let mode = m.permissions().mode() & 0o777;
            if open_to_others(mode) {
                tracing::warn!(
                    "the {what} token file {} is readable by others (mode {mode:o}); make it \
                     0640 owned by root and the group yarl, or 0600 owned by the user the root \
                     runs as",
                    path.display()
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (path, what);
}

#[cfg(unix)]
fn open_to_others(mode: u32) -> bool {
    mode & 0o007 != 0
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 1s, 500ms, 2m)"))?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err("must be from 10ms to 1h".into());
    }
    Ok(d)
}

/// A root's base URL: `http://` or `https://`, a host, nothing after the port.
fn parse_root_url(s: &str) -> Result<String, String> {
    let s = s.trim().trim_end_matches('/');
    let rest = s.strip_prefix("http://").or_else(|| s.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.contains(['/', '?', '#', '@', ' ']) => Ok(s.to_owned()),
        _ => Err("must be a root's URL, http://HOST[:PORT] or https://HOST[:PORT]".into()),
    }
}

fn parse_lease(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 3s, 500ms)"))?;
    if d < Duration::from_millis(200)
        || d > Duration::from_nanos(yarl_core::concurrency::MAX_LEASE_NS)
    {
        return Err("must be from 200ms to 60s".into());
    }
    Ok(d)
}

fn read_token(path: &Option<PathBuf>, what: &str) -> anyhow::Result<Option<String>> {
    let Some(path) = path else { return Ok(None) };
    check_token_mode(path, what);
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
        // The log goes to stdout (fmt's default writer), so that is the stream to ask.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = parse_args();
    if let Some(Command::Quotas(cmd)) = args.command {
        // One line, whatever RUST_BACKTRACE says: these are an operator's errors, not bugs.
        if let Err(e) = quotas(cmd).await {
            eprintln!("yarl-root: {e:#}");
            std::process::exit(1);
        }
        return Ok(());
    }
    check_exposure(&args)?;
    // Before anything slow (migrations, a copy from another root): SIGHUP's default action
    // ends the process, and `systemctl reload` may send it at any time.
    let hup = Hangup::new()?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Arc::new(TlsFiles::load(cert, key)?)),
        _ => None,
    };
    let root = yarl_core::RootConfig {
        shard: args.shard,
        hint_window_ns: u64::try_from(args.hint_window.as_nanos()).unwrap_or(u64::MAX),
        replica: args.replica.map_or((0, 1), |r| (r.index, r.count)),
        lease_ns: u64::try_from(args.in_flight_lease.as_nanos()).unwrap_or(u64::MAX),
        ..yarl_core::RootConfig::default()
    };
    let stripes = args.stripes.unwrap_or_else(yarl_root::default_stripes);
    let settings = Settings {
        root,
        poll_interval: args.poll_interval,
        sync_queue_wait: args.sync_queue_wait,
        sync_concurrency: args
            .sync_concurrency
            .map_or_else(|| yarl_root::default_sync_concurrency(stripes), usize::from),
        stripes,
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
    copy_from_peers(&state, &args.copy_from, args.copy_ca_file.as_deref()).await?;
    // Before it listens: limiters' views answered before now hold none of what it will sum.
    state.start().await?;
    let _background = state.spawn_background();

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tokio::spawn(reload_tls(hup, tls.clone()));
    tracing::info!(
        addr = %args.listen,
        scheme = if tls.is_some() { "https" } else { "http" },
        admin_token = args.admin_token_file.is_some(),
        sync_token = args.sync_token_file.is_some(),
        shard = %args.shard.map_or_else(|| "all".to_owned(), |s| s.to_string()),
        replica = %args.replica.map_or_else(|| "0/1".to_owned(), |r| r.to_string()),
        "yarl-root listening"
    );
    let opts = ServeOptions {
        tls,
        max_connections_per_address: args.max_connections_per_address as usize,
        ..ServeOptions::default()
    };
    serve(listener, app(state), opts, shutdown_signal()).await;
    tracing::info!("yarl-root stopped");
    Ok(())
}

/// How long a copy from another root may take, and its largest body: a million counters
/// take 22 MB of JSON, so 3,000,000 counters and 100,000 sessions fit in 256 MiB (decoded,
/// about as much again).
const COPY_TIMEOUT: Duration = Duration::from_secs(60);
const COPY_MAX_BYTES: usize = 256 << 20;

/// Starts from a copy of the first of `peers` that gives one (see `--copy-from`, whose URLs
/// clap checked); none is an error only for a bad CA file, never for a peer that is down.
async fn copy_from_peers(
    state: &AppState,
    peers: &[String],
    ca_file: Option<&Path>,
) -> anyhow::Result<()> {
    let token = state.admin_token();
    for url in peers {
        let client = Client::new(url, token.clone(), ca_file)
            .with_context(|| format!("--copy-from {url}"))?;
        let started = std::time::Instant::now();
        let copy = match client.copy(COPY_TIMEOUT, COPY_MAX_BYTES).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("no copy from {url}: {e}");
                continue;
            }
        };
        match state.copy_in(copy, started.elapsed()).await {
            Ok(t) => {
                tracing::info!(
                    from = url,
                    counters = t.counters,
                    skipped = t.skipped,
                    sessions = t.sessions,
                    ms = started.elapsed().as_millis() as u64,
                    "counters and sessions copied"
                );
                return Ok(());
            }
            Err(e) => tracing::warn!("no copy from {url}: {e}"),
        }
    }
    if !peers.is_empty() {
        tracing::warn!("no root gave a copy: counters come back from the limiters' hints");
    }
    Ok(())
}

/// SIGHUP, where there is one.
struct Hangup(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangup {
    fn new() -> anyhow::Result<Self> {
        #[cfg(unix)]
        let hup = Hangup(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .context("handling SIGHUP")?,
        );
        #[cfg(not(unix))]
        let hup = Hangup();
        Ok(hup)
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if self.0.recv().await.is_some() {
            return;
        }
        std::future::pending::<()>().await;
    }
}

/// Reloads the certificate on SIGHUP, and when its files change (checked every 5 s).
/// Without TLS a SIGHUP reloads nothing, and is still taken so that it does not end the root.
async fn reload_tls(mut hup: Hangup, tls: Option<Arc<TlsFiles>>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let changed = async {
            match &tls {
                Some(_) => {
                    tick.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let result = tokio::select! {
            () = hup.recv() => match &tls {
                Some(files) => files.reload(),
                None => {
                    tracing::info!("SIGHUP: no TLS certificate to reload");
                    Ok(false)
                }
            },
            () = changed => tls.as_ref().map_or(Ok(false), |files| files.reload_if_changed()),
        };
        match result {
            Ok(true) => tracing::info!("TLS certificate reloaded"),
            Ok(false) => {}
            Err(e) => tracing::error!("TLS certificate not reloaded, keeping the one in use: {e}"),
        }
    }
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
    fn copy_from_urls() {
        let a =
            Args::try_parse_from(["yarl-root", "--copy-from", "http://a:7700/,https://b"]).unwrap();
        assert_eq!(a.copy_from, ["http://a:7700", "https://b"]);
        for bad in ["root-b:7700", "http://", "ftp://a", "http://a/v1/sync"] {
            let e = Args::try_parse_from(["yarl-root", "--copy-from", bad]).unwrap_err();
            assert!(
                e.to_string().contains("--copy-from") && e.to_string().contains("http://HOST"),
                "{e}"
            );
        }
    }

    #[test]
    fn flags_and_env() {
        let a = Args::try_parse_from(["yarl-root"]).unwrap();
        assert_eq!(a.listen.to_string(), "127.0.0.1:7700");
        assert_eq!((a.db.as_str(), a.poll_interval), ("sqlite://yarl.db", Duration::from_secs(1)));
        let e = Args::try_parse_from(["yarl-root", "--poll-interval", "fast"]).unwrap_err();
        assert!(e.to_string().contains("--poll-interval"), "{e}");
        let a = Args::try_parse_from(["yarl-root", "--shard", "1/2"]).unwrap();
        assert_eq!(a.shard, Some(yarl_core::Shard { index: 1, count: 2 }));
        let e = Args::try_parse_from(["yarl-root", "--shard", "2/2"]).unwrap_err();
        assert!(e.to_string().contains("INDEX/COUNT"), "{e}");
        let a = Args::try_parse_from(["yarl-root", "--replica", "1/2"]).unwrap();
        assert_eq!(a.replica, Some(yarl_core::Shard { index: 1, count: 2 }));
        assert_eq!(a.in_flight_lease, Duration::from_secs(3));
        let e = Args::try_parse_from(["yarl-root", "--in-flight-lease", "50ms"]).unwrap_err();
        assert!(e.to_string().contains("from 200ms to 60s"), "{e}");
        let e = Args::try_parse_from(["yarl-root", "--tls-cert", "c.pem"]).unwrap_err();
        assert!(e.to_string().contains("--tls-key"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn token_files_may_be_shared_with_the_group_only() {
        for mode in [0o600, 0o640, 0o660, 0o400, 0o440] {
            assert!(!open_to_others(mode), "{mode:o}");
        }
        for mode in [0o644, 0o604, 0o602, 0o601, 0o666] {
            assert!(open_to_others(mode), "{mode:o}");
        }
    }

    #[test]
    fn an_open_root_stays_on_loopback() {
        let parse = |a: &[&str]| Args::try_parse_from([&["yarl-root"], a].concat()).unwrap();
        assert!(check_exposure(&parse(&[])).is_ok());
        assert!(check_exposure(&parse(&["--listen", "[::1]:7700"])).is_ok());
        let e = check_exposure(&parse(&["--listen", "0.0.0.0:7700"])).unwrap_err().to_string();
        assert!(e.contains("--admin-token-file and --sync-token-file not set"), "{e}");
        let half = parse(&["--listen", "10.0.0.1:7700", "--admin-token-file", "a"]);
        let e = check_exposure(&half).unwrap_err().to_string();
        assert!(e.contains("--sync-token-file not set") && e.contains("--insecure-no-auth"), "{e}");
        let both = ["--admin-token-file", "a", "--sync-token-file", "s"];
        assert!(
            check_exposure(&parse(&[&["--listen", "0.0.0.0:7700"][..], &both].concat())).is_ok()
        );
        assert!(check_exposure(&parse(&["--listen", "0.0.0.0:1", "--insecure-no-auth"])).is_ok());
    }
}
