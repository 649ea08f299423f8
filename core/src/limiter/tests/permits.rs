//! The permit table and acquire/release on the request path.

use super::*;
use crate::limiter::{Acquired, ConcurrencyInfo, Permit, SlotLevel};

fn capped(id: u64, name: &str, epoch: u64, cap: u32, parent: Option<&str>) -> QuotaUpdate {
    QuotaUpdate {
        limits: Limits::in_flight_only(cap).unwrap(),
        ..q(id, name, epoch, 1.0, 0.0, 0.0, parent)
    }
}

fn admitted(a: Acquired) -> Permit {
    match a {
        Acquired::Admitted(p) => p,
        Acquired::Refused(id) => panic!("refused at {id}"),
    }
}

#[test]
fn acquire_up_to_the_share_and_release_gives_back() {
    let (l, clock) = setup();
    l.apply_quotas(&[capped(1, "db", 1, 50, None), q(2, "plain", 2, 1.0, 1.0, 1.0, None)]);
    // No share yet: the roots have granted nothing.
    assert_eq!(l.acquire("db"), Acquired::Refused(1));
    let now = clock.now_nanos();
    l.permits(1).unwrap().publish(2, now + 3 * S);
    let a = admitted(l.acquire("db"));
    let b = admitted(l.acquire("db"));
    assert!(!a.is_empty() && !b.is_empty());
    assert_eq!(l.acquire("db"), Acquired::Refused(1), "two of two in flight");
    assert_eq!(l.permits(1).unwrap().in_flight(), 2);
    l.release(&a);
    let c = admitted(l.acquire("db"));
    assert_eq!(l.permits(1).unwrap().take_round(), (3, 2));
    l.release(&b);
    l.release(&c);
    assert_eq!(l.permits(1).unwrap().in_flight(), 0);
    // Names without a cap, or without a quota, pass with nothing to give back.
    assert!(admitted(l.acquire("plain")).is_empty());
    assert!(admitted(l.acquire("nobody")).is_empty());
    assert!(l.permits(2).is_none());
    // The lease ends: nothing more until the next grant.
    clock.advance(Duration::from_secs(3));
    assert_eq!(l.acquire("db"), Acquired::Refused(1));
}

/// `leaf` (cap 5) under `mid` (no cap) under `svc` (cap 10), with shares of `svc` and
/// `leaf` on this host.
fn chain(svc_share: u32, leaf_share: u32) -> Limiter {
    let (l, clock) = setup();
    l.apply_quotas(&[
        capped(1, "svc", 1, 10, None),
        q(2, "mid", 2, 1.0, 1.0, 1.0, Some("svc")),
        capped(3, "leaf", 3, 5, Some("mid")),
    ]);
    let until = clock.now_nanos() + 3 * S;
    l.permits(1).unwrap().publish(svc_share, until);
    l.permits(3).unwrap().publish(leaf_share, until);
    l
}

#[test]
fn a_chain_takes_a_slot_at_every_capped_level_or_none() {
    let l = chain(1, 5);
    let p = admitted(l.acquire("leaf"));
    assert_eq!((l.permits(1).unwrap().in_flight(), l.permits(3).unwrap().in_flight()), (1, 1));
    // The parent is full: the leaf's slot is given back.
    assert_eq!(l.acquire("leaf"), Acquired::Refused(1));
    assert_eq!(l.permits(3).unwrap().in_flight(), 1, "all or nothing");
    l.release(&p);
    assert_eq!((l.permits(1).unwrap().in_flight(), l.permits(3).unwrap().in_flight()), (0, 0));
}

#[test]
fn entries_follow_the_quotas_and_a_stale_permit_releases_nothing() {
    let (l, clock) = setup();
    l.apply_quotas(&[capped(1, "db", 1, 5, None)]);
    let until = clock.now_nanos() + 3 * S;
    l.permits(1).unwrap().publish(5, until);
    let p = admitted(l.acquire("db"));
    assert_eq!(l.permit_entries().len(), 1);
    // The cap removed: the entry goes, and the name passes.
    l.apply_quotas(&[q(1, "db", 2, 1.0, 1.0, 1.0, None)]);
    assert!(l.permits(1).is_none() && l.permit_entries().is_empty());
    assert!(admitted(l.acquire("db")).is_empty());
    // Another counter takes entries; the old permit's release touches none of them.
    l.apply_quotas(&[capped(9, "other", 3, 5, None), capped(1, "db", 4, 5, None)]);
    l.permits(9).unwrap().publish(5, until);
    let o = admitted(l.acquire("other"));
    l.release(&p);
    assert_eq!(l.permits(9).unwrap().in_flight(), 1);
    assert_eq!(l.permits(1).unwrap().in_flight(), 0, "a fresh entry starts empty");
    l.release(&o);
    // Deleted with the quota.
    l.apply_quotas(&[tomb(9, "other", 5)]);
    assert!(l.permits(9).is_none());
}

#[test]
fn a_full_table_leaves_further_caps_unenforced_and_counted() {
    let (l, _) = setup();
    let cap = l.layout.permit_cap as u64;
    let quotas: Vec<QuotaUpdate> =
        (1..=cap + 3).map(|i| capped(i, &format!("c{i}"), i, 2, None)).collect();
    l.apply_quotas(&quotas);
    assert_eq!(l.permit_entries().len() as u64, cap);
    assert_eq!(l.hdr(hdr::PERMITS_REFUSED).load(Relaxed), 3);
    // Every capped quota found where it is: probing passes deleted entries.
    l.apply_quotas(&[tomb(1, "c1", cap + 10)]);
    for i in 2..=cap {
        assert!(l.permits(i).is_some(), "{i}");
    }
}

/// Three processes over one block: `a` and `b` hold slots, `b` dies without releasing.
#[test]
fn a_dead_processs_slots_come_back_through_the_ledger_and_no_one_elses() {
    let clock = ManualClock::at(1_000 * S);
    let (a, b) = shared_pair(&clock, 256);
    a.apply_quotas(&[capped(1, "db", 1, 10, None)]);
    a.permits(1).unwrap().publish(10, clock.now_nanos() + 3 * S);
    assert!(a.join_ledger(100, |_| true) && b.join_ledger(200, |_| true));
    let held_a: Vec<Permit> = (0..3).map(|_| admitted(a.acquire("db"))).collect();
    let held_b: Vec<Permit> = (0..4).map(|_| admitted(b.acquire("db"))).collect();
    l_in_flight(&a, 7);
    // `b` releases one, then dies with three.
    b.release(&held_b[0]);
    let dead = |p: u32| p != 200;
    // Nobody reaps while it lives.
    assert_eq!(a.reap_ledger(100, |_| true), 0);
    l_in_flight(&a, 6);
    assert_eq!(a.reap_ledger(100, dead), 3);
    l_in_flight(&a, 3);
    assert_eq!(a.reap_ledger(100, dead), 0, "a row is given back once");
    assert_eq!(a.ledger_figures(), (0, 3));
    // The survivor's own slots are still counted and still released normally.
    for p in &held_a {
        a.release(p);
    }
    l_in_flight(&a, 0);
    // Its row is free again: a new process takes it and is reaped in turn.
    let c = Limiter::builder().clock(Arc::new(clock.clone())).open(a.block.clone()).unwrap();
    assert!(c.join_ledger(300, |_| true));
    let _held_c = admitted(c.acquire("db"));
    a.leave_ledger();
    assert_eq!(b.reap_ledger(400, |p| p != 300), 1);
    l_in_flight(&a, 0);
}

fn l_in_flight(l: &Limiter, n: u32) {
    assert_eq!(l.permits(1).unwrap().in_flight(), n);
}

#[test]
fn a_process_leaving_gives_back_what_it_still_holds_and_its_row() {
    let clock = ManualClock::at(1_000 * S);
    let (a, b) = shared_pair(&clock, 256);
    a.apply_quotas(&[capped(1, "db", 1, 5, None)]);
    a.permits(1).unwrap().publish(5, clock.now_nanos() + 3 * S);
    assert!(a.join_ledger(1, |_| true));
    let _p = admitted(a.acquire("db"));
    a.leave_ledger();
    l_in_flight(&a, 0);
    // Every row taken by a live process: one more joins without a ledger, counted.
    let others: Vec<Limiter> = (0..crate::zone::LEDGER_ROWS)
        .map(|_| Limiter::builder().clock(Arc::new(clock.clone())).open(a.block.clone()).unwrap())
        .collect();
    for (i, o) in others.iter().enumerate() {
        assert!(o.join_ledger(10 + i as u32, |_| true), "row {i}");
    }
    assert!(!b.join_ledger(2, |_| true));
    assert_eq!(b.ledger_figures().0, 1);
    // A process that finds a row under its own pid (a dead one's, pid reused) reaps it.
    let held = admitted(others[5].acquire("db"));
    assert!(!held.is_empty());
    let again = Limiter::builder().clock(Arc::new(clock.clone())).open(a.block.clone()).unwrap();
    assert!(again.join_ledger(15, |_| true));
    l_in_flight(&a, 0);
}

/// A counter made after a deleted one starts from zero in the ledger too: reaping the old
/// holder gives back none of the new counter's slots.
#[test]
fn a_reused_entry_does_not_inherit_ledger_counts() {
    let clock = ManualClock::at(1_000 * S);
    let (a, b) = shared_pair(&clock, 256);
    a.apply_quotas(&[capped(1, "db", 1, 5, None)]);
    let until = clock.now_nanos() + 3 * S;
    a.permits(1).unwrap().publish(5, until);
    assert!(b.join_ledger(7, |_| true));
    let _old = admitted(b.acquire("db"));
    a.apply_quotas(&[tomb(1, "db", 2), capped(2, "db2", 3, 5, None)]);
    a.permits(2).unwrap().publish(5, until);
    let _new = admitted(a.acquire("db2"));
    // Reaping gives `db`'s slot back to `db`'s deleted entry if it is still there (it
    // keeps counting in case the cap comes back), never to `db2`.
    assert!(a.reap_ledger(1, |p| p != 7) <= 1);
    assert_eq!(a.permits(2).unwrap().in_flight(), 1);
}

#[test]
fn the_status_names_each_capped_quota_with_its_figures() {
    let (l, clock) = setup();
    l.apply_quotas(&[capped(1, "db", 1, 5, None), q(2, "plain", 2, 1.0, 1.0, 1.0, None)]);
    l.permits(1).unwrap().publish(1, clock.now_nanos() + 3 * S);
    let p = admitted(l.acquire("db"));
    assert_eq!(l.acquire("db"), Acquired::Refused(1));
    assert_eq!(l.acquire("db"), Acquired::Refused(1));
    let s = l.concurrency_status();
    assert_eq!(
        s.quotas,
        vec![ConcurrencyInfo { name: "db".into(), id: 1, in_flight: 1, share: 1, refused: 2 }]
    );
    // The refusals stay counted across rounds (the round word is the agent's).
    l.permits(1).unwrap().take_round();
    l.release(&p);
    let s = l.concurrency_status();
    assert_eq!((s.quotas[0].in_flight, s.quotas[0].refused), (0, 2));
    assert_eq!((s.entries_refused, s.ledger_full, s.reaped), (0, 0, 0));
}

#[test]
fn levels_give_each_capped_level_its_cap_and_what_is_left() {
    let l = chain(4, 1);
    let p = admitted(l.acquire("leaf"));
    let level = |name: &str, cap, remaining| SlotLevel { name: name.into(), cap, remaining };
    assert_eq!(l.permit_levels(&p), vec![level("leaf", 5, 0), level("svc", 10, 3)]);
    assert_eq!(l.slot_level(3), Some(level("leaf", 5, 0)));
    assert_eq!(l.slot_level(2), None, "no cap");
}

/// A cap removed and put back while requests admitted under it run: they stay counted
/// (in the entry and in the ledger), and their releases give their slots back.
#[test]
fn a_cap_put_back_keeps_counting_the_requests_admitted_before() {
    let clock = ManualClock::at(1_000 * S);
    let (a, b) = shared_pair(&clock, 256);
    a.apply_quotas(&[capped(1, "db", 1, 5, None)]);
    let until = clock.now_nanos() + 3 * S;
    a.permits(1).unwrap().publish(2, until);
    assert!(b.join_ledger(7, |_| true));
    let first = admitted(b.acquire("db"));
    let second = admitted(b.acquire("db"));
    a.apply_quotas(&[q(1, "db", 2, 1.0, 1.0, 1.0, None)]);
    // One ends while the cap is away.
    b.release(&first);
    a.apply_quotas(&[capped(1, "db", 3, 5, None)]);
    a.permits(1).unwrap().publish(2, until);
    assert_eq!(a.permits(1).unwrap().in_flight(), 1, "the one still running counts");
    let third = admitted(b.acquire("db"));
    assert_eq!(b.acquire("db"), Acquired::Refused(1), "two of a share of two");
    // b dies holding both: both come back, no more.
    assert_eq!(a.reap_ledger(1, |p| p != 7), 2);
    assert_eq!(a.permits(1).unwrap().in_flight(), 0);
    let _ = (second, third);
}
