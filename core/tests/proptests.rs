//! Property tests for the counter and merge laws: exact, overflow-free leaky buckets; the
//! root's sum of deltas is a G-counter (order-free, each batch once); hints and the
//! limiter's view of several roots merge by max (commutative, associative, idempotent).

use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use yarl_core::units::{
    drained, LeakyBucket, Rate, MAX_WEIGHT_UNITS, MAX_WINDOW_SECS, MILLI, NANOS_PER_SEC,
};
use yarl_core::{
    Clock, Limiter, Limits, ManualClock, QuotaUpdate, RootConfig, RootState, SyncConfig, SyncEngine,
};

const MAX_RATE: u64 = 1_000_000_000_000 * MILLI;

fn quota(id: u64, limit_milli: u64) -> QuotaUpdate {
    QuotaUpdate {
        id,
        name: format!("q{id}"),
        epoch: id,
        deleted: false,
        reset_epoch: 0,
        // Bursts far above any fill here: the root's cap (2 x high_burst + a minute of the
        // limit) must not interfere with the merge laws.
        limits: Limits::from_milli(limit_milli, 1 << 50, 1 << 50).unwrap(),
        parent: None,
    }
}

/// Any rate a quota can have: 0.001 to 1e12 units per window, every kind of window from one
/// second to 30 days.
fn any_rate() -> impl Strategy<Value = Rate> {
    let window = prop_oneof![
        Just(1u64),
        1u64..=4_095,
        (1u64..=4_095).prop_map(|m| m * 60),
        (1u64..=720).prop_map(|h| h * 3_600),
        (1u64..=30).prop_map(|d| d * 86_400),
        Just(MAX_WINDOW_SECS),
    ];
    (prop_oneof![Just(1u64), Just(MAX_RATE), 1u64..=MAX_RATE], window)
        .prop_map(|(milli, w)| Rate::new(milli, w).unwrap())
}

fn root(ids: &[(u64, u64)]) -> RootState {
    let mut r = RootState::new(RootConfig::default());
    r.apply_quotas(ids.iter().map(|&(id, l)| quota(id, l)), 0);
    r
}

fn request(limiter: &str, batches: Vec<DeltaBatch>, hints: Vec<(u64, u64)>) -> SyncRequest {
    SyncRequest {
        v: PROTOCOL_VERSION,
        limiter: limiter.into(),
        root_instance: None,
        since: 0,
        epoch: 0,
        batches,
        hints,
        seen_epoch: None,
        interest: false,
        watch: Vec::new(),
        key_templates: Vec::new(),
        hinted_seq: None,
        in_flight: Vec::new(),
        view_age_ns: None,
    }
}

fn fills(r: &RootState, ids: &[u64], now: u64) -> Vec<f64> {
    ids.iter().map(|&id| r.counter(id, now).map_or(0.0, |c| c.fill)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Draining in many steps gives exactly the fill of draining once: no drift, ever.
    #[test]
    fn drain_is_step_independent(
        fill in 0u64..u64::MAX,
        rate in any_rate(),
        steps in prop::collection::vec(0u64..10 * NANOS_PER_SEC, 1..50),
    ) {
        let mut stepwise = LeakyBucket { fill, at: 0, carry: 0 };
        let mut t = 0;
        for s in &steps {
            t += s;
            stepwise.advance(t, rate);
        }
        let mut once = LeakyBucket { fill, at: 0, carry: 0 };
        once.advance(t, rate);
        prop_assert_eq!(stepwise.fill, once.fill);
    }

    /// Any sequence of maximal weights and decade-long gaps at any rate neither panics nor
    /// wraps: the fill stays within [0, u64::MAX] and only grows by adds.
    #[test]
    fn no_overflow_for_ten_years_of_maximal_traffic(
        rate in any_rate(),
        ops in prop::collection::vec((0u64..=MAX_WEIGHT_UNITS * MILLI, 0u64..=10 * 365 * 86_400 * NANOS_PER_SEC), 1..40),
    ) {
        let mut b = LeakyBucket::default();
        let mut t = 0u64;
        for (w, gap) in ops {
            t = t.saturating_add(gap);
            let before = b.fill;
            b.advance(t, rate);
            prop_assert!(b.fill <= before);
            b.add(w);
            prop_assert!(b.fill >= w);
        }
    }

    /// Draining is exact: whatever the steps, the total drained over `t` from an unbounded
    /// fill is `floor(milli · t / window)`, the rational rate with nothing lost to rounding.
    #[test]
    fn drain_is_the_exact_rational_rate(
        rate in any_rate(),
        steps in prop::collection::vec(0u64..=40 * 86_400 * NANOS_PER_SEC, 1..30),
    ) {
        let mut b = LeakyBucket { fill: u64::MAX, at: 0, carry: 0 };
        let mut t = 0u64;
        for s in &steps {
            t += s;
            b.advance(t, rate);
        }
        let exact = u128::from(rate.milli()) * u128::from(t)
            / (u128::from(rate.window_secs()) * u128::from(NANOS_PER_SEC));
        let exact = u64::try_from(exact).unwrap_or(u64::MAX);
        prop_assert_eq!(b.fill, u64::MAX.saturating_sub(exact));
        let (whole, rem) = drained(rate, t, 0);
        prop_assert_eq!(whole, exact);
        prop_assert!(rem < rate.window_secs() * NANOS_PER_SEC);
    }

    /// Limits round-trip through every form they travel in (the v1 JSON, the v2 wire's rate
    /// word, the admin API's units and window text) across the whole range, unchanged.
    #[test]
    fn limits_round_trip_across_the_whole_range(
        rate in any_rate(),
        low in 0u64..=1_000_000_000_000_000_000,
        extra in 0u64..=1_000_000_000_000_000,
        dry_run in any::<bool>(),
    ) {
        let high = (low + extra).min(1_000_000_000_000_000_000);
        let l = Limits::from_milli_per(rate.milli(), rate.window_secs(), low, high)
            .unwrap()
            .with_dry_run(dry_run);
        prop_assert_eq!(l.limit(), rate);
        let json: Limits = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        prop_assert_eq!(json, l);
        let wire = Limits::from_rate_word(l.limit().word(), low, high).unwrap();
        prop_assert_eq!(wire, l.with_dry_run(false));
        let per = yarl_core::units::parse_window(&rate.window_text()).unwrap();
        prop_assert_eq!(per, rate.window_secs());
        let units = Limits::from_units_per(l.limit_units(), per, l.low_burst_units(), l.high_burst_units()).unwrap();
        prop_assert_eq!(units.limit(), rate);
    }

    /// Root sums: batches from different limiters applied in any order give the same fills,
    /// and a batch delivered twice (a retry) counts once.
    #[test]
    fn root_sum_is_order_free_and_exactly_once(
        deltas in prop::collection::vec((0usize..4, 1u64..4, 0u64..1_000_000), 1..30),
        order_seed in any::<u64>(),
        dup in prop::collection::vec(any::<bool>(), 30),
    ) {
        let ids = [1u64, 2, 3];
        let quotas: Vec<_> = ids.iter().map(|&i| (i, 1)).collect();
        // Each limiter numbers its own batches 1, 2, 3, ...
        let mut per_limiter: Vec<Vec<DeltaBatch>> = vec![vec![]; 4];
        for (l, id, amount) in deltas {
            let seq = per_limiter[l].len() as u64 + 1;
            per_limiter[l].push(DeltaBatch { seq, deltas: vec![(id, amount, 0)], epoch: None, drained: Vec::new() });
        }
        let mut a = root(&quotas);
        for (l, batches) in per_limiter.iter().enumerate() {
            a.sync(&request(&format!("l{l}"), batches.clone(), vec![]), 0).unwrap();
        }
        // Interleave the limiters' requests randomly, one batch each, resending some.
        let mut b = root(&quotas);
        let mut rng = fastrand::Rng::with_seed(order_seed);
        let mut cursors = [0usize; 4];
        let mut k = 0;
        while cursors.iter().zip(&per_limiter).any(|(c, v)| *c < v.len()) {
            let l = rng.usize(0..4);
            if cursors[l] >= per_limiter[l].len() { continue; }
            let batch = per_limiter[l][cursors[l]].clone();
            let times = if dup[k % dup.len()] { 2 } else { 1 };
            for _ in 0..times {
                b.sync(&request(&format!("l{l}"), vec![batch.clone()], vec![]), 0).unwrap();
            }
            cursors[l] += 1;
            k += 1;
        }
        prop_assert_eq!(fills(&a, &ids, 0), fills(&b, &ids, 0));
    }

    /// Hints merge by max: commutative, associative and idempotent.
    #[test]
    fn hints_merge_by_max(
        hints in prop::collection::vec((1u64..4, 0u64..10_000_000), 1..20),
        order_seed in any::<u64>(),
    ) {
        let ids = [1u64, 2, 3];
        let quotas: Vec<_> = ids.iter().map(|&i| (i, 1)).collect();
        let mut a = root(&quotas);
        for &h in &hints {
            a.sync(&request("x", vec![], vec![h]), 0).unwrap();
        }
        let mut shuffled = hints.clone();
        fastrand::Rng::with_seed(order_seed).shuffle(&mut shuffled);
        let mut b = root(&quotas);
        // All at once, twice (idempotent), in another order (commutative), in other groupings
        // (associative).
        b.sync(&request("y", vec![], shuffled.clone()), 0).unwrap();
        for chunk in shuffled.chunks(3) {
            b.sync(&request("z", vec![], chunk.to_vec()), 0).unwrap();
        }
        let expect: Vec<f64> = ids
            .iter()
            .map(|&id| hints.iter().filter(|h| h.0 == id).map(|h| h.1).max().unwrap_or(0) as f64 / 1000.0)
            .collect();
        prop_assert_eq!(fills(&a, &ids, 0), expect.clone());
        prop_assert_eq!(fills(&b, &ids, 0), expect);
    }

    /// A limiter takes the largest value any root reports, whatever order the answers come
    /// in and however often they repeat.
    #[test]
    fn limiter_takes_max_across_roots(
        reports in prop::collection::vec((0usize..3, 0u64..5_000_000), 1..12),
        order_seed in any::<u64>(),
    ) {
        let view = |order: &[(usize, u64)]| {
            let clock = ManualClock::at(NANOS_PER_SEC);
            let l = Arc::new(Limiter::builder().clock(Arc::new(clock.clone())).build());
            l.apply_quotas(&[QuotaUpdate {
                limits: Limits::from_milli(1, 1 << 40, 1 << 40).unwrap(),
                ..quota(1, 1)
            }]);
            let urls = (0..3).map(|i| format!("http://r{i}")).collect();
            let mut e = SyncEngine::new(l.clone(), urls, SyncConfig::default()).unwrap();
            let now = clock.now_nanos();
            e.begin_round(now);
            for &(root, fill) in order {
                let resp = SyncResponse {
                    shard: None,
                    v: PROTOCOL_VERSION, root_instance: 7 + root as u64, acked_seq: 0,
                    version: 1, counters: vec![(1, fill, 0)], quotas: vec![], epoch: 1, more: false,
                    root_epoch: None,
                    key_secret: None,
                    limiters: None,
                    grants: Vec::new(),
                };
                e.on_response(root, Ok(resp), Duration::ZERO, now);
            }
            e.end_round(now);
            l.quota("q1").unwrap().fill
        };
        let mut shuffled = reports.clone();
        fastrand::Rng::with_seed(order_seed).shuffle(&mut shuffled);
        let mut doubled = shuffled.clone();
        doubled.extend_from_slice(&reports);
        let max = reports.iter().map(|r| r.1).max().unwrap() as f64 / 1000.0;
        prop_assert_eq!(view(&reports), max);
        prop_assert_eq!(view(&shuffled), max);
        prop_assert_eq!(view(&doubled), max);
    }
}
