//! The root's work per sync, without HTTP: 300 limiters, each syncing once per (virtual)
//! second with 1,000 changed counters drawn at random from 1,000,000 quotas — the load of
//! issue 12's target, `make bench-root`'s 300-limiter point, on `RootState` alone; and one
//! limiter with 50,000 changed counters a second, what one nginx sends under
//! `make bench-nginx`'s account load (a random quota of the million per request).
//!
//! Each measured iteration is one limiter's sync (its deltas applied, its answer built), the
//! clock moving on by 1/limiters s; the incremental sweep runs as `yarl-root` runs it (20,000
//! counters every 0.1 s), so its cost is in the figure too. Before measuring, 12 virtual
//! seconds of the same load fill the counters, the change log and (by interest) every
//! limiter's interest, which holds 10 s of what it named.
//!
//! Run: `cargo bench -p yarl-core --bench root`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::time::{Duration, Instant};
use yarl_core::proto::{DeltaBatch, SyncRequest, PROTOCOL_VERSION};
use yarl_core::{Limits, QuotaUpdate, RootConfig, RootState};

const QUOTAS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

struct Cluster {
    root: RootState,
    rng: fastrand::Rng,
    now: u64,
    turn: u64,
    /// Per limiter: `(root_instance, since, next seq)`.
    links: Vec<(Option<u64>, u64, u64)>,
    interest: bool,
    limiters: u64,
    changed: usize,
    /// Each batch says all its counts had drained (a limiter's cold quotas, whose counts
    /// a root credits with its counters' wasted drain).
    drained: bool,
}

impl Cluster {
    fn new(interest: bool, limiters: u64, changed: usize, drained: bool) -> Self {
        let mut root = RootState::new(RootConfig::default());
        let limits = Limits::from_units(100.0, 150.0, 300.0).expect("valid limits");
        root.apply_quotas(
            (1..=QUOTAS).map(|id| QuotaUpdate {
                id,
                name: format!("q{id}"),
                epoch: id,
                deleted: false,
                reset_epoch: 0,
                limits,
                parent: None,
            }),
            1,
        );
        Cluster {
            root,
            rng: fastrand::Rng::with_seed(7),
            now: SECOND,
            turn: 0,
            links: vec![(None, 0, 1); limiters as usize],
            interest,
            limiters,
            changed,
            drained,
        }
    }

    fn request(&mut self) -> SyncRequest {
        let i = (self.turn % self.limiters) as usize;
        let mut ids: Vec<u64> = (0..self.changed).map(|_| self.rng.u64(1..=QUOTAS)).collect();
        ids.sort_unstable();
        ids.dedup();
        let (instance, since, seq) = self.links[i];
        self.links[i].2 += 1;
        SyncRequest {
            v: PROTOCOL_VERSION,
            limiter: format!("bench-{i}"),
            root_instance: instance,
            since,
            epoch: QUOTAS,
            batches: vec![{
                let deltas: Vec<_> =
                    ids.into_iter().map(|id| (id, 1000 * self.rng.u64(1..=3), 0)).collect();
                let drained =
                    if self.drained { deltas.iter().map(|d| d.1).collect() } else { Vec::new() };
                DeltaBatch { seq, deltas, epoch: Some(QUOTAS), drained }
            }],
            hints: vec![],
            seen_epoch: Some(QUOTAS),
            interest: self.interest,
            watch: vec![],
            key_templates: Vec::new(),
            hinted_seq: None,
            in_flight: Vec::new(),
            view_age_ns: None,
        }
    }

    /// One sync, and the sweep's step when one is due; the counters answered.
    fn sync(&mut self, req: &SyncRequest) -> usize {
        let i = (self.turn % self.limiters) as usize;
        self.turn += 1;
        self.now += SECOND / self.limiters;
        let answer = self.root.sync_from(req, None, self.now).expect("a valid sync");
        self.links[i].0 = Some(answer.root_instance);
        self.links[i].1 = answer.version;
        // Every 0.1 s of the virtual clock.
        let tenth = (self.limiters / 10).max(1);
        if self.turn.is_multiple_of(tenth) {
            for _ in 0..(10 / self.limiters).max(1) {
                self.root.sweep_step(self.now, 20_000);
            }
        }
        answer.counters.len()
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("root");
    g.sample_size(20);
    for (interest, limiters, changed, drained) in [
        (true, 300, 1_000, false),
        (false, 300, 1_000, false),
        (false, 300, 1_000, true),
        (false, 1, 50_000, false),
    ] {
        let name = &format!(
            "sync/{limiters} {} x {changed} of 1M, {}{}",
            if limiters == 1 { "limiter" } else { "limiters" },
            if interest { "by interest" } else { "every change" },
            if drained { ", all drained" } else { "" }
        );
        // Built on first use, so that a filter (`cargo bench --bench root -- interest`)
        // skips the other variant's set-up.
        let mut cluster: Option<Cluster> = None;
        g.bench_function(name, |b| {
            let cl = cluster.get_or_insert_with(|| {
                let mut cl = Cluster::new(interest, limiters, changed, drained);
                let mut answered = 0;
                for _ in 0..12 * limiters {
                    let req = cl.request();
                    answered = cl.sync(&req);
                }
                println!(
                    "\n{name}: {} counters held, {answered} in the last answer after 12 s",
                    cl.root.counter_count(),
                );
                cl
            });
            b.iter_custom(|iters| {
                let mut took = Duration::ZERO;
                for _ in 0..iters {
                    let req = cl.request();
                    let t = Instant::now();
                    black_box(cl.sync(&req));
                    took += t.elapsed();
                }
                took
            })
        });
    }
    copy(&mut g);
    g.finish();
}

/// A restarted root's start from a live one (`yarl-root --copy-from`): 1,000,000 counters
/// and 300 sessions copied out (what the live root's syncs wait for), as JSON (what it
/// sends), and copied in.
fn copy(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    // Built on first use, as above.
    let mut state: Option<(RootState, yarl_core::root::RootCopy)> = None;
    g.bench_function("copy/out, 1M counters and 300 sessions", |b| {
        let (root, _) = state.get_or_insert_with(copy_setup);
        b.iter(|| black_box(root.copy_out(2 * SECOND).counters.len()));
    });
    g.bench_function("copy/out as JSON, 1M counters and 300 sessions", |b| {
        let (root, _) = state.get_or_insert_with(copy_setup);
        b.iter(|| black_box(serde_json::to_vec(&root.copy_out(2 * SECOND)).expect("json").len()));
    });
    g.bench_function("copy/in, 1M counters and 300 sessions", |b| {
        let (_, copy) = state.get_or_insert_with(copy_setup);
        b.iter_batched(
            || Cluster::new(false, 1, 0, false).root,
            // The root is handed back, so freeing it (a million counters) stays outside the
            // time, as building it does.
            |mut r| {
                let report = r.copy_in(copy, 0, 2 * SECOND).expect("same shard");
                (r, report)
            },
            criterion::BatchSize::LargeInput,
        );
    });
}

/// A root with 1,000,000 counters (one limiter's sync of every quota) and 300 sessions,
/// and its copy.
fn copy_setup() -> (RootState, yarl_core::root::RootCopy) {
    let mut cl = Cluster::new(false, 300, 0, false);
    for i in 0..300u64 {
        let mut req = cl.request();
        req.batches[0].deltas = if i == 0 {
            (1..=QUOTAS).map(|id| (id, 100_000, 0)).collect()
        } else {
            vec![(i, 1000, 0)]
        };
        cl.sync(&req);
    }
    let copy = cl.root.copy_out(cl.now);
    println!(
        "\ncopy: {} counters, {} sessions, {} MB of JSON",
        copy.counters.len(),
        copy.sessions.len(),
        serde_json::to_vec(&copy).expect("json").len() / 1_000_000
    );
    (cl.root, copy)
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
