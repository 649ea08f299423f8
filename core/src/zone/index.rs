//! The name index: open addressing with linear probing, split into shards so that a shard
//! full of deleted entries can be rebuilt beside the live one and switched in atomically.
//!
//! An entry is half a word: 0 = empty, [`TOMB`] = deleted, otherwise the name's tag (the
//! hash's top 8 bits) in the high 8 bits and slot + 1 in the low 24 ([`MAX_QUOTAS`]). Half
//! a word rather than a word because a lookup's first cache miss is its index entry: at
//! 1M quotas the index is 6.6 MB instead of 13.3, so more of it stays in the last-level
//! cache (an 8-bit tag sends one probe in 256 to a slot that is not the one, a miss that
//! lookups of present names rarely pay: their probe ends at the first match, ~1.5 entries).
//! A name's hash picks its shard (bits 32..42) and its home position in the shard's area
//! (the low 32 bits, scaled to the capacity). The shard directory word holds the shard's
//! area and its live and deleted entry counts.
//!
//! Readers probe without locks and confirm a candidate by comparing the slot's name, so a
//! reader that raced with the writer can at worst miss a name for one lookup (the request
//! passes, as for an unknown name), never take another quota's slot. The writer reuses
//! deleted entries on insert; when a quarter of a shard is deleted entries it copies the
//! live ones into a spare area, switches the directory word, and keeps the old area as a
//! spare for at least [`GRACE_NS`] so readers still inside it finish. A shard at capacity
//! whose spares are all resting takes new names into empty entries down to the last 1/32,
//! then refuses them (the quota counts as missing) rather than leave probes without an end.

use super::{hdr, Layout, MAX_QUOTAS, SPARE_AREAS};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// A deleted entry (no live entry: slot + 1 stays below `0xFF_FFFF`).
pub(crate) const TOMB: u32 = u32::MAX;

const _: () = assert!(MAX_QUOTAS < 0xFF_FFFF);

pub(super) fn entry(tag: u8, slot: u32) -> u32 {
    u32::from(tag) << 24 | (slot + 1)
}
/// How long a retired area stays untouched before it is reused. A probe takes well under a
/// microsecond; a reader descheduled in the middle of one for longer can at worst miss.
pub(crate) const GRACE_NS: u64 = 200_000_000;

pub(crate) fn pack_dir(area: u32, live: u32, tombs: u32) -> u64 {
    u64::from(area) & 0xFFFF | (u64::from(live) & 0xFF_FFFF) << 16 | u64::from(tombs) << 40
}

fn unpack_dir(d: u64) -> (u32, u32, u32) {
    ((d & 0xFFFF) as u32, ((d >> 16) & 0xFF_FFFF) as u32, (d >> 40) as u32)
}

/// Where a hash lives.
#[derive(Clone, Copy)]
pub(crate) struct Spot {
    pub shard: usize,
    pub tag: u8,
    pub home: u32,
}

#[derive(Clone, Copy)]
pub(crate) struct Index<'a> {
    w: &'a [AtomicU64],
    dir: usize,
    base: usize,
    shards: u32,
    cap: u32,
}

/// Why an insert failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ShardFull;

impl<'a> Index<'a> {
    pub fn new(w: &'a [AtomicU64], l: &Layout) -> Self {
        Index { w, dir: l.dir, base: l.index, shards: l.shards, cap: l.shard_cap }
    }

    #[inline]
    pub fn spot(&self, h: u64) -> Spot {
        let hi = (h >> 32) as u32;
        Spot {
            shard: (hi & (self.shards - 1)) as usize,
            tag: (hi >> 24) as u8,
            home: ((u64::from(h as u32) * u64::from(self.cap)) >> 32) as u32,
        }
    }

    /// The words of an area (the capacity is even: two entries per word).
    #[inline]
    fn area(&self, area: u32) -> Option<&'a [AtomicU64]> {
        let half = self.cap as usize / 2;
        let at = self.base + area as usize * half;
        self.w.get(at..at + half)
    }

    #[inline]
    fn load(words: &[AtomicU64], pos: usize, order: std::sync::atomic::Ordering) -> u32 {
        (words[pos / 2].load(order) >> (pos % 2 * 32)) as u32
    }

    /// Writes one entry and keeps its neighbour. A read-modify-write even though there is
    /// one writer: a second one by mistake can then only spoil its own entry.
    fn store(words: &[AtomicU64], pos: usize, e: u32) {
        let shift = pos % 2 * 32;
        let _ = words[pos / 2].fetch_update(Release, Relaxed, |w| {
            Some(w & !(0xFFFF_FFFF << shift) | u64::from(e) << shift)
        });
    }

    #[inline]
    fn dir_word(&self, shard: usize) -> &AtomicU64 {
        &self.w[self.dir + shard]
    }

    /// Slots whose entry carries this hash's tag, in probe order, until an empty entry:
    /// `accept` decides (name comparison) and ends the probe.
    #[inline]
    pub fn find(&self, h: u64, mut accept: impl FnMut(u32) -> bool) -> Option<u32> {
        let spot = self.spot(h);
        let (area, _, _) = unpack_dir(self.dir_word(spot.shard).load(Acquire));
        let words = self.area(area)?;
        let cap = self.cap as usize;
        let mut pos = spot.home as usize;
        for _ in 0..cap {
            let e = Self::load(words, pos, Acquire);
            if e == 0 {
                return None;
            }
            if e != TOMB && (e >> 24) as u8 == spot.tag {
                let s = (e & 0xFF_FFFF).wrapping_sub(1);
                if accept(s) {
                    return Some(s);
                }
            }
            pos += 1;
            if pos == cap {
                pos = 0;
            }
        }
        None
    }

    /// Adds an entry for `slot` under hash `h` (the caller knows the name is absent).
    /// `rehash` gives the hash of any slot's name, for a rebuild.
    pub fn insert(
        &self,
        h: u64,
        slot: u32,
        now: u64,
        rehash: &dyn Fn(u32) -> u64,
    ) -> Result<(), ShardFull> {
        let spot = self.spot(h);
        let (_, live, tombs) = unpack_dir(self.dir_word(spot.shard).load(Relaxed));
        // Capacity: a tenth of the shard stays free so probes stay short. Past that, deleted
        // entries are rebuilt away when a spare area is ready; until then new entries may use
        // empty ones down to the last 1/32, and probes always end at an empty entry.
        let max = self.cap - self.cap / 10 - 1;
        let hard = self.cap - self.cap / 32 - 1;
        if live >= max {
            return Err(ShardFull);
        }
        if live + tombs >= max && tombs >= self.cap / 32 {
            // Worth a spare area: a third of the free tenth is deleted entries.
            self.rebuild(spot.shard, now, rehash);
        }
        let (area, live, tombs) = unpack_dir(self.dir_word(spot.shard).load(Relaxed));
        let words = self.area(area).ok_or(ShardFull)?;
        let mut pos = spot.home as usize;
        let mut target = None;
        for _ in 0..self.cap {
            let e = Self::load(words, pos, Relaxed);
            if e == TOMB {
                target = Some((pos, true));
                break;
            }
            if e == 0 {
                target = Some((pos, false));
                break;
            }
            pos = (pos + 1) % self.cap as usize;
        }
        let Some((pos, was_tomb)) = target else { return Err(ShardFull) };
        if !was_tomb && live + tombs >= hard {
            return Err(ShardFull);
        }
        Self::store(words, pos, entry(spot.tag, slot));
        let tombs = if was_tomb { tombs - 1 } else { tombs };
        self.dir_word(spot.shard).store(pack_dir(area, live + 1, tombs), Release);
        Ok(())
    }

    /// Removes `slot`'s entry under hash `h`; `false` if there was none.
    pub fn remove(&self, h: u64, slot: u32, now: u64, rehash: &dyn Fn(u32) -> u64) -> bool {
        let spot = self.spot(h);
        let (area, live, tombs) = unpack_dir(self.dir_word(spot.shard).load(Relaxed));
        let Some(words) = self.area(area) else { return false };
        let want = entry(spot.tag, slot);
        let mut pos = spot.home as usize;
        for _ in 0..self.cap {
            let e = Self::load(words, pos, Relaxed);
            if e == 0 {
                return false;
            }
            if e == want {
                Self::store(words, pos, TOMB);
                let (live, tombs) = (live.saturating_sub(1), tombs + 1);
                self.dir_word(spot.shard).store(pack_dir(area, live, tombs), Release);
                if tombs > self.cap / 4 {
                    self.rebuild(spot.shard, now, rehash);
                }
                return true;
            }
            pos = (pos + 1) % self.cap as usize;
        }
        false
    }

    /// Copies a shard's live entries into a spare area that has rested for [`GRACE_NS`] and
    /// switches to it; does nothing if none has.
    fn rebuild(&self, shard: usize, now: u64, rehash: &dyn Fn(u32) -> u64) {
        let spares = hdr::SPARES..hdr::SPARES + 2 * SPARE_AREAS;
        let Some(k) = spares.step_by(2).find(|&k| {
            let area = self.w[k].load(Relaxed);
            let retired = self.w[k + 1].load(Relaxed);
            area != 0 && (retired == 0 || now.saturating_sub(retired) >= GRACE_NS)
        }) else {
            return;
        };
        let new_area = (self.w[k].load(Relaxed) - 1) as u32;
        let (old_area, _, _) = unpack_dir(self.dir_word(shard).load(Relaxed));
        let (Some(new), Some(old)) = (self.area(new_area), self.area(old_area)) else { return };
        let cap = self.cap as usize;
        for cell in new {
            cell.store(0, Relaxed);
        }
        let mut live = 0;
        for i in 0..cap {
            let e = Self::load(old, i, Relaxed);
            if e == 0 || e == TOMB {
                continue;
            }
            let slot = (e & 0xFF_FFFF).wrapping_sub(1);
            let home = self.spot(rehash(slot)).home as usize;
            let mut pos = home;
            while Self::load(new, pos, Relaxed) != 0 {
                pos = (pos + 1) % cap;
            }
            Self::store(new, pos, e);
            live += 1;
        }
        self.dir_word(shard).store(pack_dir(new_area, live, 0), Release);
        self.w[k].store(u64::from(old_area) + 1, Relaxed);
        self.w[k + 1].store(now.max(1), Relaxed);
        self.w[hdr::REBUILDS].fetch_add(1, Relaxed);
    }

    #[cfg(test)]
    pub fn scan(&self, shard: usize) -> (u32, u32) {
        let (area, _, _) = unpack_dir(self.dir_word(shard).load(Relaxed));
        let words = self.area(area).unwrap();
        let mut live = 0;
        let mut tombs = 0;
        for i in 0..self.cap as usize {
            match Self::load(words, i, Relaxed) {
                0 => {}
                TOMB => tombs += 1,
                _ => live += 1,
            }
        }
        (live, tombs)
    }

    /// Live and deleted entries of a shard (for tests and statistics).
    #[cfg(test)]
    pub fn counts(&self, shard: usize) -> (u32, u32) {
        let (_, live, tombs) = unpack_dir(self.dir_word(shard).load(Relaxed));
        (live, tombs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::{format_new, Block};

    fn hash(s: u32) -> u64 {
        // Everything in shard 0 (bits 32..42 zero) with spread homes and 7 tags: the worst
        // case for one shard's capacity, and names that share a tag.
        u64::from(s.wrapping_mul(0x9E37_79B9)) | u64::from(s % 7) << 56
    }

    #[test]
    fn insert_find_remove_and_rebuild_keep_every_live_entry() {
        let b = Block::heap(256 << 10);
        let l = format_new(&b, 0).unwrap();
        let ix = Index::new(b.words(), &l);
        let rehash = |s: u32| hash(s);
        let cap = l.shard_cap;
        let max = cap - cap / 10 - 1;
        let mut now = 10 * GRACE_NS;
        for s in 0..max {
            ix.insert(hash(s), s, now, &rehash).unwrap();
        }
        assert_eq!(ix.insert(hash(max), max, now, &rehash), Err(ShardFull));
        for s in 0..max {
            assert_eq!(ix.find(hash(s), |x| x == s), Some(s), "{s}");
        }
        for s in 0..max {
            assert!(ix.remove(hash(s), s, now, &rehash));
        }
        // A shard at the load a full zone gives it (slots are sized for 2/3 of each shard),
        // under churn: a third of it replaced per second, for a minute.
        let load = cap * 2 / 3;
        let mut live: Vec<u32> = (max..max + load).collect();
        for &s in &live {
            ix.insert(hash(s), s, now, &rehash).unwrap();
        }
        for (op, next) in (0..20 * load).zip(max + load..) {
            if op % (load / 24).max(1) == 0 {
                now += GRACE_NS / 8;
            }
            let k = (op as usize * 7919) % live.len();
            let s = live[k];
            assert!(ix.remove(hash(s), s, now, &rehash), "{s}");
            ix.insert(hash(next), next, now, &rehash).unwrap();
            live[k] = next;
        }
        let (n, tombs) = ix.counts(0);
        assert_eq!((n, tombs), ix.scan(0), "the directory counts what the area holds");
        assert_eq!(n, load);
        assert!(n + tombs < max, "{tombs}");
        assert!(b.words()[hdr::REBUILDS].load(Relaxed) > 0);
        for &s in &live {
            assert_eq!(ix.find(hash(s), |x| x == s), Some(s), "{s}");
        }
    }

    #[test]
    fn the_highest_slot_and_tag_are_not_the_deleted_mark_and_halves_stay_apart() {
        let b = Block::heap(256 << 10);
        let l = format_new(&b, 0).unwrap();
        let ix = Index::new(b.words(), &l);
        let rehash = |_: u32| unreachable!("no rebuild here");
        // Tag 0xFF, shard 0, home on the last entry (the high half of the area's last word),
        // so the second name wraps to the first word's low half.
        let h = (0xFF00_0000u64 << 32) | 0xFFFF_FFFF;
        assert_eq!(ix.spot(h).home, l.shard_cap - 1);
        // Another name on the low half of that word.
        let cap = u64::from(l.shard_cap);
        let g = (0x0200_0000u64 << 32) | ((cap - 2) << 32).div_ceil(cap);
        assert_eq!(ix.spot(g).home, l.shard_cap - 2);
        ix.insert(g, 11, 0, &rehash).unwrap();
        let top = MAX_QUOTAS - 1;
        ix.insert(h, top, 0, &rehash).unwrap();
        ix.insert(h, 5, 0, &rehash).unwrap();
        assert_eq!(ix.find(h, |s| s == top), Some(top));
        assert_eq!(ix.find(h, |s| s == 5), Some(5));
        assert_eq!(ix.counts(0), (3, 0));
        assert!(ix.remove(h, top, 0, &rehash));
        assert_eq!(ix.find(h, |s| s == top), None);
        assert_eq!(ix.find(h, |s| s == 5), Some(5), "the probe goes on past a deleted entry");
        assert_eq!(ix.scan(0), (2, 1));
        // The neighbours in the same words are untouched by these writes.
        let other = (0x0100_0000u64 << 32) | 0x8000_0000;
        ix.insert(other, 7, 0, &rehash).unwrap();
        ix.insert(h, 9, 0, &rehash).unwrap();
        assert_eq!(ix.scan(0), (4, 0), "the insert took the deleted entry back");
        for (hash, s) in [(h, 5), (h, 9), (other, 7), (g, 11)] {
            assert_eq!(ix.find(hash, |x| x == s), Some(s), "{s}");
        }
    }

    #[test]
    fn without_a_rested_spare_the_shard_refuses_rather_than_fill_up() {
        let b = Block::heap(256 << 10);
        let l = format_new(&b, 0).unwrap();
        let ix = Index::new(b.words(), &l);
        let rehash = |s: u32| hash(s);
        let cap = l.shard_cap;
        let max = cap - cap / 10 - 1;
        let now = GRACE_NS;
        for s in 0..max {
            ix.insert(hash(s), s, now, &rehash).unwrap();
        }
        // Churn without time passing: every spare gets used once and needs its rest.
        let mut refused = 0;
        for s in 0..max {
            ix.remove(hash(s), s, now, &rehash);
            if ix.insert(hash(max + s), max + s, now, &rehash).is_err() {
                refused += 1;
            }
        }
        let (live, tombs) = ix.counts(0);
        assert!(refused > 0);
        assert!(live + tombs < cap, "an empty entry always remains: {live} + {tombs} of {cap}");
    }
}
