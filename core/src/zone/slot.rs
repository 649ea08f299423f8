//! One quota and its counter: 16 words (two cache lines) at a fixed place in the block.
//!
//! | word | field |
//! |---|---|
//! | 0 | quota id; 0 = free |
//! | 1 | name tag (low 32 bits: the upper half of the name's hash) · parent slot + 1 (high 32 bits; 0 = none) |
//! | 2, 3, 4 | `limit` (milli-units/s), `low_burst`, `high_burst` (milli-units) |
//! | 5 | seqlock counter over `base`/`at` (low 32 bits) · offset of the name's arena tail (high 32 bits) |
//! | 6, 7 | `base`: the cluster fill (max over roots), milli-units, as of `at` (ns) |
//! | 8 | `local`: accounted here, not yet taken by a sync round |
//! | 9 | `inflight`: taken by the current round, not yet reported back by a root |
//! | 10 | `rejected`: refused weight not yet taken by a round (demand signal) |
//! | 11 | `rates`: two `f32`, what the rest of the cluster adds and the attempted demand |
//! | 12 | requests this quota rejected (high 32 bits, wrapping) · what this limiter counted on it per second in its last round (low 32 bits, an `f32` in milli-units/s), for early syncs |
//! | 13–15 | the name: its length byte and first 23 bytes |

use super::arena::{name, Arena};
use super::layout::word_table;
use super::SLOT_WORDS;
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
/// One rejection in the [`REJECTS`] word (the count lives in its high half).
pub(crate) const ONE_REJECTION: u64 = 1 << 32;

/// Attempts a reader makes before it uses a possibly torn (`base`, `at`) pair: a writer that
/// died between its two stores must not stop every other process's requests.
const SEQLOCK_TRIES: u32 = 64;

/// Packs (`inflow`, `demand`) into the `rates` word. `f32` keeps 24 bits: plenty for rates
/// that only steer an estimate.
pub(crate) fn pack_rates(inflow: f64, demand: f64) -> u64 {
    let clean = |x: f64| if x.is_finite() && x > 0.0 { x as f32 } else { 0.0 };
    u64::from(clean(inflow).to_bits()) | u64::from(clean(demand).to_bits()) << 32
}

/// Unpacks the `rates` word into (`inflow`, `demand`).
#[inline]
pub(crate) fn unpack_rates(r: u64) -> (f64, f64) {
    let f = |b: u32| {
        let x = f32::from_bits(b) as f64;
        if x.is_finite() && x > 0.0 {
            x
        } else {
            0.0
        }
    };
    (f(r as u32), f((r >> 32) as u32))
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

    /// The fill estimate in milli-units at `now` (the formula is in [`crate::Limiter`]'s
    /// docs). `fresh` is false while no root answers: then nothing is extrapolated.
    #[inline]
    pub fn estimate(&self, now: u64, fresh: bool, horizon: u64) -> f64 {
        let (base, at) = self.read_base();
        let local = self.get(LOCAL).saturating_add(self.get(INFLIGHT)) as f64;
        if at == 0 {
            // Never synced nor anchored: no time reference to drain from.
            return local;
        }
        let inflow = if fresh { unpack_rates(self.get(RATES)).0 } else { 0.0 };
        let limit = self.get(LIMIT) as f64;
        let dt = now.saturating_sub(at);
        let (inside, outside) = if dt <= horizon { (dt, 0) } else { (horizon, dt - horizon) };
        let drain = ((limit - inflow) * inside as f64 + limit * outside as f64) * 1e-9;
        // The bucket drains what this limiter added since as well: draining only the synced
        // part counted a lone busy host's own traffic twice (once as `local`, once as the
        // cluster it stood for) and rejected it under the limit (docs/accuracy.md).
        (base as f64 + local - drain).max(0.0)
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

    fn slot() -> Box<[AtomicU64; SLOT_WORDS]> {
        Box::new(std::array::from_fn(|_| AtomicU64::new(0)))
    }

    #[test]
    fn rates_pack_and_unpack() {
        assert_eq!(unpack_rates(pack_rates(1500.0, 3e12)), (1500.0, 3e12f32 as f64));
        assert_eq!(unpack_rates(pack_rates(f64::NAN, -1.0)), (0.0, 0.0));
        assert_eq!(unpack_rates(u64::MAX), (0.0, 0.0), "garbage bits read as no rate");
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
