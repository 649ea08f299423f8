use super::*;
use proptest::prelude::*;

const MS: u64 = 1_000_000;
const LEASE: u64 = 1_500 * MS;

/// A report whose demand is what runs plus what was refused, in whole slots.
fn report(seq: u64, held: u32, in_flight: u32, refused: u32) -> Report {
    let demand = (in_flight + refused) * 1000;
    Report { seq, held, held_total: held, in_flight, demand, refused }
}

#[test]
fn replica_parts_sum_to_the_capacity() {
    for c in [0u32, 1, 7, 50, 1_000_000] {
        for n in 1..6 {
            assert_eq!((0..n).map(|i| replica_part(c, i, n)).sum::<u32>(), c, "C {c} n {n}");
        }
    }
}

#[test]
fn a_lone_limiter_gets_the_whole_part_and_spare_is_spread_over_every_holder() {
    let mut e = Escrow::new(10, 10, LEASE, 100);
    assert_eq!(e.report(1, 0, &report(1, 0, 0, 0)).share, 10);
    // A second limiter with no demand: nothing is free until the first hands some back.
    assert_eq!(e.report(2, MS, &report(1, 0, 0, 0)).share, 0);
    // The first, idle, is brought down to its even part of the spare...
    assert_eq!(e.report(1, 2 * MS, &report(2, 10, 0, 0)).share, 5);
    // ...which the root counts as free only once the first says it holds 5.
    assert_eq!(e.report(2, 3 * MS, &report(2, 0, 0, 0)).share, 0);
    assert_eq!(e.report(1, 4 * MS, &report(3, 5, 0, 0)).share, 5);
    assert_eq!(e.report(2, 5 * MS, &report(3, 0, 0, 0)).share, 5);
    assert_eq!(e.stats(5 * MS).reserved, 10);
}

#[test]
fn shares_follow_demand_and_never_sum_past_the_part() {
    let mut e = Escrow::new(50, 50, LEASE, 100);
    let mut held = [0u32; 2];
    for round in 1..12u64 {
        for (i, h) in held.iter_mut().enumerate() {
            // Limiter 0 refuses 30 a round, limiter 1 10: shares move to 3:1.
            let refused = if i == 0 { 30 } else { 10 };
            let g = e.report(i as u64, round * 100 * MS, &report(round, *h, *h, refused));
            *h = g.share;
        }
        assert!(e.stats(round * 100 * MS).reserved <= 50);
    }
    // A share that shrank is free once its holder says so: a round can end in between.
    assert!(held.iter().sum::<u32>() >= 45, "{held:?}");
    assert!(held[0] > 2 * held[1], "{held:?}");
}

#[test]
fn a_lost_answer_or_a_replayed_report_frees_nothing() {
    let mut e = Escrow::new(10, 10, LEASE, 100);
    assert_eq!(e.report(1, 0, &report(1, 0, 10, 5)).share, 10);
    // Limiter 2 wants a lot; the root shrinks 1's grant, but the answer is lost.
    assert_eq!(e.report(2, MS, &report(1, 0, 0, 40)).share, 0);
    let shrunk = e.report(1, 2 * MS, &report(2, 10, 10, 0)).share;
    assert!(shrunk < 10);
    // 1 still says it holds 10 (it never got the smaller grant): nothing is free.
    assert_eq!(e.report(1, 3 * MS, &report(3, 10, 10, 0)).share, shrunk);
    assert_eq!(e.report(2, 4 * MS, &report(2, 0, 0, 40)).share, 0);
    // A replay of 1's old report, claiming it holds nothing, changes nothing either.
    assert_eq!(e.report(1, 5 * MS, &report(2, 0, 0, 0)).share, shrunk);
    assert_eq!(e.report(2, 6 * MS, &report(3, 0, 0, 40)).share, 0);
    // Once 1 says it holds the smaller share, 2 gets the rest.
    e.report(1, 7 * MS, &report(4, shrunk, shrunk, 0));
    assert_eq!(e.report(2, 8 * MS, &report(4, 0, 0, 40)).share, 10 - shrunk);
}

#[test]
fn requests_still_running_above_a_shrunk_share_stay_counted() {
    let mut e = Escrow::new(10, 10, LEASE, 100);
    e.report(1, 0, &report(1, 0, 10, 5));
    e.report(2, MS, &report(1, 0, 0, 45));
    let shrunk = e.report(1, 2 * MS, &report(2, 10, 10, 0)).share;
    // 1 applied the smaller share but still runs 10.
    let r =
        Report { seq: 3, held: shrunk, held_total: shrunk, in_flight: 10, demand: 0, refused: 0 };
    e.report(1, 3 * MS, &r);
    assert_eq!(e.report(2, 4 * MS, &report(2, 0, 0, 45)).share, 0);
    // They end.
    e.report(1, 5 * MS, &report(4, shrunk, 0, 0));
    assert_eq!(e.report(2, 6 * MS, &report(3, 0, 0, 45)).share, 10 - shrunk);
}

#[test]
fn a_silent_limiter_loses_its_share_when_its_lease_ends_and_not_before() {
    let mut e = Escrow::new(10, 10, LEASE, 100);
    assert_eq!(e.report(1, 0, &report(1, 0, 10, 9)).share, 10);
    assert_eq!(e.report(2, LEASE - 1, &report(1, 0, 0, 9)).share, 0);
    assert_eq!(e.report(2, LEASE, &report(2, 0, 0, 9)).share, 10);
    assert_eq!(e.stats(LEASE).holders, 1);
}

#[test]
fn claims_above_what_was_granted_are_not_believed_and_holders_are_bounded() {
    let mut e = Escrow::new(10, 10, LEASE, 2);
    e.report(1, 0, &report(1, 0, 0, 1));
    // 1 claims to hold 1,000 and run 1,000 on one share: it holds at most what it got, and
    // its excess is capped at the part.
    let g = e.report(1, MS, &report(2, 1000, 0, 1));
    assert!(g.share <= 10);
    assert!(e.stats(MS).reserved <= 10);
    e.report(2, 2 * MS, &report(1, 0, 0, 1));
    assert_eq!(e.report(3, 3 * MS, &report(1, 0, 0, 1)).share, 0, "a third holder gets nothing");
    assert_eq!(e.stats(3 * MS).holders, 2);
}

#[test]
fn permits_admit_under_the_share_until_its_lease_ends() {
    let words = PermitWords::default();
    let p = words.view();
    assert!(!p.acquire(0), "nothing granted yet");
    p.publish(2, 100 * MS);
    assert!(p.acquire(MS) && p.acquire(MS));
    assert!(!p.acquire(MS));
    p.release();
    assert!(p.acquire(2 * MS));
    assert_eq!(p.take_round(), (3, 2));
    assert_eq!(p.take_round(), (0, 0));
    p.release_many(5);
    assert_eq!(p.in_flight(), 0);
    p.release();
    assert_eq!(p.in_flight(), 0, "a stray release opens nothing");
    assert!(p.acquire(99 * MS));
    assert!(!p.acquire(100 * MS), "the lease has ended");
    assert_eq!(p.share(100 * MS), 0);
}

#[test]
fn a_host_stops_using_a_share_before_its_root_frees_it() {
    let mut book = HostShares::new(2, 0);
    book.apply(0, Grant { share: 3, lease_ns: LEASE }, 10 * MS, 10 * MS, 0);
    book.apply(1, Grant { share: 4, lease_ns: 2 * LEASE }, 20 * MS, 20 * MS, 0);
    let end0 = 10 * MS + LEASE - lease_margin(LEASE);
    assert_eq!(book.total(end0 - 1), (7, end0 - 1 + 1));
    assert_eq!(book.held(0, end0), 0);
    assert_eq!(book.total(end0).0, 4);
    let words = PermitWords::default();
    let p = words.view();
    book.poll(MS * 11, p, LEASE);
    assert_eq!(p.share(end0 - MS), 7);
    assert_eq!(p.share(end0), 0, "published until the first share ends");
}

#[test]
fn a_new_book_leaves_the_shares_in_force_until_its_first_grant() {
    let words = PermitWords::default();
    let p = words.view();
    // Published by an agent that died.
    p.publish(5, 900 * MS);
    let mut book = HostShares::new(2, 100 * MS);
    book.poll(110 * MS, p, u64::MAX);
    assert_eq!(p.share(120 * MS), 5, "the predecessor's shares hold");
    // Its first report claims them whole, so no root frees them while they are used.
    let r = book.report(1, 110 * MS, 1, p, 0, 0);
    assert_eq!((r.held, r.held_total), (5, 5));
    book.apply(0, Grant { share: 2, lease_ns: LEASE }, 110 * MS, 112 * MS, 0);
    let r = book.report(1, 112 * MS, 2, p, 0, 0);
    assert_eq!((r.held, r.held_total), (0, 2), "then what the roots granted");
    book.poll(113 * MS, p, u64::MAX);
    assert_eq!(p.share(120 * MS), 2, "then this agent's");
    assert_eq!(p.share(900 * MS), 2, "until its own lease ends");
}

#[test]
fn a_report_soon_after_a_round_repeats_its_demand_and_the_next_round_counts_all() {
    let mut book = HostShares::new(1, 0);
    let words = PermitWords::default();
    let p = words.view();
    book.apply(0, Grant { share: 1, lease_ns: 10_000 * MS }, 0, 0, 0);
    book.poll(0, p, u64::MAX);
    // One slot held all round, 10 refusals: 1 + 10 x (hold = the round) slots.
    assert!(p.acquire(0));
    for _ in 0..10 {
        assert!(!p.acquire(MS));
    }
    let first = book.round_at_least(500 * MS, p, 500 * MS);
    assert_eq!(first.1, 10);
    // 20 ms later (an acknowledgement): the same demand, however the 20 ms looked.
    for _ in 0..30 {
        assert!(!p.acquire(510 * MS));
    }
    assert_eq!(book.round_at_least(520 * MS, p, 500 * MS), first);
    // Half a round on: measured again, the 30 refusals since included.
    let next = book.round_at_least(1_000 * MS, p, 500 * MS);
    assert_eq!(next.1, 30);
    assert_ne!(next, first);
}

/// A cluster of hosts and root replicas under random requests, rounds, lost messages and
/// replays. Requests last at most the lease margin, so none outlives the lease it was
/// admitted under and the cluster must never run more than `C` at once.
#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Acquire { host: usize, ms: u64 },
    Round { host: usize, root: usize, lose_report: bool, lose_answer: bool },
    Replay { host: usize, root: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..400).prop_map(|ms| Op::Advance(ms * MS)),
        (0usize..4, 1u64..50).prop_map(|(host, ms)| Op::Acquire { host, ms }),
        (0usize..4, 0usize..3, any::<bool>(), any::<bool>()).prop_map(|(host, root, a, b)| {
            Op::Round { host, root, lose_report: a && b, lose_answer: a && !b }
        }),
        (0usize..4, 0usize..3).prop_map(|(host, root)| Op::Replay { host, root }),
    ]
}

struct Host {
    permits: PermitWords,
    book: HostShares,
    seq: Vec<u64>,
    last: Vec<Option<Report>>,
    ends: Vec<u64>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn the_cluster_never_runs_more_than_c(
        c in 1u32..20, replicas in 1u32..4, hosts in 1usize..5,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let mut roots: Vec<Escrow> =
            (0..replicas).map(|i| Escrow::new(c, replica_part(c, i, replicas), LEASE, 16)).collect();
        let mut hs: Vec<Host> = (0..hosts)
            .map(|_| Host {
                permits: PermitWords::default(),
                book: HostShares::new(replicas as usize, 0),
                seq: vec![0; replicas as usize],
                last: vec![None; replicas as usize],
                ends: Vec::new(),
            })
            .collect();
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Advance(d) => now += d,
                Op::Acquire { host, ms } => {
                    let h = &mut hs[host % hosts];
                    if h.permits.view().acquire(now) {
                        h.ends.push(now + ms * MS);
                    }
                }
                Op::Round { host, root, lose_report, lose_answer } => {
                    let (hid, root) = (host % hosts, root % replicas as usize);
                    let h = &mut hs[hid];
                    h.seq[root] += 1;
                    let (demand, refused) = h.book.round(now, h.permits.view());
                    let r = h.book.report(root, now, h.seq[root], h.permits.view(), demand, refused);
                    h.last[root] = Some(r);
                    if !lose_report {
                        let g = roots[root].report(hid as u64, now, &r);
                        if !lose_answer {
                            let in_flight = h.permits.view().in_flight();
                            h.book.apply(root, g, now, now, in_flight);
                        }
                    }
                    h.book.poll(now, h.permits.view(), LEASE);
                }
                Op::Replay { host, root } => {
                    let (hid, root) = (host % hosts, root % replicas as usize);
                    if let Some(r) = hs[hid].last[root] {
                        roots[root].report(hid as u64, now, &r);
                    }
                }
            }
            for h in &mut hs {
                h.ends.retain(|&end| {
                    if end <= now {
                        h.permits.view().release();
                        false
                    } else {
                        true
                    }
                });
            }
            let running: u32 = hs.iter().map(|h| h.permits.view().in_flight()).sum();
            prop_assert!(running <= c, "{running} in flight, C {c}");
        }
    }
}
