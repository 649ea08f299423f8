//! The roots under test: the quota database they serve, starting and stopping them.

use crate::cli::Args;
use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use yarl_core::Shard;

/// Builds (or reuses) the SQLite file with `args.quotas` quotas `q1`…`qN`, ids 1…N.
pub(crate) async fn quota_db(args: &Args) -> anyhow::Result<PathBuf> {
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

pub(crate) fn spawn_root(
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

pub(crate) fn stop(c: &mut Child) {
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
pub(crate) async fn wait_ready(url: &str, epoch: u64) -> anyhow::Result<()> {
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
