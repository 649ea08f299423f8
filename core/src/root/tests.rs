use super::*;
use crate::proto::DeltaBatch;
use crate::quota::Limits;

const S: u64 = 1_000_000_000;

fn quota(id: u64, epoch: u64, limit: f64, deleted: bool) -> QuotaUpdate {
    QuotaUpdate {
        id,
        name: format!("q{id}"),
        epoch,
        deleted,
        limits: Limits::from_units(limit, 10.0, 20.0).unwrap(),
        parent: None,
    }
}

fn req(limiter: &str, batches: Vec<(u64, Vec<(u64, u64)>)>) -> SyncRequest {
    SyncRequest {
        v: PROTOCOL_VERSION,
        limiter: limiter.into(),
        root_instance: None,
        since: 0,
        epoch: 0,
        batches: batches
            .into_iter()
            .map(|(seq, deltas)| DeltaBatch {
                seq,
                deltas: deltas.into_iter().map(|(id, d)| (id, d, 0)).collect(),
            })
            .collect(),
        hints: vec![],
    }
}

fn root() -> RootState {
    let mut r = RootState::new(RootConfig::default());
    r.apply_quotas([quota(1, 1, 1.0, false), quota(2, 2, 1000.0, false)], 0);
    r
}

fn fill(r: &RootState, id: u64, now: u64) -> f64 {
    r.counter(id, now).unwrap().fill
}

#[test]
fn sums_deltas_of_many_limiters() {
    let mut r = root();
    for i in 0..10 {
        r.sync(&req(&format!("l{i}"), vec![(1, vec![(1, 3_000)])]), S).unwrap();
    }
    assert_eq!(fill(&r, 1, S), 30.0);
    assert_eq!(r.limiter_count(), 10);
    assert_eq!(r.stats().deltas_applied, 10);
}

#[test]
fn retried_batches_count_once() {
    let mut r = root();
    let a = req("a", vec![(1, vec![(1, 5_000)])]);
    let resp = r.sync(&a, S).unwrap();
    assert_eq!(resp.acked_seq, 1);
    // The answer was lost; the limiter resends batch 1 with batch 2.
    let again = r.sync(&req("a", vec![(1, vec![(1, 5_000)]), (2, vec![(1, 1_000)])]), S).unwrap();
    assert_eq!(again.acked_seq, 2);
    // The same request arrives twice.
    r.sync(&req("a", vec![(2, vec![(1, 1_000)])]), S).unwrap();
    assert_eq!(fill(&r, 1, S), 6.0);
    assert_eq!(r.stats().duplicate_batches, 2);
    // Another limiter's seq space is its own.
    r.sync(&req("b", vec![(1, vec![(1, 1_000)])]), S).unwrap();
    assert_eq!(fill(&r, 1, S), 7.0);
}

#[test]
fn counters_leak_with_time() {
    let mut r = root();
    r.sync(&req("a", vec![(1, vec![(1, 5_000), (2, 5_000_000)])]), S).unwrap();
    assert_eq!(fill(&r, 1, 3 * S), 3.0); // 1 unit/s
    assert_eq!(fill(&r, 2, S + S / 2), 4_500.0); // 1000 units/s
    assert_eq!(fill(&r, 1, 100 * S), 0.0);
}

#[test]
fn answers_only_counters_changed_since_previous_sync() {
    let mut r = root();
    let first = r.sync(&req("a", vec![(1, vec![(1, 1_000), (2, 1_000)])]), S).unwrap();
    assert_eq!(first.counters.len(), 2);
    let mut next = req("a", vec![]);
    next.root_instance = Some(first.root_instance);
    next.since = first.version;
    assert!(r.sync(&next, S).unwrap().counters.is_empty());
    r.sync(&req("b", vec![(1, vec![(2, 2_000)])]), S).unwrap();
    let third = r.sync(&next, S).unwrap();
    assert_eq!(third.counters.len(), 1);
    assert_eq!(third.counters[0].0..=third.counters[0].1, 2..=3_000);
    // A limiter that knew another instance (this root restarted) gets everything.
    next.root_instance = Some(first.root_instance ^ 1);
    assert_eq!(r.sync(&next, S).unwrap().counters.len(), 2);
}

#[test]
fn quotas_above_the_limiters_epoch_with_tombstones_and_pages() {
    let mut r = RootState::new(RootConfig { page_size: 2, ..RootConfig::default() });
    r.apply_quotas((1..=5).map(|i| quota(i, i, 1.0, false)), 0);
    r.apply_quotas([quota(2, 6, 1.0, true)], 0);
    assert_eq!((r.epoch(), r.quota_count()), (6, 4));
    let mut q = req("a", vec![]);
    let mut seen = vec![];
    loop {
        let resp = r.sync(&q, S).unwrap();
        seen.extend(resp.quotas.iter().map(|u| (u.id, u.epoch, u.deleted)));
        q.epoch = resp.epoch;
        if !resp.more {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![(1, 1, false), (3, 3, false), (4, 4, false), (5, 5, false), (2, 6, true)]
    );
    assert_eq!(q.epoch, 6);
    assert!(r.sync(&q, S).unwrap().quotas.is_empty());
}

#[test]
fn hints_merge_by_max_and_are_idempotent() {
    let mut r = root();
    r.sync(&req("a", vec![(1, vec![(1, 4_000)])]), S).unwrap();
    let mut h = req("b", vec![]);
    h.hints = vec![(1, 9_000), (2, 100), (77, 5)];
    r.sync(&h, S).unwrap();
    r.sync(&h, S).unwrap();
    assert_eq!(fill(&r, 1, S), 9.0);
    h.hints = vec![(1, 2_000)];
    r.sync(&h, S).unwrap();
    assert_eq!(fill(&r, 1, S), 9.0, "a lower hint never lowers a counter");
    assert_eq!(fill(&r, 2, S), 0.1);
}

#[test]
fn unknown_and_deleted_quotas_take_no_memory() {
    let mut r = root();
    let deltas: Vec<_> = (1000..11_000).map(|id| (id, 1)).collect();
    r.sync(&req("a", vec![(1, deltas)]), S).unwrap();
    assert_eq!(r.counter_count(), 0);
    assert_eq!(r.stats().deltas_unknown, 10_000);
    r.sync(&req("a", vec![(2, vec![(1, 1_000)])]), S).unwrap();
    assert_eq!(r.counter_count(), 1);
    r.apply_quotas([quota(1, 9, 1.0, true)], S);
    assert_eq!(r.counter_count(), 0);
    assert!(r.counter(1, S).is_none());
}

#[test]
fn refuses_bad_requests() {
    let mut r =
        RootState::new(RootConfig { max_limiters: 2, max_entries: 3, ..RootConfig::default() });
    let mut q = req("a", vec![]);
    q.v = 2;
    assert_eq!(r.sync(&q, 0), Err(SyncError::UnsupportedVersion(2)));
    assert_eq!(r.sync(&req("", vec![]), 0), Err(SyncError::BadLimiterId));
    assert_eq!(r.sync(&req(&"x".repeat(129), vec![]), 0), Err(SyncError::BadLimiterId));
    assert_eq!(r.sync(&req("a", vec![(1, vec![(1, 1); 4])]), 0), Err(SyncError::TooLarge(4, 3)));
    r.sync(&req("a", vec![]), 0).unwrap();
    r.sync(&req("b", vec![]), 0).unwrap();
    assert_eq!(r.sync(&req("c", vec![]), S), Err(SyncError::TooManyLimiters(2)));
    // Idle limiters are forgotten, making room.
    assert!(r.sync(&req("c", vec![]), 601 * S).is_ok());
}

#[test]
fn sweep_drops_drained_counters_and_idle_limiters() {
    let mut r = root();
    r.sync(&req("a", vec![(1, vec![(1, 10_000), (2, 2_000)])]), S).unwrap();
    r.sweep(S + S / 2);
    assert_eq!(r.counter_count(), 2, "q2 drained but its demand is recent");
    r.sweep(4 * S);
    assert_eq!(r.counter_count(), 1, "q2 drained (1000/s) and quiet, q1 not (1/s)");
    r.sweep(700 * S);
    assert_eq!((r.counter_count(), r.limiter_count()), (0, 0));
}

#[test]
fn limit_change_drains_at_the_old_rate_first() {
    let mut r = root();
    r.sync(&req("a", vec![(1, vec![(1, 10_000)])]), 0).unwrap();
    // 1 unit/s for 4 s, then 0.001 units/s.
    r.apply_quotas([quota(1, 5, 0.001, false)], 4 * S);
    assert_eq!(fill(&r, 1, 4 * S), 6.0);
    assert_eq!(fill(&r, 1, 5 * S), 5.999);
}

#[test]
fn counter_view_reports_rate_and_probability() {
    let mut r = root();
    for i in 1..=20 {
        r.sync(&req("a", vec![(i, vec![(2, 500_000)])]), i * S / 2).unwrap();
    }
    let v = r.counter(2, 10 * S).unwrap();
    // 500 units every 0.5 s is 1000 units/s; the meter needs a few time constants to settle.
    assert!((v.rate - 1000.0).abs() < 200.0, "{v:?}");
    assert_eq!(v.fill, 500.0);
    assert_eq!(v.drop_probability, 1.0);
}

#[test]
fn demand_counts_rejected_attempts_too() {
    let mut r = root();
    // Two limiters, each sending 300 units admitted + 600 refused once a second, half a
    // second apart: 1800 units/s attempted in all, whenever the window is read.
    let mut seq = [0u64; 2];
    for k in 1..=20u64 {
        let l = (k % 2) as usize;
        seq[l] += 1;
        let b = DeltaBatch { seq: seq[l], deltas: vec![(2, 300_000, 600_000)] };
        let q = SyncRequest { batches: vec![b], ..req(&format!("l{l}"), vec![]) };
        let resp = r.sync(&q, k * S / 2 + 1).unwrap();
        if k > 5 {
            let (_, _, demand) = resp.counters[0];
            assert!((1_700_000..=1_900_000).contains(&demand), "{k}: {demand}");
        }
    }
    let v = r.counter(2, 10 * S).unwrap();
    assert!(v.rate < 700.0, "the admin rate shows admitted only: {v:?}");
    // Demand keeps a drained counter alive through a sweep; silence lets it go.
    r.sweep(10 * S + S / 2);
    assert_eq!(r.counter_count(), 1);
    r.sweep(20 * S);
    assert_eq!(r.counter_count(), 0);
}

#[test]
fn quota_count_follows_inserts_replaces_and_deletes() {
    let mut r = root();
    assert_eq!(r.quota_count(), 2);
    r.apply_quotas([quota(1, 5, 2.0, false), quota(3, 6, 1.0, false)], 0);
    assert_eq!(r.quota_count(), 3);
    r.apply_quotas([quota(1, 7, 2.0, true), quota(1, 7, 2.0, true), quota(9, 8, 1.0, true)], 0);
    assert_eq!(r.quota_count(), 2, "a tombstone counts once, an unknown one not at all");
    r.apply_quotas([quota(1, 4, 2.0, false)], 0);
    assert_eq!(r.quota_count(), 2, "an older version does not resurrect");
}

/// Review finding: one hint (or delta) of u64::MAX pinned a quota shut for years.
#[test]
fn hostile_fills_are_capped() {
    let mut r = root();
    let mut h = req("evil", vec![(1, vec![(2, u64::MAX)])]);
    h.hints = vec![(1, u64::MAX)];
    r.sync(&h, S).unwrap();
    // q1: limit 1/s, high 20 -> cap 2·20 + 60·1 = 100 units; q2: 1000/s -> 2·20 + 60000.
    assert_eq!(fill(&r, 1, S), 100.0);
    assert_eq!(fill(&r, 2, S), 60_040.0);
    assert_eq!(fill(&r, 2, S + 61 * S), 0.0, "drained within about a minute");
}
