//! `make bench-root`: the root tier's capacity, measured.
//!
//! Loads a million quotas into a SQLite database through the batch API (once; the file is
//! kept for later runs), then for each point of a grid (protocol v1, v2 and v2 with answers
//! by interest, 1 or 2 shards, roots of 1 or 2 stripes (`yarl-root --stripes`, each with
//! its default syncs in flight), N limiters) starts real release `yarl-root` processes on loopback and plays N limiters
//! against them for a bounded time. Each simulated limiter syncs once per interval with
//! every root, exactly as `SyncEngine` does: one numbered batch of deltas per round (its
//! share of 1,000 changed counters, drawn at random from all quotas), split by shard, kept
//! and resent until acknowledged, `root_instance`/`since` carried from the last answer.
//! They skip the quota download (they announce the database's epoch): the counters are
//! what is measured. One more limiter, the probe, is a real `Limiter` holding every quota
//! with a real `SyncEngine`: its decode + merge time per answer is the limiter's own cost.
//!
//! Figures: root CPU per sync and in cores (from `/proc/PID/stat`), the share of the time
//! each root's state locks were held, per stripe (its serial part: near 1, a root is full
//! whatever its cores, and latency grows with the queue), sustained syncs per second per core, p50/p99 sync latency (a timed-out call counts at the timeout), bytes per
//! request and answer, counters per answer. The load generator shares the machine's cores
//! with the roots; its own CPU is printed too.

use anyhow::{bail, Context as _};
use clap::Parser;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yarl_core::proto::{v2, DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use yarl_core::{Limiter, Limits, QuotaUpdate, Shard, SyncConfig, SyncEngine};

#[derive(Debug, Parser)]
#[command(about = "Capacity of yarl-root: N limiters syncing, v1 vs v2, 1 vs 2 shards")]
struct Args {
    /// The yarl-root binary (a release build).
    #[arg(long, default_value = "target/release/yarl-root")]
    root_bin: PathBuf,
    /// Where the quota database is built and kept between runs.
    #[arg(long, default_value = "target/bench-root")]
    dir: PathBuf,
    /// Quotas loaded.
    #[arg(long, default_value_t = 1_000_000)]
    quotas: u64,
    /// Changed counters per limiter per interval.
    #[arg(long, default_value_t = 1_000)]
    counters: usize,
    /// Seconds measured per grid point, after the warm-up.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Seconds of warm-up before measuring (default: 3 intervals; 12 s for answers by
    /// interest, the root's interest time of 10 s and two intervals, until the maps a root
    /// keeps per session have grown to their steady size: their growth, a few resizes of
    /// million-entry tables under the root's lock, is a start-up cost, not a per-sync one).
    #[arg(long)]
    warm_up: Option<u64>,
    /// Sync interval, ms.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Timeout of one sync call, ms (the agent's default).
    #[arg(long, default_value_t = 500)]
    timeout_ms: u64,
    /// The big grid: 50, 300 and 1,000 limiters, v1, v2 and v2 by interest, 1 and 2 shards.
    #[arg(long)]
    full: bool,
    /// Only these limiter counts (comma-separated), instead of the grid's.
    #[arg(long, value_delimiter = ',')]
    limiters: Vec<usize>,
    /// Draw the changed counters from the first K quotas only (default: all of them, the
    /// worst case: limiters barely overlap, so the cluster changes about limiters × 1,000
    /// distinct counters per interval). A smaller K models limiters that see the same hot
    /// keys, as behind a load balancer.
    #[arg(long)]
    key_space: Option<u64>,
    /// Only these protocols (comma-separated: v1, v2, interest), instead of all three.
    #[arg(long, value_delimiter = ',')]
    protocols: Vec<String>,
    /// Only these shard counts (comma-separated: 1, 2), instead of both.
    #[arg(long, value_delimiter = ',')]
    shards: Vec<u32>,
    /// Stripes of each root (`yarl-root --stripes`; comma-separated: each is a grid point).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    stripes: Vec<u32>,
    /// First port of the roots.
    #[arg(long, default_value_t = 17_700)]
    port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    V1,
    V2,
    /// v2 with answers by interest (`SyncRequest::interest`).
    V2Interest,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::V1 => "v1 JSON",
            Proto::V2 => "v2",
            Proto::V2Interest => "v2 by interest",
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Proto::V1 => "application/json",
            Proto::V2 | Proto::V2Interest => v2::CONTENT_TYPE,
        }
    }

    fn encode(self, r: &SyncRequest) -> Vec<u8> {
        match self {
            Proto::V1 => serde_json::to_vec(r).unwrap_or_default(),
            Proto::V2 | Proto::V2Interest => v2::encode_request(r),
        }
    }

    /// `(root_instance, acked_seq, version)` without decoding the counters: the simulated
    /// limiters only need these, and the load generator must not spend its CPU (shared
    /// with the roots) on parsing what the probe measures.
    fn header(self, body: &[u8]) -> Option<(u64, u64, u64)> {
        match self {
            Proto::V2 | Proto::V2Interest => {
                let ((_, inst, acked, version), _) =
                    postcard::take_from_bytes::<(u8, u64, u64, u64)>(body).ok()?;
                Some((inst, acked, version))
            }
            // The root writes these fields first: `{"v":1,"root_instance":…,"acked_seq":…,"version":…`.
            Proto::V1 => {
                let head = std::str::from_utf8(&body[..body.len().min(200)]).ok()?;
                let field = |name: &str| -> Option<u64> {
                    let at = head.find(&format!("\"{name}\":"))? + name.len() + 3;
                    let digits: String =
                        head[at..].chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                };
                Some((field("root_instance")?, field("acked_seq")?, field("version")?))
            }
        }
    }

    fn decode(self, body: &[u8]) -> Result<SyncResponse, String> {
        match self {
            Proto::V1 => serde_json::from_slice(body).map_err(|e| e.to_string()),
            Proto::V2 | Proto::V2Interest => {
                v2::decode_response(body, usize::MAX).map_err(|e| e.to_string())
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Point {
    proto: Proto,
    shards: u32,
    stripes: u32,
    limiters: usize,
}

/// What one grid point measured.
#[derive(Debug, Default)]
struct Stats {
    latencies_us: Vec<u64>,
    ok: u64,
    failed: u64,
    req_bytes: u64,
    answer_bytes: u64,
    probe_answers: u64,
    probe_counters: u64,
    probe_ns: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.root_bin.exists(),
        "{} is missing: build it with cargo build --release -p yarl-root",
        args.root_bin.display()
    );
    std::fs::create_dir_all(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let db = rt.block_on(quota_db(&args))?;

    let limiter_counts: Vec<usize> = if !args.limiters.is_empty() {
        args.limiters.clone()
    } else if args.full {
        vec![50, 300, 1000]
    } else {
        vec![50, 300]
    };
    let mut grid = Vec::new();
    let shard_counts = if args.shards.is_empty() { vec![1, 2] } else { args.shards.clone() };
    for &shards in &shard_counts {
        for &limiters in &limiter_counts {
            for proto in [Proto::V1, Proto::V2, Proto::V2Interest] {
                let key = match proto {
                    Proto::V1 => "v1",
                    Proto::V2 => "v2",
                    Proto::V2Interest => "interest",
                };
                if !args.protocols.is_empty() && !args.protocols.iter().any(|p| p == key) {
                    continue;
                }
                // v1 is for debugging and old limiters: measured unsharded only, unless
                // the big grid asks for everything.
                if proto == Proto::V1 && shards > 1 && !args.full {
                    continue;
                }
                for &stripes in &args.stripes {
                    grid.push(Point { proto, shards, stripes, limiters });
                }
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "bench-root: {} quotas, {} changed counters per limiter per {} ms drawn from {}, {} s \
         measured per point after a warm-up of {}, timeout {} ms, {} cores shared by the \
         roots and this load generator\n",
        args.quotas,
        args.counters,
        args.interval_ms,
        args.key_space.map_or("all of them".to_owned(), |k| format!("the first {k}")),
        args.seconds,
        args.warm_up.map_or("3 intervals (12 s by interest)".to_owned(), |s| format!("{s} s")),
        args.timeout_ms,
        cores
    );
    println!(
        "| protocol | shards | stripes | limiters | syncs/s done in time (wanted) | syncs/s answered by the roots | root CPU per sync | root CPU (cores, per root) | lock busy (per stripe, per root) | syncs/s per core | p50 | p99 | failed | request | answer | counters per answer | limiter decode+merge per answer | load generator CPU (cores) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in grid {
        let row = rt.block_on(run_point(&args, &db, p)).with_context(|| format!("{p:?}"))?;
        println!("{row}");
    }
    Ok(())
}

/// Builds (or reuses) the SQLite file with `args.quotas` quotas `q1`…`qN`, ids 1…N.
async fn quota_db(args: &Args) -> anyhow::Result<PathBuf> {
    let path = args.dir.join(format!("quotas-{}.db", args.quotas));
    if path.exists() {
        return Ok(path);
    }
    let tmp = args.dir.join("loading.db");
    for ext in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", tmp.display()));
    }
    let started = Instant::now();
    let mut root = spawn_root(args, &tmp, args.port, None, 1)?;
    let url = format!("http://127.0.0.1:{}", args.port);
    wait_ready(&url, 0).await?;
    let client = reqwest::Client::new();
    let chunk = 100_000u64;
    let mut first = 1;
    while first <= args.quotas {
        let last = (first + chunk - 1).min(args.quotas);
        let mut body = String::with_capacity(((last - first + 1) * 80) as usize);
        body.push('[');
        for i in first..=last {
            if i > first {
                body.push(',');
            }
            // 100/s with the recommended bursts for a 1 s interval.
            body.push_str(&format!(
                r#"{{"name":"q{i}","limit":100,"low_burst":150,"high_burst":300,"parent":null}}"#
            ));
        }
        body.push(']');
        let r = client
            .post(format!("{url}/v1/quotas:batch"))
            .header("content-type", "application/json")
            .body(body)
            .timeout(Duration::from_secs(300))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("batch load: {} {}", r.status(), r.text().await.unwrap_or_default());
        }
        first = last + 1;
    }
    stop(&mut root);
    std::fs::rename(&tmp, &path)?;
    for ext in ["-wal", "-shm"] {
        let _ =
            std::fs::rename(format!("{}{ext}", tmp.display()), format!("{}{ext}", path.display()));
    }
    eprintln!(
        "loaded {} quotas through POST /v1/quotas:batch in {:.1} s",
        args.quotas,
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}

fn spawn_root(
    args: &Args,
    db: &Path,
    port: u16,
    shard: Option<Shard>,
    stripes: u32,
) -> anyhow::Result<Child> {
    let mut c = Command::new(&args.root_bin);
    c.arg("--stripes")
        .arg(stripes.to_string())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--db")
        .arg(format!("sqlite://{}", db.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(s) = shard {
        c.arg("--shard").arg(s.to_string());
    }
    c.spawn().with_context(|| format!("starting {}", args.root_bin.display()))
}

fn stop(c: &mut Child) {
    let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Waits until the root answers `/healthz` with at least `epoch` (all quotas loaded).
async fn wait_ready(url: &str, epoch: u64) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        if let Ok(r) = client.get(format!("{url}/healthz")).send().await {
            if let Ok(t) = r.text().await {
                let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                if v["epoch"].as_u64().unwrap_or(0) >= epoch {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{url} did not become ready")
}

/// CPU seconds (user + system) of a process so far.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// One root as a simulated limiter sees it.
#[derive(Default)]
struct Link {
    instance: Option<u64>,
    since: u64,
    acked: u64,
    pending: VecDeque<Arc<DeltaBatch>>,
}

struct Shared {
    stats: Mutex<Stats>,
    measuring: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
    seq: AtomicU64,
}

async fn run_point(args: &Args, db: &Path, p: Point) -> anyhow::Result<String> {
    let mut roots = Vec::new();
    let mut urls = Vec::new();
    for k in 0..p.shards {
        let port = args.port + 1 + k as u16;
        let shard = (p.shards > 1).then_some(Shard { index: k, count: p.shards });
        roots.push(spawn_root(args, db, port, shard, p.stripes)?);
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let result = async {
        for u in &urls {
            wait_ready(u, args.quotas).await?;
        }
        drive(args, p, &urls, &roots).await
    }
    .await;
    for r in &mut roots {
        stop(r);
    }
    result
}

async fn drive(args: &Args, p: Point, urls: &[String], roots: &[Child]) -> anyhow::Result<String> {
    let client =
        reqwest::Client::builder().pool_max_idle_per_host(4096).tcp_nodelay(true).build()?;
    let interval = Duration::from_millis(args.interval_ms);
    let timeout = Duration::from_millis(args.timeout_ms);
    let shared = Arc::new(Shared {
        stats: Mutex::new(Stats::default()),
        measuring: false.into(),
        stop: false.into(),
        seq: AtomicU64::new(0),
    });
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..p.limiters {
        let (client, urls, shared) = (client.clone(), urls.to_vec(), shared.clone());
        let offset = interval.mul_f64(i as f64 / p.limiters as f64);
        let keys = args.key_space.unwrap_or(args.quotas).min(args.quotas);
        let (quotas, counters) = (keys, args.counters);
        tasks.push(tokio::spawn(async move {
            limiter(i, p, quotas, counters, client, urls, shared, start + offset, interval, timeout)
                .await
        }));
    }
    let probe = {
        let (client, urls, shared) = (client.clone(), urls.to_vec(), shared.clone());
        let (quotas, counters) = (args.quotas, args.counters);
        let keys = args.key_space.unwrap_or(quotas).min(quotas);
        tokio::spawn(async move {
            probe(p, quotas, keys, counters, client, urls, shared, interval, timeout).await
        })
    };

    let warm_up = args.warm_up.map_or_else(
        || match p.proto {
            Proto::V2Interest => (interval * 2).max(Duration::from_secs(12)),
            Proto::V1 | Proto::V2 => interval * 3,
        },
        Duration::from_secs,
    );
    tokio::time::sleep(warm_up).await;
    let pids: Vec<u32> = roots.iter().map(Child::id).collect();
    let scraped0 = scrape(&client, urls).await;
    let cpu0: Vec<f64> = pids.iter().map(|&p| cpu_secs(p)).collect();
    let self0 = cpu_secs(std::process::id());
    let t0 = Instant::now();
    shared.measuring.store(true, Relaxed);
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    shared.measuring.store(false, Relaxed);
    let wall = t0.elapsed().as_secs_f64();
    let cpu: Vec<f64> = pids.iter().zip(&cpu0).map(|(&p, c0)| cpu_secs(p) - c0).collect();
    let own = cpu_secs(std::process::id()) - self0;
    // Syncs the roots answered, including those whose caller had given up: under overload
    // the roots keep working on requests that time out at the limiter.
    let scraped = scrape(&client, urls).await;
    let done: u64 = scraped.iter().zip(&scraped0).map(|(a, b)| a.0.saturating_sub(b.0)).sum();
    // The share of the time each root's state locks were held, per stripe: the serial part
    // of its work, which bounds what one root can serve whatever its cores.
    let busy: Vec<String> = scraped
        .iter()
        .zip(&scraped0)
        .map(|(a, b)| format!("{:.2}", (a.1 - b.1) / wall / f64::from(p.stripes)))
        .collect();
    shared.stop.store(true, Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), probe).await;

    let mut s = std::mem::take(&mut *shared.stats.lock().unwrap_or_else(|e| e.into_inner()));
    s.latencies_us.sort_unstable();
    let pct = |q: f64| {
        s.latencies_us
            .get(
                ((s.latencies_us.len() as f64 * q) as usize)
                    .min(s.latencies_us.len().saturating_sub(1)),
            )
            .map_or(0.0, |&us| us as f64 / 1000.0)
    };
    let calls = s.ok + s.failed;
    let total_cpu: f64 = cpu.iter().sum();
    let per_root: Vec<String> = cpu.iter().map(|c| format!("{:.2}", c / wall)).collect();
    let syncs = s.ok as f64 / wall;
    let wanted = (p.limiters as u64 + 1) * u64::from(p.shards);
    Ok(format!(
        "| {} | {} | {} | {} | {:.0} ({}) | {:.0} | {:.2} ms | {} | {} | {:.0} | {:.1} ms | {:.1} ms | {} | {} | {} | {:.0} | {} | {:.2} |",
        p.proto.name(),
        p.shards,
        p.stripes,
        p.limiters,
        syncs,
        wanted,
        done as f64 / wall,
        if done > 0 { total_cpu * 1000.0 / done as f64 } else { f64::NAN },
        per_root.join(" / "),
        busy.join(" / "),
        if total_cpu > 0.0 { done as f64 / total_cpu } else { 0.0 },
        pct(0.50),
        pct(0.99),
        s.failed,
        bytes(s.req_bytes.checked_div(calls).unwrap_or(0)),
        bytes(s.answer_bytes.checked_div(s.ok).unwrap_or(0)),
        s.probe_counters as f64 / s.probe_answers.max(1) as f64,
        if s.probe_answers > 0 {
            format!("{:.2} ms", s.probe_ns as f64 / s.probe_answers as f64 / 1e6)
        } else {
            "-".into()
        },
        own / wall,
    ))
}

/// What each root at `urls` reports so far: syncs applied (`yarl_root_syncs_applied_total`)
/// and seconds its state lock was held (`yarl_root_state_lock_held_seconds_total`).
async fn scrape(client: &reqwest::Client, urls: &[String]) -> Vec<(u64, f64)> {
    let mut out = Vec::with_capacity(urls.len());
    for u in urls {
        let text = match client.get(format!("{u}/metrics")).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.push((
            value("yarl_root_syncs_applied_total") as u64,
            value("yarl_root_state_lock_held_seconds_total"),
        ));
    }
    out
}

fn bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// `n` distinct random quota ids from `1..=quotas`, sorted.
fn pick(rng: &mut fastrand::Rng, n: usize, quotas: u64) -> Vec<u64> {
    let mut ids = std::collections::BTreeSet::new();
    while ids.len() < n.min(quotas as usize) {
        ids.insert(rng.u64(1..=quotas));
    }
    ids.into_iter().collect()
}

/// Sends `body` to `url`; returns the answer body or an error, and records the call.
async fn post(
    client: &reqwest::Client,
    url: &str,
    proto: Proto,
    body: Vec<u8>,
    timeout: Duration,
    shared: &Shared,
) -> Option<Vec<u8>> {
    let len = body.len() as u64;
    let started = Instant::now();
    let r = async {
        let resp = client
            .post(format!("{url}/v1/sync"))
            .header("content-type", proto.content_type())
            .body(body)
            .timeout(timeout)
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.bytes().await.ok().map(|b| b.to_vec())
    }
    .await;
    if shared.measuring.load(Relaxed) {
        let us = (started.elapsed().as_micros() as u64).min(timeout.as_micros() as u64);
        let mut s = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
        s.latencies_us.push(us);
        s.req_bytes += len;
        match &r {
            Some(b) => {
                s.ok += 1;
                s.answer_bytes += b.len() as u64;
            }
            None => s.failed += 1,
        }
    }
    r
}

#[allow(clippy::too_many_arguments)]
async fn limiter(
    i: usize,
    p: Point,
    quotas: u64,
    counters: usize,
    client: reqwest::Client,
    urls: Vec<String>,
    shared: Arc<Shared>,
    first: tokio::time::Instant,
    interval: Duration,
    timeout: Duration,
) {
    let mut rng = fastrand::Rng::with_seed(i as u64 * 7919 + 1);
    let id = format!("bench-{:08x}-{i}", fastrand::u32(..));
    let mut links: Vec<Link> = urls.iter().map(|_| Link::default()).collect();
    let mut seq = 0;
    let mut next = first;
    while !shared.stop.load(Relaxed) {
        tokio::time::sleep_until(next).await;
        next += interval;
        seq += 1;
        let mut per: Vec<Vec<(u64, u64, u64)>> = vec![Vec::new(); p.shards as usize];
        for q in pick(&mut rng, counters, quotas) {
            per[Shard::of(q, p.shards) as usize].push((q, 1000 * rng.u64(1..=3), 0));
        }
        let calls = links.iter_mut().enumerate().map(|(k, link)| {
            let batch = Arc::new(DeltaBatch {
                seq,
                deltas: std::mem::take(&mut per[k]),
                epoch: Some(quotas),
            });
            link.pending.push_back(batch);
            if link.pending.len() > 30 {
                link.pending.pop_front();
            }
            let req = SyncRequest {
                v: PROTOCOL_VERSION,
                limiter: id.clone(),
                root_instance: link.instance,
                since: link.since,
                // The quota download is not what is measured: announce every epoch held.
                epoch: quotas,
                batches: link.pending.iter().map(|b| (**b).clone()).collect(),
                hints: vec![],
                seen_epoch: Some(quotas),
                interest: p.proto == Proto::V2Interest,
                watch: vec![],
            };
            let (client, url, shared) = (&client, &urls[k], &shared);
            async move {
                let body = p.proto.encode(&req);
                let answer = post(client, url, p.proto, body, timeout, shared).await;
                (link, answer)
            }
        });
        for (link, answer) in futures_util::future::join_all(calls).await {
            if let Some((inst, acked, version)) = answer.and_then(|b| p.proto.header(&b)) {
                link.instance = Some(inst);
                link.since = version;
                link.acked = acked;
                link.pending.retain(|b| b.seq > acked);
            }
        }
    }
    let _ = shared.seq.fetch_add(seq, Relaxed);
}

/// A real limiter holding every quota, driven by a real `SyncEngine`; times the decoding
/// and merging of each answer.
#[allow(clippy::too_many_arguments)]
async fn probe(
    p: Point,
    quotas: u64,
    keys: u64,
    counters: usize,
    client: reqwest::Client,
    urls: Vec<String>,
    shared: Arc<Shared>,
    interval: Duration,
    timeout: Duration,
) {
    // Everything but the HTTP calls is CPU work of tens of milliseconds: it runs with
    // `block_in_place`, off the runtime's workers, or the simulated limiters' answers
    // would wait for it and their latencies would include it.
    let limiter = tokio::task::block_in_place(|| {
        let limiter = Arc::new(Limiter::builder().capacity(quotas as u32 + 16).build());
        let limits = Limits::from_milli(100_000, 150_000, 300_000).expect("valid limits");
        let all: Vec<QuotaUpdate> = (1..=quotas)
            .map(|id| QuotaUpdate {
                id,
                name: format!("q{id}"),
                epoch: id,
                deleted: false,
                limits,
                parent: None,
                reset_epoch: 0,
            })
            .collect();
        limiter.apply_quotas(&all);
        limiter
    });
    let interest = p.proto == Proto::V2Interest;
    let config = SyncConfig { interval, timeout, interest, ..SyncConfig::default() };
    let shards: Vec<Vec<String>> = urls.iter().map(|u| vec![u.clone()]).collect();
    let Ok(mut engine) = SyncEngine::sharded(limiter.clone(), shards, config) else { return };
    let mut rng = fastrand::Rng::with_seed(42);
    let clock = limiter.clock().clone();
    let mut next = tokio::time::Instant::now();
    while !shared.stop.load(Relaxed) {
        tokio::time::sleep_until(next).await;
        next += interval;
        let calls = tokio::task::block_in_place(|| {
            for q in pick(&mut rng, counters, keys) {
                let _ = limiter.account(&format!("q{q}"), 1);
            }
            engine.begin_round(clock.now_nanos())
        });
        let sent = futures_util::future::join_all(calls.into_iter().map(|c| {
            let (client, shared) = (&client, &shared);
            async move {
                let started = Instant::now();
                let body = p.proto.encode(&c.request);
                let answer = post(client, &c.url, p.proto, body, timeout, shared).await;
                (c.root, answer, started.elapsed())
            }
        }))
        .await;
        for (root, answer, latency) in sent {
            let (n, ok, took) = tokio::task::block_in_place(|| {
                let t = Instant::now();
                let result =
                    answer.ok_or_else(|| "failed".to_string()).and_then(|b| p.proto.decode(&b));
                let n = result.as_ref().map_or(0, |r| r.counters.len() as u64);
                let ok = result.is_ok();
                engine.on_response(root, result, latency, clock.now_nanos());
                (n, ok, t.elapsed())
            });
            if ok && shared.measuring.load(Relaxed) {
                let mut s = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                s.probe_answers += 1;
                s.probe_counters += n;
                s.probe_ns += took.as_nanos() as u64;
            }
        }
        tokio::task::block_in_place(|| engine.end_round(clock.now_nanos()));
    }
}
