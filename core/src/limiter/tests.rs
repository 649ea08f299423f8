use super::*;
use crate::clock::ManualClock;
use crate::decision::Outcome;
use crate::decision::SeededRandom;
use crate::quota::{Limits, QuotaUpdate};
use crate::units::MAX_WEIGHT_UNITS;
use crate::zone::Block;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;

const S: u64 = 1_000_000_000;

fn q(
    id: u64,
    name: &str,
    epoch: u64,
    limit: f64,
    low: f64,
    high: f64,
    parent: Option<&str>,
) -> QuotaUpdate {
    QuotaUpdate {
        id,
        name: name.into(),
        epoch,
        deleted: false,
        reset_epoch: 0,
        limits: Limits::from_units(limit, low, high).unwrap(),
        parent: parent.map(Into::into),
    }
}

fn tomb(id: u64, name: &str, epoch: u64) -> QuotaUpdate {
    QuotaUpdate { deleted: true, ..q(id, name, epoch, 1.0, 0.0, 0.0, None) }
}

fn setup() -> (Limiter, ManualClock) {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder().clock(Arc::new(clock.clone())).random(SeededRandom::new(42)).build();
    (l, clock)
}

/// Sets the synced fill of `name` to `units` as a root report would.
fn set_fill(l: &Limiter, name: &str, units: f64, now: u64) {
    let (s, _) = l.find(name).unwrap();
    l.slot(s).unwrap().write_base((units * 1000.0) as u64, now);
}

/// Marks `name` hot with the static ratio `r` (what a sync round does).
fn hot(l: &Limiter, name: &str, r: f64) {
    let id = l.quota(name).unwrap().id;
    l.with_counters(|c| {
        let s = c.slot_of(id).unwrap();
        c.set_rates(s, r * c.limit(s), 0.0);
    });
}

#[test]
fn unknown_names_pass() {
    let (l, _) = setup();
    let d = l.check("nope");
    assert_eq!(d.outcome, Outcome::Unlimited);
    assert!(d.allowed());
    assert_eq!(l.account("nope", 5).unwrap().outcome, Outcome::Unlimited);
}

#[test]
fn check_counts_nothing_account_counts_weight() {
    let (l, _) = setup();
    l.apply_quotas(&[q(1, "a", 1, 10.0, 5.0, 5.0, None)]);
    for _ in 0..100 {
        assert_eq!(l.check("a").outcome, Outcome::Passed);
    }
    assert_eq!(l.quota("a").unwrap().fill, 0.0);
    assert_eq!(l.account("a", 3).unwrap().outcome, Outcome::Passed);
    assert_eq!(l.quota("a").unwrap().fill, 3.0);
    assert_eq!(l.account("a", 2).unwrap().outcome, Outcome::Passed);
    // F = 5 = low = high: still passes (F <= low); one more unit makes F > high.
    assert_eq!(l.account("a", 1).unwrap().outcome, Outcome::Passed);
    let d = l.account("a", 1).unwrap();
    assert_eq!(d.outcome, Outcome::Rejected);
    assert_eq!(d.quota.as_deref(), Some("a"));
    assert_eq!(l.quota("a").unwrap().fill, 6.0, "a rejected account adds nothing");
    assert_eq!(l.check("a").outcome, Outcome::Rejected);
    assert_eq!(l.rejections(), 2);
}

#[test]
fn weight_above_maximum_is_a_typed_error() {
    let (l, _) = setup();
    assert_eq!(l.account("a", MAX_WEIGHT_UNITS + 1), Err(WeightError(MAX_WEIGHT_UNITS + 1)));
    assert!(l.account("a", MAX_WEIGHT_UNITS).is_ok());
}

#[test]
fn chain_rejects_on_parent_and_names_it_all_or_nothing() {
    let (l, clock) = setup();
    l.apply_quotas(&[
        q(1, "root", 1, 100.0, 5.0, 5.0, None),
        q(2, "mid", 2, 100.0, 1000.0, 1000.0, Some("root")),
        q(3, "leaf", 3, 100.0, 1000.0, 1000.0, Some("mid")),
    ]);
    assert_eq!(l.quota("leaf").unwrap().parent.as_deref(), Some("mid"));
    assert_eq!(l.account("leaf", 10).unwrap().outcome, Outcome::Passed);
    for n in ["root", "mid", "leaf"] {
        assert_eq!(l.quota(n).unwrap().fill, 10.0, "{n}");
    }
    let d = l.account("leaf", 1).unwrap();
    assert_eq!(d.outcome, Outcome::Rejected);
    assert_eq!(d.quota.as_deref(), Some("root"), "the rejecting ancestor is named");
    for n in ["root", "mid", "leaf"] {
        assert_eq!(l.quota(n).unwrap().fill, 10.0, "{n}: nothing added on rejection");
    }
    // The parent also limits its other children; an unrelated quota does not.
    l.apply_quotas(&[q(4, "other", 4, 1.0, 0.0, 0.0, None)]);
    assert_eq!(l.check("mid").outcome, Outcome::Rejected);
    assert_eq!(l.check("other").outcome, Outcome::Passed);
    let _ = clock;
}

#[test]
fn probabilistic_zone_rejects_the_expected_fraction() {
    let (l, clock) = setup();
    l.apply_quotas(&[q(1, "a", 1, 100.0, 100.0, 200.0, None)]);
    let now = clock.now_nanos();
    for (fill, expect) in [(100.0, 0.0), (125.0, 0.25), (150.0, 0.5), (175.0, 0.75), (200.0, 1.0)] {
        set_fill(&l, "a", fill, now);
        let n = 20_000;
        let rejected = (0..n).filter(|_| l.check("a").outcome == Outcome::Rejected).count();
        let frac = rejected as f64 / n as f64;
        assert!((frac - expect).abs() < 0.015, "fill {fill}: {frac} vs {expect}");
    }
}

#[test]
fn hard_cutoff_when_bursts_equal() {
    let (l, clock) = setup();
    l.apply_quotas(&[q(1, "a", 1, 100.0, 50.0, 50.0, None)]);
    set_fill(&l, "a", 50.0, clock.now_nanos());
    assert!((0..1000).all(|_| l.check("a").outcome == Outcome::Passed));
    set_fill(&l, "a", 50.001, clock.now_nanos());
    assert!((0..1000).all(|_| l.check("a").outcome == Outcome::Rejected));
}

#[test]
fn retry_after_counts_down_to_low_burst_and_is_stable() {
    let (l, clock) = setup();
    l.set_cluster_fresh(true);
    l.apply_quotas(&[q(1, "a", 1, 10.0, 20.0, 20.0, None)]);
    set_fill(&l, "a", 70.0, clock.now_nanos());
    hot(&l, "a", 1.0);
    // (70 - 20) / 10 per second = 5 s.
    let first = l.check("a").retry_after;
    assert_eq!(first, Some(5));
    for _ in 0..50 {
        clock.advance(Duration::from_millis(1));
        assert_eq!(l.check("a").retry_after, first, "no wobble between consecutive requests");
    }
    // Past the horizon (1 s) the counter drains at the full rate and the wait shrinks.
    clock.advance(Duration::from_millis(2950));
    assert_eq!(l.check("a").retry_after, Some(3));
    clock.advance(Duration::from_secs(3));
    assert_eq!(l.check("a").outcome, Outcome::Passed);
}

#[test]
fn estimate_follows_ratio_and_horizon() {
    let clock = ManualClock::at(100 * S);
    let l = Limiter::builder()
        .clock(Arc::new(clock.clone()))
        .correction_ratio(0.5)
        .horizon(Duration::from_secs(2))
        .build();
    l.apply_quotas(&[q(1, "a", 1, 10.0, 1e6, 1e6, None)]);
    set_fill(&l, "a", 100.0, clock.now_nanos());
    // No root has answered yet: ratio 0, full drain.
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.quota("a").unwrap().fill, 90.0);
    l.set_cluster_fresh(true);
    assert!(l.cluster_fresh());
    hot(&l, "a", 0.5);
    // Inside the horizon: drains at (1 - 0.5)·limit.
    assert_eq!(l.quota("a").unwrap().fill, 95.0);
    // 4 s after the sync: 2 s at half rate, 2 s at full rate.
    clock.advance(Duration::from_secs(3));
    assert_eq!(l.quota("a").unwrap().fill, 100.0 - 10.0 - 20.0);
    clock.advance(Duration::from_secs(100));
    assert_eq!(l.quota("a").unwrap().fill, 0.0);
}

#[test]
fn hot_counter_with_ratio_one_holds_the_synced_value_inside_the_horizon() {
    let (l, clock) = setup();
    l.set_cluster_fresh(true);
    l.apply_quotas(&[q(1, "a", 1, 10.0, 1e6, 1e6, None)]);
    set_fill(&l, "a", 100.0, clock.now_nanos());
    hot(&l, "a", 1.0);
    clock.advance(Duration::from_millis(900));
    assert_eq!(l.quota("a").unwrap().fill, 100.0);
    clock.advance(Duration::from_millis(1100));
    assert_eq!(l.quota("a").unwrap().fill, 90.0);
}

#[test]
fn quota_changes_apply_incrementally_by_epoch() {
    let (l, _) = setup();
    let r =
        l.apply_quotas(&[q(1, "a", 1, 10.0, 1.0, 2.0, None), q(2, "b", 2, 5.0, 1.0, 1.0, None)]);
    assert_eq!((r.inserted, l.quota_count(), l.epoch()), (2, 2, 2));
    // Change.
    let r = l.apply_quotas(&[q(1, "a", 3, 20.0, 4.0, 8.0, Some("b"))]);
    assert_eq!(r.updated, 1);
    let a = l.quota("a").unwrap();
    assert_eq!((a.limit, a.low_burst, a.high_burst, a.epoch), (20.0, 4.0, 8.0, 3));
    assert_eq!(a.parent.as_deref(), Some("b"));
    // Stale versions are ignored, whatever order they arrive in.
    let r = l.apply_quotas(&[q(1, "a", 2, 99.0, 0.0, 0.0, None)]);
    assert_eq!(r.stale, 1);
    assert_eq!(l.quota("a").unwrap().limit, 20.0);
    // Re-parent to none.
    l.apply_quotas(&[q(1, "a", 4, 20.0, 4.0, 8.0, None)]);
    assert_eq!(l.quota("a").unwrap().parent, None);
    // Delete; a stale tombstone is ignored, a second apply is idempotent.
    assert_eq!(l.apply_quotas(&[tomb(2, "b", 1)]).stale, 1);
    assert_eq!(l.apply_quotas(&[tomb(2, "b", 5)]).deleted, 1);
    assert_eq!(l.apply_quotas(&[tomb(2, "b", 5)]).deleted, 0);
    assert_eq!(l.check("b").outcome, Outcome::Unlimited);
    assert_eq!(l.quota_count(), 1);
    assert_eq!(l.epoch(), 5);
    // Invalid updates are refused one by one; invalid numbers cannot even be built.
    let bad = q(9, "bad name", 6, 1.0, 0.0, 0.0, None);
    assert_eq!(l.apply_quotas(&[bad]).invalid, 1);
    assert!(crate::Limits::from_milli(1_000, 10, 5).is_err());
}

#[test]
fn parent_arriving_after_child_is_linked() {
    let (l, _) = setup();
    l.apply_quotas(&[q(2, "child", 2, 100.0, 100.0, 100.0, Some("parent"))]);
    assert_eq!(l.quota("child").unwrap().parent, None);
    l.apply_quotas(&[q(1, "parent", 1, 1.0, 0.0, 0.0, None)]);
    assert_eq!(l.quota("child").unwrap().parent.as_deref(), Some("parent"));
    assert_eq!(l.account("child", 1).unwrap().outcome, Outcome::Passed);
    let d = l.account("child", 1).unwrap();
    assert_eq!(d.quota.as_deref(), Some("parent"));
}

#[test]
fn deleted_parent_unlinks_children_and_recreated_parent_relinks() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "p", 1, 1.0, 0.0, 0.0, None),
        q(2, "c", 2, 100.0, 100.0, 100.0, Some("p")),
    ]);
    l.apply_quotas(&[tomb(1, "p", 3)]);
    assert_eq!(l.quota("c").unwrap().parent, None);
    assert_eq!(l.check("c").outcome, Outcome::Passed);
    l.apply_quotas(&[q(7, "p", 4, 1.0, 0.0, 0.0, None)]);
    assert_eq!(l.quota("c").unwrap().parent.as_deref(), Some("p"));
}

#[test]
fn recreated_name_with_new_id_replaces_the_old_quota() {
    let (l, _) = setup();
    l.apply_quotas(&[q(1, "a", 1, 1.0, 0.0, 0.0, None)]);
    l.account("a", 1).unwrap();
    // The tombstone of id 1 was never seen, but id 5 took the name later.
    l.apply_quotas(&[q(5, "a", 9, 50.0, 10.0, 10.0, None)]);
    let a = l.quota("a").unwrap();
    assert_eq!((a.id, a.limit, a.fill), (5, 50.0, 0.0));
    assert_eq!(l.quota_count(), 1);
    // And an older id for the same name does not win back.
    assert_eq!(l.apply_quotas(&[q(3, "a", 4, 1.0, 0.0, 0.0, None)]).stale, 1);
}

#[test]
fn a_cycle_does_not_hang_a_decision() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "x", 1, 1.0, 5.0, 5.0, Some("y")),
        q(2, "y", 2, 1.0, 5.0, 5.0, Some("x")),
    ]);
    assert_eq!(l.account("x", 1).unwrap().outcome, Outcome::Passed);
    // Each slot of the bounded walk counts once per visit: 16 visits over 2 quotas.
    assert_eq!(l.quota("x").unwrap().fill, (MAX_CHAIN / 2) as f64);
}

#[test]
fn freed_slots_are_reused_only_after_quarantine() {
    let (l, clock) = setup();
    l.apply_quotas(&[q(1, "a", 1, 1.0, 0.0, 0.0, None)]);
    l.apply_quotas(&[tomb(1, "a", 2)]);
    l.apply_quotas(&[q(2, "b", 3, 1.0, 0.0, 0.0, None)]);
    assert_eq!(l.used_slots(), 2, "slot of a is still quarantined");
    clock.advance(Duration::from_secs(3));
    l.apply_quotas(&[q(3, "c", 4, 1.0, 0.0, 0.0, None)]);
    assert_eq!(l.used_slots(), 2, "slot of a was reused");
    assert_eq!(l.names(), ["b".to_string(), "c".to_string()].into_iter().collect());
}

#[test]
fn many_quotas_are_all_found() {
    let (l, _) = setup();
    let ups: Vec<_> = (1..=50_000u64)
        .map(|i| q(i, &format!("q{i}"), i, 1.0 + i as f64, 1.0, 2.0, None))
        .collect();
    assert_eq!(l.apply_quotas(&ups).inserted, 50_000);
    for i in (1..=50_000u64).step_by(997) {
        let info = l.quota(&format!("q{i}")).unwrap();
        assert_eq!((info.id, info.limit), (i, 1.0 + i as f64));
    }
    let dels: Vec<_> = (1..=50_000u64)
        .filter(|i| i % 2 == 0)
        .map(|i| tomb(i, &format!("q{i}"), 50_000 + i))
        .collect();
    assert_eq!(l.apply_quotas(&dels).deleted, 25_000);
    assert_eq!(l.quota_count(), 25_000);
    assert!(l.quota("q2").is_none());
    assert!(l.quota("q3").is_some());
}

#[test]
fn concurrent_readers_during_updates() {
    let (l, _) = setup();
    let l = Arc::new(l);
    l.apply_quotas(&[q(1, "hot", 1, 1e6, 1e9, 1e9, None)]);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (l, stop) = (l.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    assert_eq!(l.account("hot", 1).unwrap().outcome, Outcome::Passed);
                    n += 1;
                }
                n
            })
        })
        .collect();
    for e in 2..2_000u64 {
        l.apply_quotas(&[
            q(e, &format!("x{e}"), e, 1.0, 0.0, 0.0, None),
            q(1, "hot", e, 1e6, 1e9, 1e9, None),
        ]);
    }
    stop.store(true, Relaxed);
    let total: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(l.quota("hot").unwrap().fill, total as f64, "no increment lost");
}

#[test]
fn demand_above_the_limit_suppresses_its_excess_share() {
    let (l, clock) = setup();
    l.set_cluster_fresh(true);
    l.apply_quotas(&[q(1, "a", 1, 100.0, 10.0, 1000.0, None)]);
    let now = clock.now_nanos();
    set_fill(&l, "a", 11.0, now);
    // Demand 4x the limit: 3/4 of attempts are refused, far more than the fill zone's 0.1%.
    l.with_counters(|c| c.set_rates(0, 0.0, 400_000.0));
    let n = 20_000;
    let rejected = (0..n).filter(|_| l.check("a").outcome == Outcome::Rejected).count();
    let frac = rejected as f64 / n as f64;
    assert!((frac - 0.75).abs() < 0.015, "{frac}");
    // Below low_burst the demand does not matter: F <= low passes (a client within its burst
    // is never suppressed).
    set_fill(&l, "a", 10.0, now);
    assert!((0..1000).all(|_| l.check("a").allowed()));
    // Nor does it when the cluster view is stale (no root answered).
    set_fill(&l, "a", 11.0, now);
    l.set_cluster_fresh(false);
    let rejected = (0..1000).filter(|_| !l.check("a").allowed()).count();
    assert!(rejected < 20, "{rejected}");
}

#[test]
fn a_clump_of_a_key_under_its_limit_is_not_read_as_demand_above_it() {
    // docs/accuracy.md's Zipf keys: 10/s, bursts 1.5/3 s; a key sending 8.3/s that the
    // roots' 2 s meter read at 17.5/s refused near `low_burst` at 43 %.
    let (l, clock) = setup();
    l.set_cluster_fresh(true);
    l.apply_quotas(&[q(1, "k", 1, 10.0, 15.0, 30.0, None)]);
    let now = clock.now_nanos();
    set_fill(&l, "k", 15.25, now);
    let refused = |l: &Limiter| (0..20_000).filter(|_| !l.check("k").allowed()).count() as f64;
    l.with_counters(|c| c.set_rates(0, 0.0, 17_500.0));
    // The drop zone alone: 0.25 / 15.
    let frac = refused(&l) / 20_000.0;
    assert!((frac - 0.25 / 15.0).abs() < 0.005, "{frac}");
    // 25/s over 2 s is 50 units; less 3 sigma of that count (21.2), 28.8, still above the
    // 20 of the limit: taken as read.
    l.with_counters(|c| c.set_rates(0, 0.0, 25_000.0));
    let frac = refused(&l) / 20_000.0;
    assert!((frac - 0.6).abs() < 0.015, "{frac}");
}

#[test]
fn refused_accounts_are_counted_as_demand_on_the_whole_chain() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "top", 1, 1.0, 1e6, 1e6, None),
        q(2, "p", 2, 1.0, 0.0, 0.0, Some("top")),
        q(3, "c", 3, 1.0, 1e6, 1e6, Some("p")),
    ]);
    assert!(l.account("c", 1).unwrap().allowed());
    assert!(!l.account("c", 5).unwrap().allowed());
    let dirty = l.take_dirty();
    l.with_counters(|c| {
        let got: Vec<_> =
            dirty.iter().map(|&s| (c.id_of(s).unwrap(), c.local(s), c.take_rejected(s))).collect();
        let mut got = got;
        got.sort();
        assert_eq!(got, vec![(1, 1000, 5000), (2, 1000, 5000), (3, 1000, 5000)]);
    });
}

#[test]
fn account_many_is_all_or_nothing_across_names() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "req", 1, 1.0, 100.0, 100.0, None),
        q(2, "bytes", 2, 1.0, 10.0, 10.0, None),
    ]);
    let d = l.account_many(&[("req", 1), ("nope", 5), ("bytes", 8)]).unwrap();
    assert_eq!(d.outcome, Outcome::Passed);
    assert_eq!((l.quota("req").unwrap().fill, l.quota("bytes").unwrap().fill), (1.0, 8.0));
    // bytes passes at F = 8 but then req must not count either when a later name rejects.
    l.account("bytes", 3).unwrap();
    let d = l.account_many(&[("req", 1), ("bytes", 1)]).unwrap();
    assert_eq!((d.outcome, d.quota.as_deref()), (Outcome::Rejected, Some("bytes")));
    assert_eq!(l.quota("req").unwrap().fill, 1.0, "nothing added to req");
    assert_eq!(l.account_many(&[("nope", 1)]).unwrap().outcome, Outcome::Unlimited);
    assert_eq!(l.account_many(&[("req", u64::MAX)]), Err(WeightError(u64::MAX)));
}

#[test]
fn demand_switch_off_leaves_only_the_fill_zone() {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder()
        .clock(Arc::new(clock.clone()))
        .random(SeededRandom::new(7))
        .demand(false)
        .build();
    l.set_cluster_fresh(true);
    l.apply_quotas(&[q(1, "a", 1, 100.0, 10.0, 1000.0, None)]);
    set_fill(&l, "a", 11.0, clock.now_nanos());
    l.with_counters(|c| c.set_rates(0, 0.0, 400_000.0));
    let rejected = (0..2000).filter(|_| !l.check("a").allowed()).count();
    assert!(rejected < 20, "demand off, yet {rejected} of 2000 refused");
}

#[test]
fn local_guard_caps_one_hosts_own_rate_at_the_limit() {
    let clock = ManualClock::at(10 * S);
    let build = |guard: bool| {
        let l = Limiter::builder()
            .clock(Arc::new(clock.clone()))
            .random(SeededRandom::new(1))
            .local_guard(guard)
            .build();
        // 100/s with a large burst: the bucket alone would take 1000 at once.
        l.apply_quotas(&[q(1, "a", 1, 100.0, 1000.0, 1000.0, None)]);
        l
    };
    let guarded = build(true);
    let open = build(false);
    // Half a second after the limiter's reference time: 100 · (0.5 + 0.1) = 60 fit.
    clock.advance(std::time::Duration::from_millis(500));
    let passed = (0..200).filter(|_| guarded.account("a", 1).unwrap().allowed()).count();
    assert_eq!(passed, 60);
    assert_eq!((0..200).filter(|_| open.account("a", 1).unwrap().allowed()).count(), 200);
    // Time gives room back at the limit's rate; check (weight 0) is never guarded.
    clock.advance(std::time::Duration::from_millis(100));
    assert_eq!((0..50).filter(|_| guarded.account("a", 1).unwrap().allowed()).count(), 10);
    assert!(guarded.check("a").allowed());
}

/// Two handles on one block stand for two nginx workers sharing a zone.
fn shared_pair(clock: &ManualClock, quotas: u32) -> (Limiter, Limiter) {
    shared_pair_with_keys(clock, quotas, 0)
}

/// [`shared_pair`] with room for `keys` keys.
fn shared_pair_with_keys(clock: &ManualClock, quotas: u32, keys: u32) -> (Limiter, Limiter) {
    let block = Block::for_capacity(quotas, keys);
    crate::zone::prepare(&block, keys).unwrap();
    let open = || {
        Limiter::builder()
            .clock(Arc::new(clock.clone()))
            .random(SeededRandom::new(3))
            .open(block.clone())
            .unwrap()
    };
    (open(), open())
}

#[test]
fn quotas_made_renamed_and_deleted_at_random_by_two_writers_keep_slots_of_their_own() {
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair_with_keys(&clock, 1024, 0);
    let mut rng = fastrand::Rng::with_seed(17);
    // id → (name, epoch, limit): the quotas that should be held.
    let mut model: HashMap<u64, (String, u64, u64)> = HashMap::new();
    let (mut next_id, mut next_name, mut epoch) = (1u64, 0u64, 1u64);
    for round in 0..400 {
        let mut batch = Vec::new();
        for _ in 0..rng.usize(1..8) {
            epoch += 1;
            let ids: Vec<u64> = model.keys().copied().filter(|i| !batch_has(&batch, *i)).collect();
            let pick = (!ids.is_empty()).then(|| ids[rng.usize(..ids.len())]);
            match (rng.u8(..4), pick) {
                (0, Some(id)) if model.len() > 20 => {
                    let (name, _, _) = model.remove(&id).unwrap();
                    batch.push(tomb(id, &name, epoch));
                }
                (1, Some(id)) => {
                    next_name += 1;
                    let e = model.get_mut(&id).unwrap();
                    *e = (format!("r{next_name}"), epoch, e.2);
                    batch.push(q(id, &e.0, epoch, e.2 as f64, 0.0, 0.0, None));
                }
                _ if model.len() < 100 => {
                    next_name += 1;
                    let e = (format!("n{next_name}"), epoch, rng.u64(1..1000));
                    batch.push(q(next_id, &e.0, epoch, e.2 as f64, 0.0, 0.0, None));
                    model.insert(next_id, e);
                    next_id += 1;
                }
                _ => {}
            }
        }
        let writer = if rng.bool() { &a } else { &b };
        let report = writer.apply_quotas(&batch);
        assert_eq!(report.missing, 0, "round {round}");
        clock.advance(Duration::from_millis(rng.u64(100..600)));
        let mut slots = HashSet::new();
        for (id, (name, _, limit)) in &model {
            for l in [&a, &b] {
                let (s, x) = l.find(name).unwrap_or_else(|| panic!("round {round}: {name} lost"));
                assert_eq!(x.id(), *id, "round {round}: {name}");
                assert_eq!(l.quota(name).unwrap().limit, *limit as f64);
                slots.insert(s);
            }
        }
        assert_eq!(slots.len(), model.len(), "round {round}: two quotas in one slot");
        assert_eq!(a.quota_count(), model.len() as u64);
    }
}

fn batch_has(batch: &[QuotaUpdate], id: u64) -> bool {
    batch.iter().any(|u| u.id == id)
}

#[test]
fn handles_of_one_block_share_quotas_and_counts() {
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair(&clock, 1000);
    a.apply_quotas(&[q(1, "api", 1, 10.0, 5.0, 5.0, None)]);
    assert_eq!(b.quota("api").unwrap().limit, 10.0, "b sees what a applied");
    assert_eq!(b.limiter_id(), a.limiter_id());
    for _ in 0..3 {
        assert!(a.account("api", 1).unwrap().allowed());
        assert!(b.account("api", 1).unwrap().allowed());
    }
    assert_eq!(a.quota("api").unwrap().fill, 6.0, "one counter, not one per handle");
    assert_eq!(b.account("api", 1).unwrap().outcome, Outcome::Rejected);
    assert_eq!((a.rejections(), b.rejections()), (1, 1));
    assert_eq!(a.quota("api").unwrap().rejections, 1);
    // The block refuses a handle that was never prepared, and an unrelated one is separate.
    assert!(matches!(
        Limiter::builder().open(Block::heap(1 << 20)),
        Err(crate::zone::ZoneError::NotPrepared(_))
    ));
}

#[test]
fn the_writer_moves_between_handles_and_rebuilds_its_caches() {
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair(&clock, 1000);
    a.apply_quotas(&[
        q(1, "p", 1, 1.0, 0.0, 0.0, None),
        q(2, "c", 2, 100.0, 100.0, 100.0, Some("later")),
        q(3, "a-name-longer-than-twenty-three-bytes", 3, 5.0, 1.0, 1.0, Some("p")),
    ]);
    // b becomes the writer: it must know ids a inserted, and that c waits for "later".
    b.apply_quotas(&[q(1, "p", 4, 2.0, 0.0, 0.0, None), q(9, "later", 5, 1.0, 0.0, 0.0, None)]);
    assert_eq!(b.quota_count(), 4);
    assert_eq!(a.quota("p").unwrap().limit, 2.0, "updated in place, not inserted twice");
    assert_eq!(a.quota("c").unwrap().parent.as_deref(), Some("later"));
    // Back to a, whose caches are stale now.
    a.apply_quotas(&[tomb(3, "a-name-longer-than-twenty-three-bytes", 6)]);
    assert_eq!(b.quota_count(), 3);
    assert!(b.quota("a-name-longer-than-twenty-three-bytes").is_none());
    assert_eq!(a.names(), b.names());
}

#[test]
fn a_full_block_leaves_new_quotas_unlimited_and_counts_them() {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder().clock(Arc::new(clock.clone())).capacity(100).build();
    let cap = l.zone_usage().capacity;
    let ups: Vec<_> =
        (1..=cap + 50).map(|i| q(i, &format!("q{i}"), i, 1.0, 0.0, 0.0, None)).collect();
    let r = l.apply_quotas(&ups);
    assert_eq!((r.inserted as u64, r.missing), (cap, 50));
    assert_eq!(l.zone_usage().missing, 50);
    assert_eq!(l.quota_count(), cap);
    assert_eq!(l.check(&format!("q{}", cap + 1)).outcome, Outcome::Unlimited);
    assert_eq!(l.check("q1").outcome, Outcome::Passed);
    // Deleting makes room again after the quarantine.
    let dels: Vec<_> = (1..=10).map(|i| tomb(i, &format!("q{i}"), 1000 + i)).collect();
    l.apply_quotas(&dels);
    clock.advance(Duration::from_secs(3));
    let r = l.apply_quotas(&[q(5000, "late", 2000, 1.0, 0.0, 0.0, None)]);
    assert_eq!(r.inserted, 1);
    assert!(l.contains("late"));
}

#[test]
fn names_of_every_length_are_found_and_reported() {
    let (l, _) = setup();
    let names: Vec<String> = (1..=255).map(|n| "x".repeat(n)).collect();
    let ups: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| q(i as u64 + 1, n, i as u64 + 1, 1.0, 0.0, 0.0, None))
        .collect();
    assert_eq!(l.apply_quotas(&ups).inserted, 255);
    for n in &names {
        assert!(l.contains(n), "{}", n.len());
        assert!(!l.contains(&format!("{n}y")));
    }
    l.account(&names[200], 1).unwrap();
    let d = l.account(&names[200], 1).unwrap();
    assert_eq!(d.quota.as_deref(), Some(names[200].as_str()), "the rejecting name is whole");
}

/// A rejected `account_many` with a zero weight leaves nothing to send: its chain is not
/// marked dirty.
#[test]
fn a_refused_zero_weight_counts_nothing() {
    let (l, _) = setup();
    l.apply_quotas(&[q(1, "a", 1, 1.0, 0.0, 0.0, None), q(2, "b", 2, 1.0, 10.0, 10.0, None)]);
    l.account("a", 1).unwrap();
    l.take_dirty();
    let d = l.account_many(&[("b", 0), ("a", 0)]).unwrap();
    assert_eq!(d.outcome, Outcome::Rejected);
    assert_eq!(l.take_dirty(), Vec::<u32>::new(), "zero weights leave nothing to send");
    // Non-zero refused weights are demand on every chain of the request.
    let d = l.account_many(&[("b", 2), ("a", 1)]).unwrap();
    assert_eq!(d.outcome, Outcome::Rejected);
    let (a, _) = l.find("a").unwrap();
    let (b, _) = l.find("b").unwrap();
    assert_eq!(l.take_dirty(), vec![a, b]);
    let rejected = |s| l.slot(s).unwrap().get(crate::zone::slot::REJECTED);
    assert_eq!((rejected(a), rejected(b)), (1000, 2000));
}

#[test]
fn readers_on_other_handles_during_updates() {
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair(&clock, 10_000);
    let (a, b) = (Arc::new(a), Arc::new(b));
    a.apply_quotas(&[q(1, "hot", 1, 1e6, 1e9, 1e9, None)]);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                assert_eq!(b.account("hot", 1).unwrap().outcome, Outcome::Passed);
                assert!(b.check("x-never").outcome == Outcome::Unlimited);
                n += 1;
            }
            n
        })
    };
    for e in 2..3_000u64 {
        // Inserts, deletes and re-inserts, so slots and index entries churn under the reader.
        a.apply_quotas(&[q(e, &format!("x{}", e % 500), e, 1.0, 0.0, 0.0, None)]);
        if e % 3 == 0 {
            a.apply_quotas(&[tomb(e, &format!("x{}", e % 500), e)]);
        }
        clock.advance(Duration::from_millis(1));
    }
    stop.store(true, Relaxed);
    let n = reader.join().unwrap();
    let (s, _) = a.find("hot").unwrap();
    let local = a.slot(s).unwrap().get(crate::zone::slot::LOCAL);
    assert_eq!(local, n * 1000, "no increment lost");
}

#[test]
fn charge_adds_to_the_chain_without_deciding() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "bucket", 1, 1.0, 5.0, 5.0, None),
        q(2, "bytes", 2, 1.0, 5.0, 5.0, Some("bucket")),
    ]);
    assert_eq!(l.charge("bytes", 100), Ok(true));
    assert_eq!((l.quota("bytes").unwrap().fill, l.quota("bucket").unwrap().fill), (100.0, 100.0));
    assert_eq!(l.charge("bytes", 7), Ok(true), "charging never refuses, even far over");
    assert_eq!(l.check("bytes").outcome, Outcome::Rejected, "but the next request is limited");
    assert_eq!(l.charge("nope", 1), Ok(false));
    assert_eq!(l.charge("bytes", MAX_WEIGHT_UNITS + 1), Err(WeightError(MAX_WEIGHT_UNITS + 1)));
    let (s, _) = l.find("bytes").unwrap();
    assert!(l.take_dirty().contains(&s), "the charge goes out with the next sync");
}

#[test]
fn levels_give_the_chain_with_its_fills() {
    let (l, _) = setup();
    l.apply_quotas(&[
        q(1, "top", 1, 10.0, 20.0, 40.0, None),
        q(2, "leaf", 2, 5.0, 5.0, 10.0, Some("top")),
    ]);
    l.account("leaf", 3).unwrap();
    let lv = l.levels("leaf");
    assert_eq!(
        lv.iter().map(|x| (x.name.as_str(), x.fill)).collect::<Vec<_>>(),
        vec![("leaf", 3.0), ("top", 3.0)]
    );
    assert_eq!((lv[0].limit, lv[0].low_burst, lv[0].high_burst), (5.0, 5.0, 10.0));
    assert!(l.levels("nope").is_empty());
    let (p, s) = crate::ratelimit::fields(&lv, None).unwrap();
    assert_eq!(p, "\"leaf\";q=6;w=2, \"top\";q=21;w=3");
    assert_eq!(s, "\"leaf\";r=3;t=0, \"top\";r=18;t=0");
}

#[test]
fn the_quotas_that_reject_most_now_are_ranked() {
    let (l, clock) = setup();
    l.apply_quotas(&[
        q(1, "a", 1, 0.001, 0.0, 0.0, None),
        q(2, "b", 2, 0.001, 0.0, 0.0, None),
        q(3, "c", 3, 0.001, 0.0, 0.0, None),
    ]);
    for (name, n) in [("a", 3), ("b", 7), ("c", 1)] {
        l.account(name, 1).unwrap();
        for _ in 0..n {
            assert!(!l.check(name).allowed());
        }
    }
    let top = l.top_rejections(2, 60);
    assert_eq!(top, vec![("b".to_string(), 7, 7), ("a".to_string(), 3, 3)]);
    // A minute later the window is empty, the lifetime counts stay.
    clock.advance(Duration::from_secs(61));
    assert!(l.top_rejections(20, 60).is_empty());
    assert_eq!(l.quota("b").unwrap().rejections, 7);
}

/// Charges of any size from request data never wrap a count: a run of the largest charges
/// summing to just past 2^64 milli-units used to leave 0.384 units and free the quota.
#[test]
fn huge_charges_never_wrap_the_count() {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder()
        .clock(Arc::new(clock.clone()))
        .random(SeededRandom::new(1))
        .capacity(100)
        .build();
    l.apply_quotas(&[q(1, "q", 1, 1.0, 5.0, 5.0, None)]);
    for _ in 0..18_446 {
        l.charge("q", MAX_WEIGHT_UNITS).unwrap();
    }
    // 18,446 × 1e15 + 744,073,709,552,000 = 2^64 + 384 milli-units.
    l.charge("q", 744_073_709_552).unwrap();
    assert_eq!(l.account("q", 1).unwrap().outcome, Outcome::Rejected);
    assert!(l.quota("q").unwrap().fill > 1e15, "{:?}", l.quota("q"));
    // A round takes the capped count, and counting goes on from 0.
    let pending = l.take_dirty();
    let taken: Vec<u64> = l.with_counters(|c| pending.iter().map(|&s| c.take_local(s)).collect());
    assert_eq!(taken, vec![super::decide::COUNT_CAP]);
    l.charge("q", MAX_WEIGHT_UNITS).unwrap();
    assert_eq!(l.with_counters(|c| c.local(pending[0])), MAX_WEIGHT_UNITS * 1000);
}

mod keys;
mod permits;

fn shadow(u: QuotaUpdate) -> QuotaUpdate {
    QuotaUpdate { limits: u.limits.with_dry_run(true), ..u }
}

#[test]
fn a_quota_in_shadow_mode_reports_its_rejections_and_enforces_nothing() {
    let (l, _) = setup();
    // 5 units of room under a parent of 8 that enforces.
    l.apply_quotas(&[
        q(1, "all", 1, 0.001, 8.0, 8.0, None),
        shadow(q(2, "key", 2, 0.001, 5.0, 5.0, Some("all"))),
    ]);
    assert!(l.quota("key").unwrap().dry_run && !l.quota("all").unwrap().dry_run);
    // A hard cutoff at 5: passes while the fill is at most 5.
    for _ in 0..6 {
        assert_eq!(l.account("key", 1).unwrap().outcome, Outcome::Passed);
    }
    // The 7th would be rejected by `key`: it passes, named, with the retry it would get.
    let d = l.account("key", 1).unwrap();
    assert_eq!(d.outcome, Outcome::RejectedDryRun);
    assert!(d.allowed());
    assert_eq!((d.quota.as_deref(), d.fill), (Some("key"), 6.0));
    assert!(d.retry_after.is_some());
    // Counted on the enforced parent, not on the shadow quota (whose fill stays what
    // enforcing it would leave), and reported as a rejection of `key`.
    assert_eq!(l.quota("all").unwrap().fill, 7.0);
    assert_eq!(l.quota("key").unwrap().fill, 6.0);
    assert_eq!(l.quota("key").unwrap().rejections, 1);
    assert_eq!(l.top_rejections(10, 60).first().map(|r| r.0.as_str()), Some("key"));
    // A check sees the same.
    assert_eq!(l.check("key").outcome, Outcome::RejectedDryRun);
    // The enforced parent still rejects, and wins over the shadow verdict.
    assert_eq!(l.account("key", 2).unwrap().outcome, Outcome::RejectedDryRun);
    let d = l.account("key", 1).unwrap();
    assert_eq!((d.outcome, d.quota.as_deref()), (Outcome::Rejected, Some("all")));
    assert_eq!(l.quota("all").unwrap().fill, 9.0, "nothing added on a real rejection");
    // Four decisions rejected or would have: the host counts each once, the last one (by
    // `key` in shadow mode, then by `all`) included; each quota counts its own.
    assert_eq!(l.rejections(), 4);
    assert_eq!((l.quota("key").unwrap().rejections, l.quota("all").unwrap().rejections), (4, 1));
    // Flipped to enforcing by a quota change: the same request is rejected by `key`.
    l.apply_quotas(&[q(2, "key", 3, 0.001, 5.0, 5.0, Some("all"))]);
    assert!(!l.quota("key").unwrap().dry_run);
    assert_eq!(l.check("key").outcome, Outcome::Rejected);
}

#[test]
fn shadow_rejections_count_as_demand_and_account_many_reports_them() {
    let (l, _) = setup();
    l.apply_quotas(&[
        shadow(q(1, "s", 1, 0.001, 0.0, 0.0, None)),
        q(2, "e", 2, 0.001, 100.0, 100.0, None),
    ]);
    // A hard cutoff at 0: the first unit passes, the rest would not.
    assert_eq!(l.account("s", 1).unwrap().outcome, Outcome::Passed);
    let d = l.account_many(&[("e", 2), ("s", 3)]).unwrap();
    assert_eq!((d.outcome, d.quota.as_deref()), (Outcome::RejectedDryRun, Some("s")));
    assert_eq!(l.quota("e").unwrap().fill, 2.0, "the enforced quota counts the request");
    let dirty = l.take_dirty();
    l.with_counters(|c| {
        let mut got: Vec<_> =
            dirty.iter().map(|&s| (c.id_of(s).unwrap(), c.local(s), c.take_rejected(s))).collect();
        got.sort();
        // What enforcing `s` would have sent the roots: refused demand, no count.
        assert_eq!(got, vec![(1, 1000, 3000), (2, 2000, 0)]);
    });
    // An enforced rejection elsewhere still rejects the whole request.
    l.apply_quotas(&[q(3, "x", 3, 0.001, 0.0, 0.0, None)]);
    l.account("x", 1).unwrap();
    let d = l.account_many(&[("s", 1), ("x", 1)]).unwrap();
    assert_eq!((d.outcome, d.quota.as_deref()), (Outcome::Rejected, Some("x")));
}

#[test]
fn keys_follow_their_templates_shadow_mode() {
    let l = Limiter::builder()
        .clock(Arc::new(ManualClock::at(10 * S)))
        .random(SeededRandom::new(42))
        .keys(64)
        .build();
    l.apply_quotas(&[shadow(q(1, "k_*", 1, 0.001, 1.0, 1.0, None))]);
    for _ in 0..2 {
        assert_eq!(l.account("k_a", 1).unwrap().outcome, Outcome::Passed);
    }
    let d = l.account("k_a", 1).unwrap();
    assert_eq!((d.outcome, d.quota.as_deref()), (Outcome::RejectedDryRun, Some("k_a")));
    l.apply_quotas(&[q(1, "k_*", 2, 0.001, 1.0, 1.0, None)]);
    assert_eq!(l.account("k_a", 1).unwrap().outcome, Outcome::Rejected, "enforced again");
}

#[test]
fn an_hourly_quota_admits_its_window_and_says_so() {
    let (l, clock) = setup();
    let spec = crate::QuotaSpec {
        limit: Some(20.0),
        per: Some("1h".into()),
        low_burst: None,
        high_burst: None,
        parent: None,
        dry_run: false,
        max_in_flight: None,
    };
    let limits = spec.validate("hourly").unwrap();
    assert_eq!(
        (limits.low_burst(), limits.high_burst(), limits.window_secs()),
        (19_000, 20_000, 3_600)
    );
    l.apply_quotas(&[QuotaUpdate { limits, ..q(1, "hourly", 1, 1.0, 0.0, 0.0, None) }]);
    let lv = l.levels("hourly");
    assert_eq!((lv[0].quota(), lv[0].window(), lv[0].remaining()), (20, 3_600, 20));
    for i in 0..20 {
        assert_eq!(l.account("hourly", 1).unwrap().outcome, Outcome::Passed, "request {i}");
    }
    let d = l.account("hourly", 1).unwrap();
    assert_eq!(d.outcome, Outcome::Rejected);
    // One unit over low_burst drains in 3,600 / 20 = 180 s.
    assert_eq!(d.retry_after, Some(180));
    let (p, s) = crate::ratelimit::fields(&l.levels("hourly"), Some((0, 180))).unwrap();
    assert_eq!((p.as_str(), s.as_str()), ("\"hourly\";q=20;w=3600", "\"hourly\";r=0;t=180"));
    let info = l.quota("hourly").unwrap();
    assert_eq!((info.limit, info.window), (20.0, 3_600));
    // Three minutes later one more passes, and only one.
    clock.advance(Duration::from_secs(180));
    assert_eq!(l.account("hourly", 1).unwrap().outcome, Outcome::Passed);
    assert_eq!(l.account("hourly", 1).unwrap().outcome, Outcome::Rejected);
}

#[test]
fn an_edit_of_the_rate_counts_from_the_edit_on() {
    // 1,000 a day used up, idle 23 hours, then halved: 958 drained at the old rate, 42
    // left, far under the new bursts. Drained at the new rate from the last report
    // instead, 521 were left: above `high_burst` (500), refused for most of another day.
    let (l, clock) = setup();
    let day = |epoch, limit: f64| QuotaUpdate {
        limits: Limits::from_units_per(limit, 86_400, limit - 1.0, limit).unwrap(),
        ..q(1, "d", epoch, 1.0, 0.0, 0.0, None)
    };
    l.apply_quotas(&[day(1, 1_000.0)]);
    set_fill(&l, "d", 1_000.0, clock.now_nanos());
    clock.advance(Duration::from_secs(23 * 3_600));
    l.apply_quotas(&[day(2, 500.0)]);
    let fill = l.with_counters(|c| c.synced(c.slot_of(1).unwrap(), clock.now_nanos()));
    assert!((41_600..=41_700).contains(&fill), "{fill} milli-units");
    assert_eq!(l.account("d", 1).unwrap().outcome, Outcome::Passed);
    // The numbers alone (the same rate) leave the view as it was.
    let before = l.with_counters(|c| c.base(c.slot_of(1).unwrap()));
    l.apply_quotas(&[QuotaUpdate {
        limits: Limits::from_units_per(500.0, 86_400, 100.0, 500.0).unwrap(),
        ..day(3, 500.0)
    }]);
    assert_eq!(l.with_counters(|c| c.base(c.slot_of(1).unwrap())), before);
}
