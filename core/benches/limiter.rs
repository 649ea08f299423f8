//! `check` and `account` on a 3-level chain with 1,000,000 quotas loaded (and `account` of a
//! million keys under a template), and the memory the quota table takes per quota.
//!
//! Quotas are loaded in pages of the root's page size, as a limiter receives them.
//!
//! Then one sync round of the limiter's agent with 100,000 of the million changed: taking the
//! deltas, merging a root's answer of as many counters, and ending the round (what the agent
//! thread does every interval under random-key `yarl_account` traffic, on a worker's core).
//! The same round for 100,000 of a million keys under a template.
//!
//! Run: `cargo bench -p yarl-core --bench limiter`. Medians are criterion's; the memory line
//! is the process RSS growth while loading, divided by the number of quotas.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{SyncResponse, PROTOCOL_VERSION};
use yarl_core::{
    Limiter, Limits, ManualClock, MonotonicClock, QuotaUpdate, SyncConfig, SyncEngine,
};

const TENANTS: u64 = 1_000;
const BUCKETS: u64 = 10_000;
const QUOTAS: u64 = 1_000_000;

fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn leaf_name(i: u64) -> String {
    format!("s3_bucket-{:07}_read", i)
}

/// Tenants ← buckets ← leaves: every leaf has a 3-level chain.
fn load(limiter: &Limiter) {
    let limits = Limits::from_units(1e6, 1e9, 1e9).unwrap();
    let mk = |id: u64, name: String, parent: Option<String>| QuotaUpdate {
        id,
        name,
        epoch: id,
        deleted: false,
        reset_epoch: 0,
        limits,
        parent,
    };
    let tenants: Vec<_> = (0..TENANTS).map(|t| mk(t + 1, format!("tenant-{t}"), None)).collect();
    limiter.apply_quotas(&tenants);
    let buckets: Vec<_> = (0..BUCKETS)
        .map(|b| {
            mk(
                TENANTS + b + 1,
                format!("tenant-{}.b{b}", b % TENANTS),
                Some(format!("tenant-{}", b % TENANTS)),
            )
        })
        .collect();
    limiter.apply_quotas(&buckets);
    let leaves = QUOTAS - TENANTS - BUCKETS;
    let mut next = 0;
    while next < leaves {
        let end = (next + yarl_core::RootConfig::default().page_size as u64).min(leaves);
        let chunk: Vec<_> = (next..end)
            .map(|i| {
                let b = i % BUCKETS;
                mk(
                    TENANTS + BUCKETS + i + 1,
                    leaf_name(i),
                    Some(format!("tenant-{}.b{b}", b % TENANTS)),
                )
            })
            .collect();
        limiter.apply_quotas(&chunk);
        next = end;
    }
}

fn bench(c: &mut Criterion) {
    let before = rss_bytes();
    let clock = Arc::new(ManualClock::at(1));
    let limiter = Arc::new(Limiter::builder().clock(clock.clone()).capacity(1_050_000).build());
    load(&limiter);
    let after = rss_bytes();
    assert_eq!(limiter.quota_count(), QUOTAS);
    println!(
        "memory: {QUOTAS} quotas; RSS grew {:.1} MiB = {:.1} bytes per quota; \
         table accounting {:.1} bytes per quota",
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / QUOTAS as f64,
        limiter.memory_bytes() as f64 / QUOTAS as f64,
    );
    let leaves = QUOTAS - TENANTS - BUCKETS;
    let hot = leaf_name(123_456);
    assert_eq!(limiter.quota(&hot).unwrap().parent.as_deref(), Some("tenant-456.b3456"));
    let names: Vec<String> =
        (0..4096).map(|k| leaf_name(fastrand::u64(0..leaves) + k % 2)).collect();

    let mut g = c.benchmark_group("limiter");
    g.bench_function("check/3-level chain, one key", |b| b.iter(|| limiter.check(black_box(&hot))));
    let mut k = 0;
    g.bench_function("check/3-level chain, random keys of 1M", |b| {
        b.iter(|| {
            k = (k + 1) & 4095;
            limiter.check(black_box(&names[k]))
        })
    });
    // The whole million in a random order: every lookup misses the caches, as nginx's
    // random-key traffic does (the 4,096 names above stay in them). The names are laid out
    // in the order they are used, so reading them costs little next to the table.
    let mut order: Vec<u64> = (0..leaves).collect();
    fastrand::shuffle(&mut order);
    let spread: Vec<String> = order.iter().map(|&i| leaf_name(i)).collect();
    let mut k = 0;
    g.bench_function("check/3-level chain, random keys across 1M", |b| {
        b.iter(|| {
            k = if k + 1 == spread.len() { 0 } else { k + 1 };
            limiter.check(black_box(&spread[k]))
        })
    });
    // The same, one decision at a time: the next name depends on the last decision, so
    // the CPU cannot overlap two lookups' cache misses, as in nginx, where thousands of
    // instructions of other work separate two requests' decisions.
    let mut k = 0;
    g.bench_function("check/3-level chain, random keys across 1M, serialized", |b| {
        b.iter(|| {
            let d = limiter.check(&spread[k]);
            k += 1 + (d.fill.to_bits() & 1) as usize;
            if k >= spread.len() {
                k = 0;
            }
            d
        })
    });
    let mut k = 0;
    g.bench_function("account/3-level chain, random keys across 1M", |b| {
        b.iter(|| {
            k = if k + 1 == spread.len() { 0 } else { k + 1 };
            limiter.account(black_box(&spread[k]), 1).unwrap()
        })
    });
    // A key per client under a template (`key_*`, no quota per key), a million keys made in
    // order first, then accounted across in a random order: nginx's `yarl_account
    // key_$arg_q` of `make bench-nginx`, beside the same million quotas: the template's
    // prefix, the override filter (no override here, so the quota index is not probed),
    // then the key table.
    let keyed = Arc::new(
        Limiter::builder().clock(clock.clone()).capacity(1_050_000).keys(2_200_000).build(),
    );
    load(&keyed);
    keyed.apply_quotas(&[QuotaUpdate {
        id: QUOTAS + 1,
        name: "key_*".into(),
        epoch: QUOTAS + 1,
        deleted: false,
        reset_epoch: 0,
        limits: Limits::from_units(1e6, 1e9, 1e9).unwrap(),
        parent: None,
    }]);
    let key_names: Vec<String> = order.iter().map(|&i| format!("key_{}", leaf_name(i))).collect();
    for i in 0..leaves {
        keyed.account(&format!("key_{}", leaf_name(i)), 1).unwrap();
    }
    // A key whose probe window is full of undrained keys (the clock stands still here) is
    // refused a slot and counted in the template's own bucket: about 1 in 10,000 at this
    // load, as in nginx.
    let t = &keyed.template_keys()[0];
    assert_eq!(t.keys + t.refused, leaves, "{t:?}");
    assert!(t.refused < leaves / 1000, "{t:?}");
    let mut k = 0;
    g.bench_function("account/template key, random keys across 1M", |b| {
        b.iter(|| {
            k = if k + 1 == key_names.len() { 0 } else { k + 1 };
            keyed.account(black_box(&key_names[k]), 1).unwrap()
        })
    });
    // The same keys with 1,000 overrides (per-tenant quotas under the template): a key
    // whose bit in the override filter one of them took probes the quota index first.
    let overrides: Vec<QuotaUpdate> = (0..1000)
        .map(|i| QuotaUpdate {
            id: QUOTAS + 2 + i,
            name: format!("key_tenant{i}"),
            epoch: QUOTAS + 2 + i,
            deleted: false,
            reset_epoch: 0,
            limits: Limits::from_units(1e6, 1e9, 1e9).unwrap(),
            parent: None,
        })
        .collect();
    keyed.apply_quotas(&overrides);
    g.bench_function("account/template key, random keys across 1M, 1,000 overrides", |b| {
        b.iter(|| {
            k = if k + 1 == key_names.len() { 0 } else { k + 1 };
            keyed.account(black_box(&key_names[k]), 1).unwrap()
        })
    });
    g.bench_function("check/unknown name", |b| b.iter(|| limiter.check(black_box("s3_nope_read"))));
    g.bench_function("account/3-level chain, one key", |b| {
        b.iter(|| limiter.account(black_box(&hot), 1).unwrap())
    });
    let real = Limiter::builder().clock(Arc::new(MonotonicClock::new())).build();
    real.apply_quotas(&[QuotaUpdate {
        id: 1,
        name: hot.clone(),
        epoch: 1,
        deleted: false,
        reset_epoch: 0,
        limits: Limits::from_units(1e6, 1e9, 1e9).unwrap(),
        parent: None,
    }]);
    g.bench_function("check/one level, monotonic clock", |b| {
        b.iter(|| real.check(black_box(&hot)))
    });
    g.finish();

    // One round of the agent: 100,000 leaves counted since the last one, and a root's answer
    // carrying them (and nothing else) back.
    const CHANGED: u64 = 100_000;
    let mut engine =
        SyncEngine::new(limiter.clone(), vec!["http://127.0.0.1:1".into()], SyncConfig::default())
            .unwrap();
    let mut g = c.benchmark_group("sync");
    g.sample_size(10);
    let now = std::cell::Cell::new(1u64);
    let mut version = 0;
    g.bench_function("round/100k changed counters of 1M", |b| {
        b.iter_batched(
            || {
                now.set(now.get() + 1_000_000_000);
                version += 1;
                clock.set(now.get());
                let mut counters = Vec::with_capacity(CHANGED as usize);
                for _ in 0..CHANGED {
                    let i = fastrand::u64(0..leaves);
                    limiter.account(&leaf_name(i), 1).unwrap();
                    counters.push((TENANTS + BUCKETS + i + 1, 1000, 0));
                }
                counters.sort_unstable();
                counters.dedup_by_key(|c| c.0);
                answer(counters, version, limiter.epoch())
            },
            |resp| {
                let calls = engine.begin_round(now.get());
                assert_eq!(calls.len(), 1);
                engine.on_response(0, Ok(resp), Duration::from_millis(1), now.get());
                engine.end_round(now.get())
            },
            BatchSize::PerIteration,
        )
    });
    // The same round for 100,000 of the template's million keys: the agent learns the new
    // dirty keys' ids, sends them with their template, and finds them again by id in the
    // answer (make bench-nginx's template variant).
    let mut kengine =
        SyncEngine::new(keyed.clone(), vec!["http://127.0.0.1:1".into()], SyncConfig::default())
            .unwrap();
    g.bench_function("round/100k changed keys of 1M", |b| {
        // Timed by hand: the answer is made from the round's own request (the keys' ids are
        // the block's to derive), and making it is the root's work, not the agent's, so
        // like the row above it stays outside the time.
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                now.set(now.get() + 1_000_000_000);
                clock.set(now.get());
                for _ in 0..CHANGED {
                    keyed.account(&key_names[fastrand::usize(0..key_names.len())], 1).unwrap();
                }
                let t = std::time::Instant::now();
                let calls = kengine.begin_round(now.get());
                spent += t.elapsed();
                assert_eq!(calls.len(), 1);
                version += 1;
                let mut counters: Vec<_> = calls[0]
                    .request
                    .batches
                    .iter()
                    .flat_map(|b| b.deltas.iter().map(|d| (d.0, 1000, 0)))
                    .collect();
                counters.sort_unstable();
                counters.dedup_by_key(|c| c.0);
                let resp = answer(counters, version, keyed.epoch());
                drop(calls);
                let t = std::time::Instant::now();
                kengine.on_response(0, Ok(resp), Duration::from_millis(1), now.get());
                black_box(kengine.end_round(now.get()));
                spent += t.elapsed();
            }
            spent
        })
    });
    g.finish();
}

/// A root's answer carrying `counters` back, as yarl-root gives it: with the epoch it
/// holds, which makes the agent compare it with each counter's quota version.
fn answer(counters: Vec<(u64, u64, u64)>, version: u64, epoch: u64) -> SyncResponse {
    SyncResponse {
        v: PROTOCOL_VERSION,
        root_instance: 1,
        acked_seq: u64::MAX,
        version,
        counters,
        quotas: Vec::new(),
        epoch,
        more: false,
        root_epoch: Some(epoch),
        key_secret: None,
        limiters: None,
        shard: None,
        grants: Vec::new(),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
