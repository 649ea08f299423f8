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

mod cli;
mod limiters;
mod report;
mod roots;

use anyhow::Context as _;
use clap::Parser;
use cli::{Args, Point};
use limiters::Shared;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::Shard;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.root_bin.exists(),
        "{} is missing: build it with cargo build --release -p yarl-root",
        args.root_bin.display()
    );
    std::fs::create_dir_all(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let db = rt.block_on(roots::quota_db(&args))?;
    let grid = cli::grid(&args);
    report::print_header(&args);
    for p in grid {
        let row = rt.block_on(run_point(&args, &db, p)).with_context(|| format!("{p:?}"))?;
        println!("{row}");
    }
    Ok(())
}

async fn run_point(args: &Args, db: &Path, p: Point) -> anyhow::Result<String> {
    let mut roots = Vec::new();
    let mut urls = Vec::new();
    for k in 0..p.shards {
        let port = args.port + 1 + k as u16;
        let shard = (p.shards > 1).then_some(Shard { index: k, count: p.shards });
        roots.push(roots::spawn_root(args, db, port, shard, p.stripes)?);
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let result = async {
        for u in &urls {
            roots::wait_ready(u, args.quotas).await?;
        }
        drive(args, p, &urls, &roots).await
    }
    .await;
    for r in &mut roots {
        roots::stop(r);
    }
    result
}

/// Plays the limiters and the probe against the roots at `urls`: the row of point `p`.
async fn drive(args: &Args, p: Point, urls: &[String], roots: &[Child]) -> anyhow::Result<String> {
    let client =
        reqwest::Client::builder().pool_max_idle_per_host(4096).tcp_nodelay(true).build()?;
    let shared = Arc::new(Shared::default());
    let tasks = limiters::spawn(args, p, &client, urls, &shared);
    tokio::time::sleep(args.warm_up(p.proto)).await;
    let window = report::measure(args, p, &client, urls, roots, &shared).await;
    shared.stop.store(true, Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let s = std::mem::take(&mut *shared.stats.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(report::row(p, s, window))
}
