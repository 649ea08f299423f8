//! The simulated limiters, and the probe: a real limiter with a real `SyncEngine`.

use crate::cli::{Args, Point, Proto};
use crate::report::Stats;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use yarl_core::proto::{DeltaBatch, SyncRequest, PROTOCOL_VERSION};
use yarl_core::{Limiter, Limits, QuotaUpdate, Shard, SyncConfig, SyncEngine};

/// One root as a simulated limiter sees it.
#[derive(Default)]
struct Link {
    instance: Option<u64>,
    since: u64,
    acked: u64,
    pending: VecDeque<Arc<DeltaBatch>>,
}

#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) stats: Mutex<Stats>,
    pub(crate) measuring: std::sync::atomic::AtomicBool,
    pub(crate) stop: std::sync::atomic::AtomicBool,
    pub(crate) seq: AtomicU64,
}

/// Starts `p.limiters` simulated limiters, their first syncs spread over one interval,
/// and the probe, last.
pub(crate) fn spawn(
    args: &Args,
    p: Point,
    client: &reqwest::Client,
    urls: &[String],
    shared: &Arc<Shared>,
) -> Vec<JoinHandle<()>> {
    let interval = args.interval();
    let timeout = args.timeout();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..p.limiters {
        let (client, urls, shared) = (client.clone(), urls.to_vec(), shared.clone());
        let offset = interval.mul_f64(i as f64 / p.limiters as f64);
        let keys = args.key_space.unwrap_or(args.quotas).min(args.quotas);
        // The epoch is every quota's (ids and epochs 1..=quotas), whatever key space the
        // deltas are drawn from: announcing less, the limiter would be sent a page of quota
        // updates in every answer, which is not what is measured.
        let (epoch, counters) = (args.quotas, args.counters);
        tasks.push(tokio::spawn(async move {
            let at = start + offset;
            limiter(i, p, keys, epoch, counters, client, urls, shared, at, interval, timeout).await
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
    tasks.push(probe);
    tasks
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
    keys: u64,
    epoch: u64,
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
        for q in pick(&mut rng, counters, keys) {
            per[Shard::of(q, p.shards) as usize].push((q, 1000 * rng.u64(1..=3), 0));
        }
        let calls = links.iter_mut().enumerate().map(|(k, link)| {
            let batch = Arc::new(DeltaBatch {
                seq,
                deltas: std::mem::take(&mut per[k]),
                epoch: Some(epoch),
                drained: Vec::new(),
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
                epoch,
                batches: link.pending.iter().map(|b| (**b).clone()).collect(),
                hints: vec![],
                seen_epoch: Some(epoch),
                interest: p.proto == Proto::V2Interest,
                watch: vec![],
                key_templates: Vec::new(),
                hinted_seq: None,
                in_flight: Vec::new(),
                view_age_ns: None,
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
