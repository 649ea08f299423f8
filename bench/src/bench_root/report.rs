//! The figures of a grid point: what the roots and this process did while measured, as a
//! row of the report's table.

use crate::cli::{Args, Point};
use crate::limiters::Shared;
use std::process::{Child, Command};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// What one grid point measured.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) latencies_us: Vec<u64>,
    pub(crate) ok: u64,
    pub(crate) failed: u64,
    pub(crate) req_bytes: u64,
    pub(crate) answer_bytes: u64,
    pub(crate) probe_answers: u64,
    pub(crate) probe_counters: u64,
    pub(crate) probe_ns: u64,
}

/// The intro and the head of the table.
pub(crate) fn print_header(args: &Args) {
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
}

/// What the roots and this process did in the measured window.
pub(crate) struct Window {
    wall: f64,
    /// CPU seconds of each root.
    cpu: Vec<f64>,
    /// CPU seconds of this load generator.
    own: f64,
    /// Syncs the roots applied.
    done: u64,
    /// Lock busy per stripe of each root, formatted.
    busy: Vec<String>,
}

/// Measures `args.seconds`, the limiters recording their calls meanwhile.
pub(crate) async fn measure(
    args: &Args,
    p: Point,
    client: &reqwest::Client,
    urls: &[String],
    roots: &[Child],
    shared: &Shared,
) -> Window {
    let pids: Vec<u32> = roots.iter().map(Child::id).collect();
    let scraped0 = scrape(client, urls).await;
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
    let scraped = scrape(client, urls).await;
    let done: u64 = scraped.iter().zip(&scraped0).map(|(a, b)| a.0.saturating_sub(b.0)).sum();
    // The share of the time each root's state locks were held, per stripe: the serial part
    // of its work, which bounds what one root can serve whatever its cores.
    let busy: Vec<String> = scraped
        .iter()
        .zip(&scraped0)
        .map(|(a, b)| format!("{:.2}", (a.1 - b.1) / wall / f64::from(p.stripes)))
        .collect();
    Window { wall, cpu, own, done, busy }
}

/// The table row of point `p`.
pub(crate) fn row(p: Point, mut s: Stats, w: Window) -> String {
    let Window { wall, cpu, own, done, busy } = w;
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
    format!(
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
    )
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
