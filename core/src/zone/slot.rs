//! One quota and its counter: 16 words (two cache lines) at a fixed place in the block.
//!
//! | word | field |
//! |---|---|
//! | 0 | quota id; 0 = free |
//! | 1 | name tag (low 32 bits: the upper half of the name's hash) · parent slot + 1 (high 32 bits; 0 = none) |
//! | 2, 3, 4 | `limit` (milli-units/s), `low_burst`, `high_burst` (milli-units; the top bit of word 4 is [`SHADOW`]) |
//! | 5 | seqlock counter over `base`/`at` (low 32 bits) · offset of the name's arena tail (high 32 bits) |
//! | 6, 7 | `base`: the cluster fill (max over roots), milli-units, as of `at` (ns) (full drain; see `CounterAccess::rebase`) |
//! | 8 | `local`: accounted here, not yet taken by a sync round |
//! | 9 | `inflight`: taken by the current round, not yet reported back by a root |
//! | 10 | `rejected`: refused weight not yet taken by a round (demand signal) |
//! | 11 | `rates`: three 21-bit floats (see [`Rates`]): what the rest of the cluster adds, the attempted demand, and what this limiter counted per second in its last round (for early syncs) |
//! | 12 | requests this quota rejected (high 32 bits, wrapping) · when this limiter's own counts last started from an empty bucket (low 32 bits, ms, see [`Slot::estimate`]) |
//! | 13–15 | the name: its length byte and first 23 bytes |

use super::arena::{name, Arena};
use super::layout::word_table;
use super::SLOT_WORDS;
use crate::units::{Rate, MILLI};
use std::sync::atomic::{fence, AtomicU64, Ordering::*};

word_table! { FIELDS:
    pub(crate) const ID = 0;
    pub(crate) const TAG_PARENT = 1;
    pub(crate) const LIMIT = 2;
    pub(crate) const LOW = 3;
    pub(crate) const HIGH = 4;
    pub(crate) const META = 5;
    pub(crate) const BASE = 6;
    pub(crate) const AT = 7;
    pub(crate) const LOCAL = 8;
    pub(crate) const INFLIGHT = 9;
    pub(crate) const REJECTED = 10;
    pub(crate) const RATES = 11;
    pub(crate) const REJECTS = 12;
    pub(crate) const NAME = 13;
}
/// The top bit of the [`HIGH`] word: the quota is in shadow mode
/// ([`crate::Limits::dry_run`]). `high_burst` (at most 1e18 milli-units) keeps the bits below,
/// and a key copies its template's word whole, so keys follow their template's mode.
pub(crate) const SHADOW: u64 = 1 << 63;

/// One rejection in the [`REJECTS`] word (the count lives in its high half).
pub(crate) const ONE_REJECTION: u64 = 1 << 32;

/// Attempts a reader makes before it uses a possibly torn (`base`, `at`) pair: a writer that
/// died between its two stores must not stop every other process's requests.
const SEQLOCK_TRIES: u32 = 64;

/// How many limiters a counter no root has reported stands for (see [`Slot::estimate`]): the
/// block's count of live limiters, read only when such a counter is met, or one.
#[derive(Clone, Copy)]
pub(crate) struct Peers<'a>(Option<&'a AtomicU64>);

impl<'a> Peers<'a> {
    /// This limiter alone.
    pub(crate) const ALONE: Peers<'static> = Peers(None);

    /// The count in `cell` (0 before any answer, taken as 1).
    pub(crate) fn of(cell: &'a AtomicU64) -> Self {
        Peers(Some(cell))
    }

    /// Whether this limiter counts as the only one (before any answer, or the roots know
    /// of no other).
    pub(crate) fn alone(self) -> bool {
        self.get() <= 1.0
    }

    #[inline]
    fn get(self) -> f64 {
        self.0.map_or(1, |c| c.load(Relaxed).max(1)) as f64
    }

    /// What `own` milli-units this limiter counted on a counter no root has reported stand
    /// for: its first unit is its own alone, each after it as many as every live limiter
    /// would count. One request says nothing of the other hosts, and a client under its
    /// limit sent now and then to a random host meets most hosts once before their rounds
    /// report it: scaling its first unit refused its second request on a host within that
    /// host's first round (docs/accuracy.md, Zipf keys). A client new to every host at once
    /// comes back at once, and from its second unit on each host counts for all.
    #[inline]
    fn guess(self, own: f64) -> f64 {
        const FIRST: f64 = MILLI as f64;
        if own <= FIRST {
            own
        } else {
            (own - FIRST) * self.get() + FIRST
        }
    }
}

/// The three rates of the `rates` word, milli-units per second. Only the sync agent writes
/// them; they steer estimates and early syncs, so 13 bits of mantissa (a relative error
/// under 1/8000) are plenty.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Rates {
    /// What the rest of the cluster is estimated to add.
    pub inflow: f64,
    /// The cluster's attempted demand, as the roots meter it.
    pub demand: f64,
    /// What this limiter counted in its last round, per second.
    pub own: f64,
}

/// A positive finite `f32`'s exponent and the top 13 bits of its mantissa, rounded; 0 for
/// anything else.
fn to_f21(x: f64) -> u64 {
    if !(x.is_finite() && x > 0.0) {
        return 0;
    }
    let bits = u64::from((x as f32).to_bits()) & 0x7FFF_FFFF;
    ((bits + (1 << 9)) >> 10).min(0x1F_FFFF)
}

#[inline]
fn from_f21(b: u64) -> f64 {
    let x = f32::from_bits(((b & 0x1F_FFFF) << 10) as u32) as f64;
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

impl Rates {
    pub fn pack(&self) -> u64 {
        to_f21(self.inflow) | to_f21(self.demand) << 21 | to_f21(self.own) << 42
    }

    #[inline]
    pub fn unpack(r: u64) -> Rates {
        Rates { inflow: from_f21(r), demand: from_f21(r >> 21), own: from_f21(r >> 42) }
    }

    #[inline]
    pub fn inflow_of(r: u64) -> f64 {
        from_f21(r)
    }

    #[inline]
    pub fn demand_of(r: u64) -> f64 {
        from_f21(r >> 21)
    }

    #[inline]
    pub fn own_of(r: u64) -> f64 {
        from_f21(r >> 42)
    }
}

/// The low half of [`REJECTS`]: a time in whole milliseconds, wrapping every 49.7 days, 0 for
/// none. Read back relative to a later time, a value up to 24.8 days old is exact to the
/// millisecond (rounded up: later, never earlier); an older one reads as none or as too
/// recent, which only ever makes an estimate higher.
const MS: u64 = 1_000_000;
const HALF_WRAP_MS: u32 = 1 << 31;

pub(super) fn to_ms32(t: u64) -> u32 {
    (t.div_ceil(MS) as u32).max(1)
}

/// The time `ms` stands for, seen at `now`; `None` for none (or a time in the future).
#[inline]
fn from_ms32(ms: u32, now: u64) -> Option<u64> {
    if ms == 0 {
        return None;
    }
    let age = ((now / MS) as u32).wrapping_sub(ms);
    (age < HALF_WRAP_MS).then(|| now.saturating_sub(u64::from(age) * MS + now % MS))
}

#[derive(Clone, Copy)]
pub(crate) struct Slot<'a>(pub &'a [AtomicU64; SLOT_WORDS]);

impl<'a> Slot<'a> {
    #[inline]
    pub fn w(&self, i: usize) -> &'a AtomicU64 {
        &self.0[i]
    }

    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        self.0[i].load(Relaxed)
    }

    #[inline]
    pub fn id(&self) -> u64 {
        self.0[ID].load(Acquire)
    }

    #[inline]
    pub fn tag(&self) -> u32 {
        self.get(TAG_PARENT) as u32
    }

    /// Parent slot + 1; 0 = none.
    #[inline]
    pub fn parent(&self) -> u32 {
        (self.get(TAG_PARENT) >> 32) as u32
    }

    pub fn set_tag_parent(&self, tag: u32, parent: u32) {
        self.0[TAG_PARENT].store(u64::from(tag) | u64::from(parent) << 32, Relaxed);
    }

    pub fn set_parent(&self, parent: u32) {
        self.set_tag_parent(self.tag(), parent);
    }

    /// `high_burst`, milli-units.
    #[inline]
    pub fn high_burst(&self) -> u64 {
        self.get(HIGH) & !SHADOW
    }

    /// Whether the quota is in shadow mode (see [`SHADOW`]).
    #[inline]
    pub fn shadow(&self) -> bool {
        self.get(HIGH) & SHADOW != 0
    }

    pub fn tail_off(&self) -> u32 {
        (self.get(META) >> 32) as u32
    }

    pub fn set_tail_off(&self, off: u32) {
        let m = self.get(META);
        self.0[META].store(m & 0xFFFF_FFFF | u64::from(off) << 32, Relaxed);
    }

    /// Reads (`base`, `at`) consistently, or after [`SEQLOCK_TRIES`] attempts as they are.
    #[inline]
    pub fn read_base(&self) -> (u64, u64) {
        let mut tries = 0;
        loop {
            let s1 = self.0[META].load(Acquire) as u32;
            let base = self.get(BASE);
            let at = self.get(AT);
            fence(Acquire);
            let s2 = self.0[META].load(Relaxed) as u32;
            tries += 1;
            if (s1 & 1 == 0 && s1 == s2) || tries >= SEQLOCK_TRIES {
                return (base, at);
            }
            std::hint::spin_loop();
        }
    }

    /// Stores (`base`, `at`). Only the writer calls this.
    pub fn write_base(&self, base: u64, at: u64) {
        let m = self.get(META);
        // Odd while writing; a count left odd by a writer that died mid-write is made even
        // again by the next write.
        let odd = (m as u32).wrapping_add(1) | 1;
        let hi = m & !0xFFFF_FFFF;
        self.0[META].store(hi | u64::from(odd), Relaxed);
        fence(Release);
        self.0[BASE].store(base, Relaxed);
        self.0[AT].store(at, Relaxed);
        self.0[META].store(hi | u64::from(odd.wrapping_add(1)), Release);
    }

    /// The fill estimate in milli-units at `now`. `fresh` is false while no root answers:
    /// then nothing is extrapolated.
    ///
    /// The synced `base` drains from `at`; what this limiter counted since (`local` and
    /// `inflight`, not yet in `base`) drains only from when it was counted, so a bucket that
    /// emptied while nobody sent anything gives no credit to the next burst. That time, `t0`,
    /// is kept per slot by the request paths ([`Slot::started_empty`]): counts added to an
    /// empty bucket move it forward so that the bucket holds exactly what they added, which
    /// makes this estimate, between two syncs, an exact leaky bucket of this limiter's own
    /// requests on top of `base`. Before the first add since a sync, `t0` is `at`.
    ///
    /// Within `horizon` of `at`, the rest of the cluster is assumed to add `inflow`
    /// (milli-units/s), so the bucket drains that much slower there.
    ///
    /// A counter no root has reported yet (`at` is 0: a key on its first sight, any quota
    /// before this limiter's first answer) stands, after its first unit, for `peers`
    /// limiters' worth of this one's counts: the roots' count of live limiters, 0 or 1
    /// before any answer ([`Peers::guess`]). A client new to every host at once then gets
    /// about one burst cluster-wide before the first round tells them the truth, not one
    /// per host (whose excess the roots would then make it pay back, keeping its quota
    /// closed for as long as the excess takes to drain).
    #[inline(always)]
    pub fn estimate(&self, now: u64, fresh: bool, horizon: u64, peers: Peers<'_>) -> f64 {
        let (base, at) = self.read_base();
        let own = self.get(LOCAL).saturating_add(self.get(INFLIGHT));
        // Only counts of this limiter's own have a time of their own to drain from.
        let since = if own == 0 { None } else { from_ms32(self.get(REJECTS) as u32, now) };
        let t0 = match since {
            Some(t) if t > at => t,
            _ => at,
        };
        if t0 == 0 {
            // Never synced nor anchored: no time to drain from.
            return peers.guess(own as f64);
        }
        let inflow = if fresh && at != 0 { Rates::inflow_of(self.get(RATES)) } else { 0.0 };
        let limit = Rate::per_sec_of(self.get(LIMIT));
        if t0 == at {
            // Everything drains from the last sync: the common case, kept short.
            let dt = now.saturating_sub(at);
            let (inside, outside) = if dt <= horizon { (dt, 0) } else { (horizon, dt - horizon) };
            let drain = ((limit - inflow) * inside as f64 + limit * outside as f64) * 1e-9;
            return (base as f64 + own as f64 - drain).max(0.0);
        }
        if at == 0 {
            // Never synced: this limiter's own counts, as if every live limiter counted as
            // many after the first unit (`Peers::guess`), draining from `t0`.
            let own = peers.guess(own as f64);
            return (own - limit * now.saturating_sub(t0) as f64 * 1e-9).max(0.0);
        }
        Self::estimate_since(base, at, own as f64, t0, now, limit, inflow, horizon)
    }

    /// [`estimate`](Self::estimate) when this limiter's own counts drain from `t0`, later
    /// than the last sync `at`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn estimate_since(
        base: u64,
        at: u64,
        own: f64,
        t0: u64,
        now: u64,
        limit: f64,
        inflow: f64,
        horizon: u64,
    ) -> f64 {
        let edge = at.saturating_add(horizon);
        // Drain over [from, to]: `limit - inflow` before the horizon's edge, `limit` after.
        let drain = |from: u64, to: u64| {
            let inside = to.min(edge).saturating_sub(from);
            ((limit - inflow) * inside as f64 + limit * to.saturating_sub(from.max(edge)) as f64)
                * 1e-9
        };
        let synced = (base as f64 - drain(at, t0)).max(0.0);
        // The bucket drains what this limiter added since as well: draining only the synced
        // part counted a lone busy host's own traffic twice (once as `local`, once as the
        // cluster it stood for) and rejected it under the limit (docs/accuracy.md).
        (synced + own - drain(t0, now)).max(0.0)
    }

    /// Records that counts of `pending` milli-units (`local` and `inflight` before this add)
    /// met an empty bucket at `now`: from here they only count as far as they have not
    /// drained yet, `pending / limit` seconds' worth, so the estimate starts again from what
    /// this add brings. Called by request paths; never moves the time back (two racing adds
    /// keep the later one, which counts more, never less). `peers` as for
    /// [`estimate`](Self::estimate): a counter no root has reported holds `pending` as
    /// guessed ([`Peers::guess`]).
    pub fn started_empty(&self, pending: u64, now: u64, peers: Peers<'_>) {
        let Some(limit) = Rate::from_word(self.get(LIMIT)).filter(|r| r.milli() != 0) else {
            return;
        };
        let scaled = if self.get(AT) == 0 { peers.guess(pending as f64) as u64 } else { pending };
        let back = limit.time_to_drain(scaled);
        let t = now.saturating_sub(back);
        let new = to_ms32(t);
        let _ = self.0[REJECTS].fetch_update(Relaxed, Relaxed, |w| {
            let old = from_ms32(w as u32, now);
            if old.is_some_and(|o| o >= t) {
                return None;
            }
            Some(w & !0xFFFF_FFFF | u64::from(new))
        });
    }

    /// Whether this slot's name is `n`.
    #[inline]
    pub fn name_eq(&self, n: &[u8], arena: &Arena<'_>) -> bool {
        let words = name::words(n);
        let inline = words.min(name::INLINE);
        for i in 0..inline {
            if self.get(NAME + i) != name::word(n, i) {
                return false;
            }
        }
        if words > name::INLINE {
            let tail = self.tail_off();
            for i in name::INLINE..words {
                if arena.word(tail, i - name::INLINE) != name::word(n, i) {
                    return false;
                }
            }
        }
        true
    }

    /// The name's bytes.
    pub fn name(&self, arena: &Arena<'_>) -> Vec<u8> {
        let tail = self.tail_off();
        name::decode(|i| {
            if i < name::INLINE {
                self.get(NAME + i)
            } else {
                arena.word(tail, i - name::INLINE)
            }
        })
    }

    /// Writes the name's inline words; the caller stores the tail.
    pub fn set_inline_name(&self, n: &[u8]) {
        for i in 0..name::INLINE {
            self.0[NAME + i].store(name::word(n, i), Relaxed);
        }
    }

    /// Resets every field but the id and the name (a new quota in this slot).
    pub fn clear_counters(&self) {
        self.write_base(0, 0);
        for f in [LOCAL, INFLIGHT, REJECTED, RATES, REJECTS] {
            self.0[f].store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::NANOS_PER_SEC as NANOS;

    fn slot() -> Box<[AtomicU64; SLOT_WORDS]> {
        Box::new(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    #[test]
    fn rates_pack_and_unpack() {
        let r = Rates { inflow: 1500.0, demand: 3e12, own: 0.25 };
        let back = Rates::unpack(r.pack());
        for (a, b) in [(r.inflow, back.inflow), (r.demand, back.demand), (r.own, back.own)] {
            assert!((a - b).abs() <= a / 8000.0, "{a} read back as {b}");
        }
        let none = Rates { inflow: f64::NAN, demand: -1.0, own: f64::INFINITY };
        assert_eq!(Rates::unpack(none.pack()), Rates::default());
        assert_eq!(Rates::unpack(u64::MAX).inflow, 0.0, "garbage bits read as no rate");
        let huge = Rates { inflow: 1e30, demand: 1e-30, own: 1e18 };
        let back = Rates::unpack(huge.pack());
        assert!(back.inflow > 1e29 && back.demand < 1e-29 && (back.own - 1e18).abs() < 1e15);
    }

    #[test]
    fn times_in_milliseconds_round_up_and_wrap() {
        let t = 5 * 86_400 * NANOS + 1_234_567;
        let ms = to_ms32(t);
        let back = from_ms32(ms, t + 3 * NANOS).unwrap();
        assert!(back >= t && back - t < MS, "{t} read back as {back}");
        assert_eq!(from_ms32(0, t), None);
        assert_eq!(from_ms32(ms, t - 10 * MS), None, "a future time reads as none");
        // 20 days later: still exact; 30 days past the half wrap: none, never older.
        let later = t + 20 * 86_400 * NANOS;
        assert_eq!(from_ms32(ms, later).map(|b| b / MS), Some(back / MS));
        let much_later = t + (u64::from(HALF_WRAP_MS) + 30 * 86_400_000) * MS;
        assert!(from_ms32(ms, much_later).is_none_or(|b| b >= back));
    }

    #[test]
    fn seqlock_pair_roundtrip_and_recovers_from_a_dead_writer() {
        let w = slot();
        let s = Slot(&w);
        s.set_tail_off(77);
        s.write_base(5, 7);
        assert_eq!(s.read_base(), (5, 7));
        s.write_base(9, 11);
        assert_eq!(s.read_base(), (9, 11));
        assert_eq!(s.tail_off(), 77, "the tail offset shares the word");
        // A writer killed between its stores leaves the count odd: readers still answer.
        w[META].fetch_add(1, Relaxed);
        assert_eq!(s.read_base(), (9, 11));
        s.write_base(1, 2);
        assert_eq!(w[META].load(Relaxed) as u32 % 2, 0);
        assert_eq!(s.read_base(), (1, 2));
    }
}
