//! Names under templates: each key its own bucket, overrides, the longest prefix, any bytes,
//! parents, template changes, a full table, concurrent first sights.

use super::*;
use crate::clock::Clock;
use crate::zone::hdr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn passes(l: &Limiter, name: &[u8], n: usize) -> usize {
    (0..n).filter(|_| l.account(name, 1).unwrap().outcome == Outcome::Passed).count()
}

/// What a sync round with no root does to the counts: takes them and anchors them here.
fn round_alone(l: &Limiter, clock: &ManualClock) {
    let pending = l.take_dirty();
    l.with_counters(|c| {
        for s in pending {
            let v = c.take_local(s);
            c.anchor(s, v, clock.now_nanos());
            c.sub_inflight(s, v);
        }
    });
}

fn keyed(keys: u32) -> (Limiter, ManualClock) {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder()
        .clock(Arc::new(clock.clone()))
        .random(SeededRandom::new(42))
        .capacity(1000)
        .keys(keys)
        .build();
    (l, clock)
}

/// What a round does with the dirty slots, without roots: the writer learns the new keys'
/// ids, and every count is taken and anchored as if reported. Returns the keys learned.
fn learn_dirty(l: &Limiter, now: u64) -> Vec<(u32, u64)> {
    let pending = l.take_dirty();
    let keys: Vec<(u32, u64)> = pending
        .iter()
        .filter(|&&s| l.is_key_slot(s))
        .map(|&s| (s, l.slot(s).unwrap().id()))
        .collect();
    l.learn_keys(&keys);
    l.with_counters(|c| {
        for s in pending {
            let v = c.take_local(s);
            c.anchor(s, v, now);
            c.sub_inflight(s, v);
        }
    });
    keys
}

/// The name hash of `name` and the free place its insert would claim at `now_ms`, with
/// the word that place holds.
fn free_place(l: &Limiter, name: &[u8], now_ms: u64) -> ((u64, u64), u32, u64) {
    let h = crate::zone::keys::name_hash(l.key_secret(), name);
    let crate::zone::keys::Probe::Absent(Some((pos, old))) = l.key_table().probe(h, now_ms) else {
        panic!("no free place for {name:?}")
    };
    (h, pos, old)
}

#[test]
fn every_key_gets_a_bucket_of_its_own() {
    let (l, _) = keyed(1000);
    assert_eq!(l.check("api_key_a").outcome, Outcome::Unlimited, "no template yet");
    // 1/s with a hard cutoff at 2: three requests pass from an empty bucket.
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    for k in ["api_key_a", "api_key_b", "api_key_c"] {
        assert_eq!(passes(&l, k.as_bytes(), 10), 3, "{k}");
    }
    let u = l.zone_status().usage;
    assert_eq!((u.templates, u.keys, u.keys_inserted), (1, 3, 3));
    // A name the template does not cover passes unlimited.
    assert_eq!(l.account("api_other", 1).unwrap().outcome, Outcome::Unlimited);
    // The key's state reads like a quota's, with its template.
    let info = l.quota("api_key_a").unwrap();
    assert_eq!(info.template.as_deref(), Some("api_key_*"));
    assert_eq!(info.fill, 3.0);
    assert!(crate::zone::keys::is_key_id(info.id));
    // The rejection names the key, not the template.
    let d = l.account("api_key_a", 1).unwrap();
    assert_eq!(d.quota.as_deref(), Some("api_key_a"));
}

#[test]
fn an_override_wins_and_deleting_it_falls_back() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    assert_eq!(passes(&l, b"api_key_vip", 10), 3);
    l.apply_quotas(&[q(2, "api_key_vip", 2, 1.0, 20.0, 20.0, None)]);
    assert_eq!(passes(&l, b"api_key_vip", 30), 21, "its own quota, from 0");
    l.apply_quotas(&[tomb(2, "api_key_vip", 3)]);
    assert_eq!(passes(&l, b"api_key_vip", 10), 0, "back on its key, still full");
}

/// The writer's counts behind the override filter, summed; each bit of the filter is
/// checked to be set exactly where a count is.
fn filter_total(l: &Limiter) -> u64 {
    let w = l.writer();
    let mut total = 0;
    for b in 0..crate::zone::OVERRIDE_BITS {
        let c = w.overrides.get(b).copied().unwrap_or(0);
        let set = l.hdr(hdr::OVERRIDES + b / 64).load(Relaxed) >> (b % 64) & 1 != 0;
        assert_eq!(set, c > 0, "bit {b} against its count {c}");
        total += u64::from(c);
    }
    total
}

#[test]
fn overrides_win_whichever_came_first_and_however_many() {
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder().clock(Arc::new(clock.clone())).capacity(2000).keys(1000).build();
    // An override made before its template is counted when the template comes.
    l.apply_quotas(&[q(1, "api_key_early", 1, 1.0, 20.0, 20.0, None)]);
    assert_eq!(filter_total(&l), 0, "no template covers it yet");
    l.apply_quotas(&[q(2, "api_key_*", 2, 1.0, 2.0, 2.0, None)]);
    assert_eq!(filter_total(&l), 2, "the override and the template's own name");
    assert_eq!(passes(&l, b"api_key_early", 30), 21);
    assert_eq!(passes(&l, b"api_key_other", 10), 3);
    // Many overrides, in one batch with a quota no template covers: each wins over its key,
    // the rest stay keys.
    let mut many: Vec<_> =
        (0..1200).map(|i| q(10 + i, &format!("api_key_o{i}"), 3, 1.0, 9.0, 9.0, None)).collect();
    many.push(q(5000, "plain_quota", 3, 1.0, 4.0, 4.0, None));
    l.apply_quotas(&many);
    assert_eq!(filter_total(&l), 1202);
    for i in (0..1200).step_by(97) {
        assert_eq!(passes(&l, format!("api_key_o{i}").as_bytes(), 20), 10, "override {i}");
    }
    assert_eq!(passes(&l, b"plain_quota", 10), 5);
    assert_eq!(passes(&l, b"api_key_nobody", 10), 3);
    // Renamed out of the template's reach, then deleted: the names fall back to keys.
    l.apply_quotas(&[q(10, "elsewhere", 4, 1.0, 9.0, 9.0, None)]);
    assert_eq!(passes(&l, b"api_key_o0", 10), 3, "a fresh key");
    assert_eq!(passes(&l, b"elsewhere", 20), 0, "the renamed quota keeps its full bucket");
    let gone: Vec<_> = (1..1200).map(|i| tomb(10 + i, &format!("api_key_o{i}"), 5)).collect();
    l.apply_quotas(&gone);
    assert_eq!(filter_total(&l), 2);
    assert_eq!(passes(&l, b"api_key_o5", 10), 3);
    // A second, shorter template covers the first one's name and `plain_quota`'s; deleting
    // the first leaves the early override to the second.
    l.apply_quotas(&[q(3, "p*", 6, 1.0, 1.0, 1.0, None), q(4, "api_*", 6, 1.0, 1.0, 1.0, None)]);
    assert_eq!(filter_total(&l), 5, "api_key_early, api_key_*, plain_quota, and each template");
    assert_eq!(passes(&l, b"plain_quota", 10), 0, "still its own quota, full");
    l.apply_quotas(&[tomb(2, "api_key_*", 7)]);
    assert_eq!(passes(&l, b"api_key_early", 10), 0, "still its own quota, full");
    assert_eq!(passes(&l, b"api_key_new", 10), 2, "a key of api_*");
    // Counts are exact however many share a bit: the bit clears with the last of them.
    let b = |l: &Limiter| l.may_have_quota(crate::zone::keys::name_hash(l.key_secret(), b"api_x"));
    assert!(!b(&l));
    let mut w = l.writer();
    for _ in 0..300 {
        l.count_override(&mut w, b"api_x", true);
    }
    for _ in 0..299 {
        l.count_override(&mut w, b"api_x", false);
    }
    drop(w);
    assert!(b(&l), "one left");
    l.count_override(&mut l.writer(), b"api_x", false);
    assert!(!b(&l), "none left");
    // A count no quota stands behind stays until the writer counts again from the block:
    // not for a batch that only changes a template's numbers (the templates held stay the
    // same), but for one that makes a template.
    l.count_override(&mut l.writer(), b"api_x", true);
    l.apply_quotas(&[q(4, "api_*", 8, 1.0, 2.0, 2.0, None)]);
    assert!(b(&l), "not counted again");
    l.apply_quotas(&[q(5, "zz_*", 9, 1.0, 2.0, 2.0, None)]);
    assert!(!b(&l), "counted again");
    assert_eq!(filter_total(&l), 5, "api_key_early, plain_quota, and each template");
}

/// The filter's bit of a name.
fn bit_of(l: &Limiter, n: &[u8]) -> usize {
    crate::limiter::keys::override_bit(crate::zone::keys::name_hash(l.key_secret(), n))
}

/// A name `prefix` + a number whose filter bit is the bit of `of`.
fn name_on_bit(l: &Limiter, prefix: &str, of: &[u8]) -> String {
    let bit = bit_of(l, of);
    (0..1_000_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| bit_of(l, n.as_bytes()) == bit)
        .expect("a name on the bit")
}

#[test]
fn a_rename_that_fails_uncounts_its_override_once() {
    // Two overrides on one bit; the arena then fills, and renaming one of them to a long
    // name fails (its name does not fit): freed, it must not take the other's count away.
    let clock = ManualClock::at(10 * S);
    let l = Limiter::builder().clock(Arc::new(clock.clone())).capacity(200).keys(100).build();
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    let other = name_on_bit(&l, "api_key_s", b"api_key_vip");
    l.apply_quotas(&[
        q(2, "api_key_vip", 1, 1.0, 20.0, 20.0, None),
        q(3, &other, 1, 1.0, 20.0, 20.0, None),
    ]);
    for id in 100.. {
        let r = l.apply_quotas(&[q(id, &format!("zz{id:0>200}"), 1, 1.0, 1.0, 1.0, None)]);
        if r.missing > 0 {
            break;
        }
        assert!(id < 200, "the arena never filled");
    }
    let long = format!("api_key_{}", "l".repeat(200));
    assert!(l.apply_quotas(&[q(3, &long, 2, 1.0, 20.0, 20.0, None)]).missing > 0);
    assert_eq!(passes(&l, b"api_key_vip", 30), 21, "still its own quota");
}

#[test]
fn a_new_writer_counts_the_filter_again() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[
        q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None),
        q(2, "api_key_vip", 1, 1.0, 20.0, 20.0, None),
    ]);
    // A writer that died in the middle of a batch may leave the filter anyhow.
    for i in 0..crate::zone::OVERRIDE_BITS / 64 {
        l.hdr(hdr::OVERRIDES + i).store(0, Relaxed);
    }
    l.hdr(hdr::WRITER).store(1, Relaxed);
    l.apply_quotas(&[q(3, "elsewhere", 1, 1.0, 1.0, 1.0, None)]);
    assert_eq!(filter_total(&l), 2);
    assert_eq!(passes(&l, b"api_key_vip", 30), 21);
}

#[test]
fn a_writer_overtaken_in_a_batch_has_every_writer_count_again() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    // Another process's writer takes the block over while this one is inside a batch (it
    // stopped past the write section's staleness): what this one writes after is missing
    // from the other's caches, so on release neither keeps its own.
    let w = l.writer();
    let theirs = 7;
    l.hdr(hdr::WRITER).store(theirs, Relaxed);
    drop(w);
    assert_eq!(l.hdr(hdr::WRITER).load(Relaxed), 0, "every writer rebuilds");
    l.apply_quotas(&[q(2, "api_key_vip", 1, 1.0, 20.0, 20.0, None)]);
    assert_ne!(l.hdr(hdr::WRITER).load(Relaxed), 0);
    assert_eq!(filter_total(&l), 2, "api_key_vip and the template");
    assert_eq!(passes(&l, b"api_key_vip", 30), 21);
}

#[test]
fn handles_taking_turns_as_writer_keep_the_counts_of_one_bit() {
    // Two workers of one nginx: each handle keeps its own counts of the filter, and an
    // override one of them made must keep its bit when the other removes the bit's other
    // quota with counts from before it.
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair_with_keys(&clock, 1000, 1000);
    a.apply_quotas(&[
        q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None),
        q(2, "api_key_vip", 1, 1.0, 20.0, 20.0, None),
    ]);
    let other = name_on_bit(&a, "api_key_s", b"api_key_vip");
    b.apply_quotas(&[q(3, &other, 1, 1.0, 20.0, 20.0, None)]);
    // a's own counts say one quota on the bit; the block has two.
    a.apply_quotas(&[tomb(2, "api_key_vip", 2)]);
    for l in [&a, &b] {
        assert_eq!(l.quota(&other).unwrap().template, None, "still its own quota");
    }
    assert_eq!(passes(&b, other.as_bytes(), 30), 21);
    assert_eq!(passes(&a, b"api_key_vip", 10), 3, "a key of the template again");
    // And back: b, whose counts predate the tomb, removes the last one.
    b.apply_quotas(&[tomb(3, &other, 2)]);
    assert!(!a.may_have_quota(crate::zone::keys::name_hash(a.key_secret(), other.as_bytes())));
    assert_eq!(passes(&a, other.as_bytes(), 10), 3);
    assert_eq!(filter_total(&a), 1, "the template alone");
}

#[test]
fn a_batch_naming_a_template_has_every_name_take_the_index_until_counted() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "abc_*", 1, 1.0, 2.0, 2.0, None)]);
    // An override of abc_* on the same bit as api_vip.
    let shared = name_on_bit(&l, "abc_s", b"api_vip");
    l.apply_quotas(&[
        q(2, "api_vip", 1, 1.0, 20.0, 20.0, None),
        q(5, &shared, 1, 1.0, 20.0, 20.0, None),
    ]);
    let h = crate::zone::keys::name_hash(l.key_secret(), b"api_vip");
    assert_eq!(filter_total(&l), 2, "the other override and abc_*, not api_vip");
    // What `apply_quotas` does first with a batch that names a template, then the template
    // inserted: a request path that meets `api_*` before the recount still finds the
    // override, also when the batch removes the other quota of its bit (which was the
    // bit's only count).
    let mut w = l.writer();
    l.saturate_overrides(&mut w);
    l.insert(&mut w, &q(3, "api_*", 1, 1.0, 2.0, 2.0, None), 10 * S).unwrap();
    l.count_override(&mut w, shared.as_bytes(), false);
    drop(w);
    assert!(l.may_have_quota(h));
    assert!(l.template_for(b"api_vip").is_some());
    assert_eq!(l.resolve(b"api_vip", 10 * S).map(|r| r.0), l.find(b"api_vip").map(|r| r.0));
    // A batch that makes a template ends counted.
    l.apply_quotas(&[q(4, "zz_*", 2, 1.0, 2.0, 2.0, None)]);
    assert!(l.may_have_quota(h));
    assert_eq!(filter_total(&l), 5, "api_vip, the other override and each template");
}

#[test]
fn inside_a_batch_that_makes_a_template_its_overrides_are_found() {
    // apply_quotas itself, watched between its updates: the override filter must not
    // send api_vip to a key once api_* is in the index, before the batch's recount. (A
    // template of the same length and first byte, abc_*, makes the request path look for
    // `api_*` in the index before the batch publishes the new template's bitmaps.)
    let (l, _) = keyed(1000);
    l.apply_quotas(&[
        q(1, "abc_*", 1, 1.0, 2.0, 2.0, None),
        q(2, "api_vip", 1, 1.0, 20.0, 20.0, None),
    ]);
    let checked = std::rc::Rc::new(std::cell::Cell::new(0));
    let seen = checked.clone();
    crate::limiter::writer::MID_BATCH.set(Some(Box::new(move |l: &Limiter| {
        if l.template_for(b"api_vip").is_some() {
            assert_eq!(l.resolve(b"api_vip", 10 * S).map(|r| r.0), l.find(b"api_vip").map(|r| r.0));
            seen.set(seen.get() + 1);
        }
    })));
    l.apply_quotas(&[q(3, "api_*", 1, 1.0, 2.0, 2.0, None), q(4, "other", 1, 1.0, 2.0, 2.0, None)]);
    crate::limiter::writer::MID_BATCH.set(None);
    assert_eq!(checked.get(), 2, "after each update once api_* was in");
}

#[test]
fn the_longest_prefix_wins() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[
        q(1, "api_*", 1, 1.0, 1.0, 1.0, None),
        q(2, "api_key_*", 2, 1.0, 4.0, 4.0, None),
    ]);
    assert_eq!(passes(&l, b"api_key_x", 10), 5);
    assert_eq!(passes(&l, b"api_other", 10), 2);
    assert_eq!(l.quota("api_key_x").unwrap().template.as_deref(), Some("api_key_*"));
}

#[test]
fn keys_may_hold_any_bytes_and_overrides_name_them_escaped() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "ip_*", 1, 1.0, 0.0, 0.0, None)]);
    let a: &[u8] = b"ip_\x7f\x00\x00\x01";
    let b: &[u8] = b"ip_\xff\xfe\x00\x00";
    assert_eq!(passes(&l, a, 5), 1);
    assert_eq!(passes(&l, b, 5), 1);
    assert_eq!(passes(&l, b"ip_", 5), 1, "an empty key part is a key too");
    // A long key costs the same: names are kept as a hash.
    let long = [b"ip_".as_slice(), &[b'x'; 4000]].concat();
    assert_eq!(passes(&l, &long, 5), 1);
    // An override names the bytes with %XX escapes.
    l.apply_quotas(&[q(2, "ip_%7F%00%00%01", 2, 1.0, 9.0, 9.0, None)]);
    assert_eq!(passes(&l, a, 20), 10);
    assert_eq!(l.check(b).outcome, Outcome::Rejected, "the other key is untouched");
}

#[test]
fn keys_count_against_the_templates_parent() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[
        q(1, "api_all", 1, 1.0, 4.0, 4.0, None),
        q(2, "api_key_*", 2, 1.0, 2.0, 2.0, Some("api_all")),
    ]);
    assert_eq!(passes(&l, b"api_key_a", 10), 3);
    assert_eq!(passes(&l, b"api_key_b", 10), 2, "the parent has room for 5 in all");
    assert_eq!(l.quota("api_all").unwrap().fill, 5.0);
    let d = l.account("api_key_c", 1).unwrap();
    assert_eq!(d.quota.as_deref(), Some("api_all"), "the parent rejects");
}

#[test]
fn keys_follow_their_template_and_go_with_it() {
    let (l, clock) = keyed(1000);
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    assert_eq!(passes(&l, b"api_key_a", 10), 3);
    // A higher burst reaches the existing key at once.
    l.apply_quotas(&[q(1, "api_key_*", 2, 1.0, 5.0, 5.0, None)]);
    assert_eq!(passes(&l, b"api_key_a", 10), 3, "3 more on top of 3");
    // Deleted: its keys are freed and the names pass.
    l.apply_quotas(&[tomb(1, "api_key_*", 3)]);
    assert_eq!(l.zone_status().usage.keys, 0);
    assert_eq!(l.account("api_key_a", 1).unwrap().outcome, Outcome::Unlimited);
    // Created again: a fresh bucket.
    clock.advance(Duration::from_secs(3));
    l.apply_quotas(&[q(3, "api_key_*", 4, 1.0, 2.0, 2.0, None)]);
    assert_eq!(passes(&l, b"api_key_a", 10), 3);
}

#[test]
fn a_full_table_shares_the_templates_bucket_and_drained_keys_make_room() {
    // 16 key slots: every window is the whole table.
    let (l, clock) = keyed(16);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 0.0, 0.0, None)]);
    let cap = l.zone_status().usage.key_capacity as usize;
    for i in 0..cap {
        assert_eq!(passes(&l, format!("k_{i}").as_bytes(), 1), 1);
    }
    // Every key holds a count: a new one cannot take a slot, it shares the template's.
    assert_eq!(passes(&l, b"k_new1", 1), 1);
    assert_eq!(passes(&l, b"k_new2", 1), 0, "the overflow bucket is full");
    assert_eq!(l.zone_status().usage.keys_refused, 2);
    // Once drained and taken by a round, their slots go to new keys.
    let pending = l.take_dirty();
    l.with_counters(|c| {
        for s in pending {
            c.take_local(s);
            c.sub_inflight(s, u64::MAX);
        }
    });
    clock.advance(Duration::from_secs(2));
    assert_eq!(passes(&l, b"k_new3", 1), 1);
    assert_eq!(l.zone_status().usage.key_evictions, 1);
}

#[test]
fn a_limited_key_stays_limited_while_others_are_sprayed() {
    let (l, clock) = keyed(256);
    // The client being limited drains slowly; the sprayed keys drain within a millisecond.
    l.apply_quotas(&[q(1, "v_*", 1, 0.01, 5.0, 5.0, None), q(2, "k_*", 2, 1000.0, 5.0, 5.0, None)]);
    assert_eq!(passes(&l, b"v_victim", 100), 6);
    let mut rng = fastrand::Rng::with_seed(9);
    for round in 0..50 {
        for _ in 0..1000 {
            l.account(format!("k_{}", rng.u64(..)).as_bytes(), 1).unwrap();
        }
        // A round takes what was counted (as the agent does), and time passes.
        round_alone(&l, &clock);
        clock.advance(Duration::from_millis(20));
        assert_eq!(l.check("v_victim").outcome, Outcome::Rejected, "round {round}");
    }
    let u = l.zone_status().usage;
    assert!(u.key_evictions > 10_000, "the spray went through drained keys: {u:?}");
}

#[test]
fn concurrent_first_sights_make_one_key_and_lose_no_count() {
    for trial in 0..20 {
        let (l, _) = keyed(1000);
        l.apply_quotas(&[q(1, "k_*", 1, 1.0, 1e9, 1e9, None)]);
        let l = Arc::new(l);
        let name = format!("k_{trial}");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (l, name) = (l.clone(), name.clone());
                std::thread::spawn(move || passes(&l, name.as_bytes(), 500))
            })
            .collect();
        let passed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(passed, 2000);
        assert_eq!(l.zone_status().usage.keys, 1, "trial {trial}");
        assert_eq!(l.template_keys()[0].keys, 1, "trial {trial}: the duplicate left its count");
        assert_eq!(l.quota(name.as_str()).unwrap().fill, 2000.0, "trial {trial}");
    }
}

#[test]
fn the_agents_sweep_frees_drained_keys_when_the_table_fills() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 100.0, 5.0, 5.0, None)]);
    let cap = l.zone_status().usage.key_capacity;
    // A quarter full: drained keys stay (a key used again later keeps its slot).
    for i in 0..cap / 4 {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
    }
    let take = |l: &Limiter| {
        learn_dirty(l, clock.now_nanos());
    };
    take(&l);
    clock.advance(Duration::from_secs(1));
    assert_eq!((0..16).map(|_| l.sweep_keys(clock.now_nanos())).sum::<usize>(), 0);
    // Over half full: a whole sweep (16 steps) frees drained keys until half is free.
    for i in cap / 4..cap * 3 / 4 {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
    }
    take(&l);
    // One key still counts: it stays.
    assert_eq!(passes(&l, b"k_0", 1), 1);
    clock.advance(Duration::from_secs(1));
    // Drained, but heard of a second ago: like limit_req's states, a key idle for less than
    // a minute keeps its slot while the table is not nearly full.
    assert_eq!((0..16).map(|_| l.sweep_keys(clock.now_nanos())).sum::<usize>(), 0);
    clock.advance(Duration::from_secs(60));
    let freed: usize = (0..16).map(|_| l.sweep_keys(clock.now_nanos())).sum();
    let u = l.zone_status().usage;
    assert!(freed > 0 && u.keys <= cap / 2, "{freed} freed: {u:?}");
    assert!(l.quota("k_0").is_some(), "a key that counts is never freed");
}

#[test]
fn a_nearly_full_table_frees_drained_keys_without_waiting_a_minute() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 100.0, 5.0, 5.0, None)]);
    let cap = l.zone_status().usage.key_capacity;
    let mut inserted = 0;
    for i in 0..cap * 2 {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
        inserted = l.zone_status().usage.keys;
        if inserted > cap / 8 * 7 {
            break;
        }
    }
    assert!(inserted > cap / 8 * 7, "{inserted} of {cap}");
    round_alone(&l, &clock);
    clock.advance(Duration::from_secs(1));
    let freed: usize = (0..16).map(|_| l.sweep_keys(clock.now_nanos())).sum();
    assert!(freed > 0, "nearly full: drained keys go at once");
}

#[test]
fn a_learned_key_bears_its_mark_and_a_key_taking_its_slot_does_not() {
    let (l, _) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    let known = |s: u32, id: u64| l.key_known(&l.writer(), s, id);
    passes(&l, b"k_a", 1);
    let s = l.dirty_key_slots()[0];
    let a = l.slot(s).unwrap().id();
    assert!(!known(s, a), "new to the writer");
    l.learn_keys(&[(s, a)]);
    assert!(known(s, a));
    assert_eq!(l.find_id(&l.writer(), a), Some(s));
    // A request path takes the slot over for another key (a drained key's, as when its
    // window is full): its publish leaves no mark.
    let table = l.key_table();
    let pos = s - l.key_slots().start;
    let h = crate::zone::keys::name_hash(l.key_secret(), b"k_b");
    let b = crate::zone::keys::key_id(l.cluster_secret(), b"k_b");
    assert!(table.claim(pos, a, crate::zone::keys::claimed(h.0, 1)));
    assert!(table.publish(
        pos,
        crate::zone::keys::claimed(h.0, 1),
        h,
        b,
        l.template_for(b"k_b").unwrap(),
        (1000, 5000, 5000),
        0
    ));
    assert!(!known(s, b), "the publish cleared the mark");
    // The writer learning the old key just after that publish marks nothing; a mark that
    // landed anyway names the old key, not the new one.
    l.learn_keys(&[(s, a)]);
    assert!(!known(s, b));
    let mark = u64::from(crate::zone::keys::known_mark(a, l.writer().token));
    l.slot(s).unwrap().w(crate::zone::slot::TAG_PARENT).fetch_or(mark, Relaxed);
    assert!(!known(s, b));
    l.learn_keys(&[(s, b)]);
    assert!(known(s, b));
    assert_eq!(l.find_id(&l.writer(), b), Some(s));
    assert_eq!(l.slot(s).unwrap().parent(), 0, "the mark leaves the parent be");
}

#[test]
fn a_key_in_two_slots_is_marked_only_where_the_writer_finds_it() {
    // Two workers' first sights of one name may both publish it (the later one settles
    // only once it looks again): the writer's map names one slot, and a mark on the other
    // would outlive that slot's freeing, with the key never learned again.
    let (l, _) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    passes(&l, b"k_a", 1);
    let first = l.dirty_key_slots()[0];
    let a = l.slot(first).unwrap().id();
    l.learn_keys(&[(first, a)]);
    let table = l.key_table();
    let h = crate::zone::keys::name_hash(l.key_secret(), b"k_a");
    let other = (0..table.cap()).find(|&p| table.slot(p).unwrap().id() == 0).unwrap();
    assert!(table.claim(other, 0, crate::zone::keys::claimed(h.0, 1)));
    assert!(table.publish(
        other,
        crate::zone::keys::claimed(h.0, 1),
        h,
        a,
        l.template_for(b"k_a").unwrap(),
        (1000, 5000, 5000),
        0
    ));
    let second = other + l.key_slots().start;
    l.learn_keys(&[(second, a)]);
    assert!(!l.key_known(&l.writer(), second, a));
    assert_eq!(l.find_id(&l.writer(), a), Some(first));
}

#[test]
fn a_writer_that_takes_over_trusts_no_mark_of_the_one_before() {
    let clock = ManualClock::at(10 * S);
    let (a, b) = shared_pair_with_keys(&clock, 1000, 1000);
    a.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    passes(&a, b"k_x", 1);
    let s = a.dirty_key_slots()[0];
    let id = a.slot(s).unwrap().id();
    a.learn_keys(&[(s, id)]);
    assert!(a.key_known(&a.writer(), s, id));
    // b's writer takes the block over: its map comes from its own walk of the table.
    b.apply_quotas(&[q(2, "elsewhere", 1, 1.0, 1.0, 1.0, None)]);
    assert!(!b.key_known(&b.writer(), s, id), "a's mark");
    b.learn_keys(&[(s, id)]);
    assert!(b.key_known(&b.writer(), s, id));
    assert_eq!(b.find_id(&b.writer(), id), Some(s));
}

#[test]
fn a_claim_left_by_a_dead_inserter_is_freed_once_it_stood_10_s() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    passes(&l, b"k_a", 1);
    // A request path claimed a slot and died before publishing.
    let table = l.key_table();
    let (h, pos, old) = free_place(&l, b"k_dead", 0);
    assert!(table.claim(pos, old, crate::zone::keys::claimed(h.0, 1)));
    assert_eq!(l.check("k_dead").outcome, Outcome::Passed, "busy: on the template's bucket");
    assert_eq!(l.quota("k_*").unwrap().fill, 0.0);
    // A small table passes whole at each round: a claim seen at two rounds in a row may be
    // an insert descheduled a moment, and stands.
    for _ in 0..19 {
        l.sweep_keys(clock.now_nanos());
        clock.advance(Duration::from_millis(500));
    }
    assert!(crate::zone::keys::is_claim(table.slot(pos).unwrap().id()), "9.5 s: still a claim");
    clock.advance(Duration::from_millis(500));
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(3));
    assert_eq!(passes(&l, b"k_dead", 10), 6, "its slot is free again");
}

/// A request path stopped (`SIGSTOP`, a paused VM) between its claim and its publish for
/// longer than the sweep waits for a dead one's claim: its place went to another key, which
/// its late publish must not overwrite; it looks again and finds a place of its own.
#[test]
fn an_inserter_stopped_past_the_sweep_does_not_publish_over_the_key_that_took_its_place() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    let table = l.key_table();
    let t = l.template_for(b"k_late").unwrap();
    let now_ms = || clock.now_nanos() / 1_000_000;
    let (late, pos, old) = free_place(&l, b"k_late", now_ms());
    assert!(table.claim(pos, old, crate::zone::keys::claimed(late.0, 1)));
    // The sweep sees the claim, then frees it 10 s on; 2 s later another key's insert
    // takes the place (found by its own probe, aimed here by a name whose window holds it).
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(10));
    l.sweep_keys(clock.now_nanos());
    assert!(!crate::zone::keys::is_claim(table.slot(pos).unwrap().id()), "freed as dead");
    clock.advance(Duration::from_secs(3));
    let other = (0..)
        .map(|i| format!("k_other{i}"))
        .find(|n| {
            let h = crate::zone::keys::name_hash(l.key_secret(), n.as_bytes());
            matches!(table.probe(h, now_ms()), crate::zone::keys::Probe::Absent(Some((p, _))) if p == pos)
        })
        .unwrap();
    assert_eq!(passes(&l, other.as_bytes(), 10), 6, "its own bucket, in the place");
    let id_other = table.slot(pos).unwrap().id();
    let live = l.hdr(hdr::KEYS_LIVE).load(Relaxed);
    // The stopped one resumes.
    let id_late = crate::zone::keys::key_id(l.cluster_secret(), b"k_late");
    let published = table.publish(
        pos,
        crate::zone::keys::claimed(late.0, 1),
        late,
        id_late,
        t,
        (1000, 5000, 5000),
        0,
    );
    assert_eq!(table.slot(pos).unwrap().id(), id_other);
    assert_eq!(passes(&l, other.as_bytes(), 1), 0, "the other key's bucket is whole");
    assert!(!published);
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), live, "nothing counted for the late one");
    assert_eq!(passes(&l, b"k_late", 10), 6, "the late name gets a place of its own");
}

/// An insert that read its template's numbers just before the writer changed them, and
/// was still a claim when the writer's walk of the key table passed its place: it sees
/// the key generation moved, and its key is inserted again with the new numbers.
#[test]
fn an_insert_that_read_a_template_before_it_changed_is_made_again_with_the_new_numbers() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    passes(&l, b"k_a", 1);
    let table = l.key_table();
    let now_ms = clock.now_nanos() / 1_000_000;
    let t = l.template_for(b"k_new").unwrap();
    // An insert up to its publish: the generation read, a place claimed, the numbers read.
    let start = |name: &[u8]| {
        let gen = l.hdr(hdr::KEY_GEN).load(Relaxed);
        let (h, pos, old) = free_place(&l, name, now_ms);
        let mine = crate::zone::keys::claimed(h.0, 1);
        assert!(l.claim_place(&table, pos, old, mine));
        (h, pos, l.prepare_key(&table, t, name, (pos, mine), gen, now_ms).unwrap())
    };
    let live = l.hdr(hdr::KEYS_LIVE).load(Relaxed);
    let (h, pos, ins) = start(b"k_new");
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), live + 1, "a claim counts as its key");
    // The template goes from 1/s to 100/s: the walk gives k_a the new numbers and passes
    // k_new's place while it is a claim.
    l.apply_quotas(&[q(1, "k_*", 2, 100.0, 5.0, 5.0, None)]);
    assert_eq!(l.quota("k_a").unwrap().limit, 100.0);
    let stale = crate::limiter::keys::Published::Stale;
    assert_eq!(l.publish_key(&table, &ins, h, now_ms), stale, "published with old numbers");
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), live);
    assert!(!crate::zone::keys::is_key_id(table.slot(pos).unwrap().id()), "its place is freed");
    assert_eq!(passes(&l, b"k_new", 1), 1);
    assert_eq!(l.quota("k_new").unwrap().limit, 100.0);
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), live + 1);
    // The same with the cluster's secret arriving: the key's id read before it would
    // never be shared with the cluster's.
    let (h, _, ins) = start(b"k_other");
    l.set_cluster_secret((5, 6), clock.now_nanos());
    assert_eq!(l.publish_key(&table, &ins, h, now_ms), stale);
    assert_eq!(passes(&l, b"k_other", 1), 1);
    let id = crate::zone::keys::key_id((5, 6), b"k_other");
    assert!((0..table.cap()).any(|p| table.slot(p).unwrap().id() == id), "under the new secret");
    // The first secret stays; another one is counted, the same one is not.
    l.set_cluster_secret((5, 6), clock.now_nanos());
    l.set_cluster_secret((7, 8), clock.now_nanos());
    assert_eq!(l.zone_status().usage.key_secret_conflicts, 1);
    assert!((0..table.cap()).any(|p| table.slot(p).unwrap().id() == id), "kept");
}

/// Request paths inserting keys into a crowded table (evicting drained ones) while the
/// writer changes their template again and again: once they stop, every key holds the
/// template's last numbers, also those inserted while the writer walked the table (a
/// key evicted while the walk gives it new numbers is a window too narrow for this to
/// meet; the walk claims each key it rewrites against it).
#[test]
fn keys_inserted_while_their_template_changes_end_with_its_last_numbers() {
    let (l, clock) = keyed(256);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 1.0, 1.0, None)]);
    let l = Arc::new(l);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|n| {
            let (l, stop) = (l.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Relaxed) && i < 2_000_000 {
                    l.account(format!("k_{n}_{i}").as_str(), 1).unwrap();
                    i += 1;
                }
                i
            })
        })
        .collect();
    let made = |l: &Limiter| l.hdr(hdr::KEYS_INSERTED).load(Relaxed);
    for v in 2..=300u64 {
        // Some inserts between changes (bounded: a stalled thread ends the wait).
        let (before, t0) = (made(&l), std::time::Instant::now());
        while made(&l) < before + 20 && t0.elapsed() < Duration::from_secs(1) {
            std::thread::yield_now();
        }
        // What a round does: the keys' counts go, and they drain, so that inserts evict
        // them (also while the walk below gives them new numbers).
        learn_dirty(&l, clock.now_nanos());
        clock.advance(Duration::from_secs(2));
        l.apply_quotas(&[q(1, "k_*", v, v as f64, 1.0, 1.0, None)]);
    }
    stop.store(true, Relaxed);
    let inserted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let table = l.key_table();
    let (t, template) = l.find("k_*").unwrap();
    let mut keys = 0;
    for pos in 0..table.cap() {
        let k = table.slot(pos).unwrap();
        if crate::zone::keys::is_key_id(k.id()) {
            keys += 1;
            assert_eq!(k.get(crate::zone::keys::TEMPLATE), u64::from(t) + 1);
            assert_eq!(k.get(crate::zone::slot::LIMIT), template.get(crate::zone::slot::LIMIT));
        }
    }
    assert!(keys > 0 && inserted > 1000, "{keys} keys, {inserted} requests");
    assert!(l.zone_status().usage.key_evictions > 1000);
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), keys);
}

/// A request path stopped past the sweep between its claim and its publish, while a
/// second insert of the same name took the same place and is itself between the two: the
/// two claims are different words, so the first does not take the second's for its own.
#[test]
fn a_stopped_insert_does_not_take_a_later_insert_of_its_name_for_itself() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    let table = l.key_table();
    let t = l.template_for(b"k_x").unwrap();
    let gen = l.hdr(hdr::KEY_GEN).load(Relaxed);
    let ms = |c: &ManualClock| c.now_nanos() / 1_000_000;
    let (h, pos, old) = free_place(&l, b"k_x", ms(&clock));
    let first = crate::zone::keys::insert_claim(h.0, ms(&clock));
    assert!(l.claim_place(&table, pos, old, first));
    let stopped = l.prepare_key(&table, t, b"k_x", (pos, first), gen, ms(&clock)).unwrap();
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(10));
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(3));
    let (_, again, old) = free_place(&l, b"k_x", ms(&clock));
    assert_eq!(again, pos, "the same place");
    let second = crate::zone::keys::insert_claim(h.0, ms(&clock));
    assert!(l.claim_place(&table, pos, old, second));
    let ins = l.prepare_key(&table, t, b"k_x", (pos, second), gen, ms(&clock)).unwrap();
    let lost = crate::limiter::keys::Published::ClaimLost;
    assert_eq!(l.publish_key(&table, &stopped, h, ms(&clock)), lost);
    assert_eq!(table.slot(pos).unwrap().id(), second);
    let yes = crate::limiter::keys::Published::Yes;
    assert_eq!(l.publish_key(&table, &ins, h, ms(&clock)), yes);
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), 1);
    assert_eq!(l.template_keys()[0].keys, 1);
}

/// A template whose parent comes in a later batch: its keys, held already, take the
/// parent too, as the keys inserted after it do.
#[test]
fn keys_take_the_parent_their_template_waited_for() {
    let (l, _) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 10.0, 5.0, 5.0, Some("all"))]);
    passes(&l, b"k_a", 1);
    assert_eq!(l.lookup(b"k_a").unwrap().1.parent(), 0, "no parent yet");
    l.apply_quotas(&[q(2, "all", 1, 1.0, 1.0, 1.0, None)]);
    let (all, _) = l.find("all").unwrap();
    assert_eq!(l.lookup(b"k_a").unwrap().1.parent(), all + 1);
    passes(&l, b"k_b", 1);
    assert_eq!(l.lookup(b"k_b").unwrap().1.parent(), all + 1);
}

/// A request path that took a drained key's place and died before publishing: the sweep
/// frees its claim, and the evicted key is not counted live any more.
#[test]
fn a_dead_inserter_that_evicted_a_key_leaves_the_live_count_right() {
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "k_*", 1, 1.0, 5.0, 5.0, None)]);
    passes(&l, b"k_a", 1);
    let s = l.dirty_key_slots()[0];
    let pos = s - l.key_slots().start;
    // k_a drains and has nothing to tell: a request path may take its place.
    learn_dirty(&l, clock.now_nanos());
    clock.advance(Duration::from_secs(20));
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), 1);
    let table = l.key_table();
    let a = table.slot(pos).unwrap().id();
    let h = crate::zone::keys::name_hash(l.key_secret(), b"k_dead");
    assert!(l.claim_place(&table, pos, a, crate::zone::keys::claimed(h.0, 1)));
    // ... and dies there. The sweep frees the claim once it stood 10 s.
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(10));
    l.sweep_keys(clock.now_nanos());
    assert!(!crate::zone::keys::is_claim(table.slot(pos).unwrap().id()), "freed");
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), 0, "neither k_a nor the claim is a key");
    assert_eq!(l.hdr(hdr::KEY_EVICTIONS).load(Relaxed), 1);
    // One that died on a free place: its claim counted, and the sweep uncounts it.
    let now_ms = clock.now_nanos() / 1_000_000 + 3_000;
    let (h, pos, old) = free_place(&l, b"k_dead2", now_ms);
    assert!(l.claim_place(&table, pos, old, crate::zone::keys::insert_claim(h.0, now_ms)));
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), 1);
    l.sweep_keys(clock.now_nanos());
    clock.advance(Duration::from_secs(10));
    l.sweep_keys(clock.now_nanos());
    assert_eq!(l.hdr(hdr::KEYS_LIVE).load(Relaxed), 0);
}

/// A key no root has reported counts, after its first unit here, for every live limiter
/// the roots last named, also after it emptied: what it holds again is its new counts,
/// scaled, never less.
#[test]
fn a_key_no_root_reported_stands_for_every_live_limiter() {
    let (l, clock) = keyed(1000);
    // 10/s, a hard cutoff at 15.
    l.apply_quotas(&[q(1, "api_key_*", 1, 10.0, 15.0, 15.0, None)]);
    assert_eq!(passes(&l, b"api_key_a", 40), 16, "alone: its own burst");
    l.set_peers(10);
    // The first unit is this host's alone (fill 1); each after it stands for 10: fills 0,
    // 1 and 11 pass, 21 does not.
    assert_eq!(passes(&l, b"api_key_b", 40), 3);
    clock.advance(Duration::from_secs(1));
    assert_eq!(passes(&l, b"api_key_b", 40), 1, "21 - 10 drained: 11 passes, 21 not");
    assert_eq!(l.quota("api_key_b").unwrap().fill, 21.0);
    // Quiet for a long time: the bucket emptied, and its old counts give no credit (an
    // anchor scaled like the counts it stands for).
    clock.advance(Duration::from_secs(100));
    assert_eq!(l.quota("api_key_b").unwrap().fill, 0.0);
    assert_eq!(passes(&l, b"api_key_b", 40), 2);
}

/// A key of any length is a bucket of its own, told apart by every byte (nginx bounds what a
/// request can give by its header buffers); only its override is bound by the 255 bytes of
/// a quota name.
#[test]
fn long_keys_are_keys_whole() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 2.0, None)]);
    let mut a = b"api_key_".to_vec();
    a.extend(std::iter::repeat_n(b'x', 8000));
    let mut b = a.clone();
    *b.last_mut().unwrap() = b'y';
    assert_eq!(passes(&l, &a, 10), 3);
    assert_eq!(passes(&l, &b, 10), 3, "differs in its last byte only");
    assert_eq!(l.zone_status().usage.keys, 2);
}

/// Keys held, evicted and refused are counted per template: each of the first
/// `TEMPLATE_STATS` templates apart, the rest together, and a template's counts go with it.
#[test]
fn keys_are_counted_per_template() {
    let (l, clock) = keyed(16);
    let row = |l: &Limiter, t: Option<&str>| {
        l.template_keys()
            .into_iter()
            .find(|r| r.template.as_deref() == t)
            .map(|r| (r.keys, r.evictions, r.refused))
    };
    l.apply_quotas(&[q(1, "a_*", 1, 1.0, 0.0, 0.0, None), q(2, "b_*", 2, 1.0, 0.0, 0.0, None)]);
    assert_eq!(row(&l, Some("a_*")), Some((0, 0, 0)));
    let cap = l.zone_status().usage.key_capacity as usize;
    for i in 0..cap {
        let t = if i < 3 { "b" } else { "a" };
        passes(&l, format!("{t}_{i}").as_bytes(), 1);
    }
    assert_eq!(row(&l, Some("a_*")), Some((cap as u64 - 3, 0, 0)));
    assert_eq!(row(&l, Some("b_*")), Some((3, 0, 0)));
    // Full of counting keys: a new b key is refused, under b.
    passes(&l, b"b_new", 1);
    assert_eq!(row(&l, Some("b_*")), Some((3, 0, 1)));
    // Drained: a new b key takes the slot of some key, counted against that key's template.
    round_alone(&l, &clock);
    clock.advance(Duration::from_secs(2));
    passes(&l, b"b_new2", 1);
    let (a, b) = (row(&l, Some("a_*")).unwrap(), row(&l, Some("b_*")).unwrap());
    assert_eq!(a.0 + b.0, cap as u64, "{a:?} {b:?}");
    assert_eq!(a.1 + b.1, 1, "one eviction: {a:?} {b:?}");
    assert_eq!(l.zone_status().usage.key_evictions, 1);
    assert_eq!(row(&l, None), None, "nothing beyond the first templates");
    // Deleting a template takes its keys and its counts.
    l.apply_quotas(&[tomb(2, "b_*", 3)]);
    assert_eq!(row(&l, Some("b_*")), None);
    assert_eq!(row(&l, Some("a_*")).unwrap().0, l.zone_status().usage.keys);
}

#[test]
fn templates_beyond_the_counted_ones_are_counted_together() {
    let (l, _) = keyed(1000);
    let n = crate::zone::TEMPLATE_STATS as u64 + 3;
    let quotas: Vec<_> =
        (1..=n).map(|i| q(i, &format!("t{i}_*"), i, 1.0, 5.0, 5.0, None)).collect();
    l.apply_quotas(&quotas);
    for i in 1..=n {
        passes(&l, format!("t{i}_x").as_bytes(), 1);
    }
    let rows = l.template_keys();
    assert_eq!(rows.len(), crate::zone::TEMPLATE_STATS + 1);
    assert!(rows[..rows.len() - 1].iter().all(|r| r.keys == 1 && r.template.is_some()));
    let other = rows.last().unwrap();
    assert_eq!((other.template.as_deref(), other.keys), (None, 3));
    // One of the counted ones goes: a template counted together takes its entry, with its
    // keys (recounted from the table).
    let gone = rows[0].template.clone().unwrap();
    let id: u64 = gone.trim_start_matches('t').trim_end_matches("_*").parse().unwrap();
    l.apply_quotas(&[tomb(id, &gone, n + 1)]);
    let rows = l.template_keys();
    assert_eq!(rows.len(), crate::zone::TEMPLATE_STATS + 1);
    assert!(rows.iter().all(|r| r.template.as_deref() != Some(gone.as_str())));
    assert_eq!(rows.iter().map(|r| r.keys).sum::<u64>(), n - 1);
    assert_eq!(rows.last().unwrap().keys, 2);
}

#[test]
fn keys_the_writer_learned_are_not_counted_as_quotas() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[q(1, "k_*", 1, 100.0, 5.0, 5.0, None)]);
    for i in 0..10 {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
    }
    assert_eq!(learn_dirty(&l, 10 * S).len(), 10);
    l.apply_quotas(&[q(2, "other", 1, 1.0, 1.0, 1.0, None)]);
    assert_eq!(l.quota_count(), 2);
    assert_eq!(l.zone_status().usage.keys, 10);
}

#[test]
fn a_sweep_below_half_full_reads_a_256th_of_the_table() {
    let (l, clock) = keyed(100_000);
    l.apply_quotas(&[q(1, "k_*", 1, 100.0, 5.0, 5.0, None)]);
    let cap = u64::from(l.key_table().cap());
    let hand = || l.hdr(hdr::KEY_HAND).load(Relaxed);
    let step = |l: &Limiter| {
        let before = hand();
        l.sweep_keys(clock.now_nanos());
        (hand() + cap - before) % cap
    };
    passes(&l, b"k_a", 1);
    assert_eq!(step(&l), cap.div_ceil(256));
    for i in 0..cap * 7 / 10 {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
    }
    assert!(l.zone_status().usage.keys > cap / 2);
    assert_eq!(step(&l), cap.div_ceil(16), "crowded: evictions need the faster sweep");
}

#[test]
fn the_writers_id_map_does_not_grow_with_keys_that_took_others_slots() {
    // Keys that take the slot of a drained key (the request path evicts it) leave the
    // evicted key's id behind in the writer's map; under churn it grew by one entry per
    // eviction, without end (18,544 entries for 4 quotas and 2,000 keys in
    // t/yarl_templates.t).
    let (l, clock) = keyed(1000);
    l.apply_quotas(&[q(1, "k_*", 1, 1e6, 0.0, 0.0, None)]);
    let cap = u64::from(l.key_table().cap());
    for round in 0..40 {
        for i in 0..1000 {
            l.account(format!("k_{round}_{i}").as_bytes(), 1).unwrap();
        }
        learn_dirty(&l, clock.now_nanos());
        l.compact_key_ids(crate::limiter::no_pace);
        clock.advance(Duration::from_secs(1));
    }
    let z = l.zone_status().usage;
    assert!(z.key_evictions > 20_000, "{}", z.key_evictions);
    let ids = Limiter::id_count(&l.writer());
    assert!((ids as u64) <= 2 * (cap + 1) + 1024, "{ids} ids for {} keys", z.keys);
    // And the map still finds every key the table holds.
    let table = l.key_table();
    for pos in 0..table.cap() {
        let id = table.slot(pos).unwrap().id();
        if crate::zone::keys::is_key_id(id) {
            assert_eq!(l.find_id(&l.writer(), id), Some(l.layout.slot_cap + pos));
        }
    }
}

#[test]
fn a_key_whose_template_goes_while_it_is_inserted_gives_its_place_back() {
    let (l, clock) = keyed(16);
    l.apply_quotas(&[q(1, "k_*", 1, 1e6, 0.0, 0.0, None), q(2, "gone_*", 1, 1.0, 0.0, 0.0, None)]);
    let cap = l.key_table().cap();
    let (t, _) = l.find("gone_*").unwrap();
    l.apply_quotas(&[tomb(2, "gone_*", 2)]);
    let live = |l: &Limiter| l.zone_status().usage;
    // A free place: claimed, then the template is found gone. The place is free again
    // (after its rest), not a claim for the sweep.
    let h = crate::zone::keys::name_hash(l.key_secret(), b"gone_a");
    let gen = l.hdr(hdr::KEY_GEN).load(Relaxed);
    assert!(l.key_of(t, b"gone_a", h, clock.now_nanos(), gen).is_err(), "resolve again");
    let ids: Vec<u64> = (0..cap).map(|p| l.key_table().slot(p).unwrap().id()).collect();
    assert!(!ids.iter().any(|&id| crate::zone::keys::is_claim(id)), "no claim left");
    // A full table of drained keys: the one evicted for the insert is counted gone.
    clock.advance(Duration::from_secs(3));
    let mut i = 0;
    while live(&l).keys < u64::from(cap) {
        l.account(format!("k_{i}").as_bytes(), 1).unwrap();
        i += 1;
    }
    learn_dirty(&l, clock.now_nanos());
    clock.advance(Duration::from_secs(3));
    let before = live(&l);
    let h = crate::zone::keys::name_hash(l.key_secret(), b"gone_b");
    let gen = l.hdr(hdr::KEY_GEN).load(Relaxed);
    assert!(l.key_of(t, b"gone_b", h, clock.now_nanos(), gen).is_err());
    let after = live(&l);
    assert_eq!(after.keys, before.keys - 1, "the evicted key left the count");
    assert_eq!(after.key_evictions, before.key_evictions + 1);
}

#[test]
fn a_template_edit_drains_its_keys_at_the_old_rate_up_to_the_edit() {
    // As for a quota (`an_edit_of_the_rate_counts_from_the_edit_on`): a key that used its
    // day up, idle 23 hours, when its template is halved, holds what the old rate left.
    let (l, clock) = keyed(64);
    let day = |epoch, limit: f64| QuotaUpdate {
        limits: Limits::from_units_per(limit, 86_400, limit - 1.0, limit).unwrap(),
        ..q(1, "k_*", epoch, 1.0, 0.0, 0.0, None)
    };
    l.apply_quotas(&[day(1, 1_000.0)]);
    assert_eq!(l.account(b"k_a", 1_000).unwrap().outcome, Outcome::Passed);
    learn_dirty(&l, clock.now_nanos());
    clock.advance(Duration::from_secs(23 * 3_600));
    l.apply_quotas(&[day(2, 500.0)]);
    let (s, _) = l.resolve(b"k_a", clock.now_nanos()).unwrap();
    assert!(l.is_key_slot(s));
    let fill = l.with_counters(|c| c.synced(s, clock.now_nanos()));
    assert!((41_600..=41_700).contains(&fill), "{fill} milli-units");
    assert_eq!(l.account(b"k_a", 1).unwrap().outcome, Outcome::Passed);
}

#[test]
fn a_key_that_spells_its_template_is_a_key_of_its_own() {
    // `api_key_$http_x_api_key` with `X-Api-Key: *` is the name `api_key_*`: a key, not
    // the template's own bucket (shared by the keys that found no room).
    let (l, clock) = keyed(64);
    l.apply_quotas(&[q(1, "api_key_*", 1, 1.0, 2.0, 3.0, None)]);
    assert_eq!(passes(&l, b"api_key_*", 3), 3);
    assert_eq!(l.zone_status().usage.keys, 1);
    let (s, _) = l.resolve(b"api_key_*", clock.now_nanos()).unwrap();
    assert!(l.is_key_slot(s), "its own slot in the key table");
    assert_eq!(l.quota("api_key_*").unwrap().fill, 0.0, "the template's bucket untouched");
}

/// Rejections of keys are their template's: one row per template in the ranking (a row per
/// key, each named by its template, made duplicate series in metrics), whose lifetime count
/// adds up its keys' and keeps them when a key goes.
#[test]
fn keys_rejections_rank_and_count_as_their_templates() {
    let (l, _) = keyed(1000);
    l.apply_quotas(&[
        q(1, "k_*", 1, 0.001, 1.0, 1.0, None),
        q(2, "plain", 2, 0.001, 1.0, 1.0, None),
    ]);
    for (k, tries) in [("k_a", 5), ("k_b", 4), ("k_c", 3), ("plain", 3)] {
        assert_eq!(passes(&l, k.as_bytes(), tries), 2, "{k}");
    }
    let top = l.top_rejections(20, 60);
    assert_eq!(top, [("k_*".to_owned(), 6, 6), ("plain".to_owned(), 1, 1)]);
    assert_eq!(l.quota("k_a").unwrap().rejections, 3, "a key still counts its own");
    assert_eq!(l.quota("k_*").unwrap().rejections, 6);
    assert_eq!(l.rejections(), 7);
}
