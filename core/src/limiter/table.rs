//! Storage behind the limiter: fixed-address slots of atomics, and a sharded copy-on-write
//! name index.
//!
//! # Memory layout (the 150-bytes-per-quota budget)
//!
//! * A [`Slot`] is 96 bytes of atomics: quota numbers, parent link and counter state. Slots
//!   live in chunks of 4096 that never move, so a reader holds a plain `&Slot` and the writer
//!   updates numbers in place.
//! * Names live once, in the index: each of [`SHARDS`] shards keeps a byte arena of
//!   length-prefixed names and a `hashbrown` table of 8-byte entries (slot, name offset).
//!   About 8 bytes of table plus the name's own bytes per quota.
//! * The writer's id→slot table adds about 8 bytes.
//!
//! # Concurrency
//!
//! Readers never lock. A shard is an `ArcSwap` snapshot, replaced whole by the single writer
//! (cloning one shard is ~1/1024 of the index). Counter state is in atomics; the synced base
//! and its timestamp form a pair, read through a seqlock so a reader never combines a new
//! value with an old time.

use arc_swap::ArcSwap;
use hashbrown::HashTable;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

/// Number of index shards (a power of two).
pub(crate) const SHARDS: usize = 1024;
const CHUNK_SHIFT: u32 = 12;
const CHUNK: usize = 1 << CHUNK_SHIFT;
const MAX_CHUNKS: usize = 1 << 14;
/// Most slots a limiter can hold (67 million quotas).
pub(crate) const MAX_SLOTS: u32 = (CHUNK * MAX_CHUNKS) as u32;

/// One quota and its counter. All fields are atomics; `id == 0` marks a free slot.
#[derive(Default, Debug)]
pub(crate) struct Slot {
    pub id: AtomicU64,
    /// The upper half of the name's hash: picks the index shard and double-checks lookups.
    pub name_tag: AtomicU32,
    pub epoch: AtomicU64,
    /// milli-units per second
    pub limit: AtomicU64,
    /// milli-units
    pub low: AtomicU64,
    /// milli-units
    pub high: AtomicU64,
    /// Parent's slot index + 1; 0 = no parent.
    pub parent: AtomicU32,
    /// Seqlock over (`base`, `at`): odd while the writer is storing them.
    seq: AtomicU32,
    /// Cluster fill (max over roots), milli-units, as of `at`.
    base: AtomicU64,
    /// ns
    at: AtomicU64,
    /// Locally accounted, not yet handed to a sync round, milli-units.
    pub local: AtomicU64,
    /// Locally refused weight not yet handed to a sync round, milli-units.
    pub rejected: AtomicU64,
    /// Two `f32`s in milli-units/s, written together by the writer: the low half is what the
    /// rest of the cluster is estimated to add (`inflow`, 0 for a cold counter), the high half
    /// the cluster-wide attempted demand as last reported.
    pub rates: AtomicU64,
}

/// Packs (`inflow`, `demand`) into [`Slot::rates`]. `f32` keeps 24 bits: plenty for rates
/// that only steer an estimate.
pub(crate) fn pack_rates(inflow: f64, demand: f64) -> u64 {
    let clean = |x: f64| if x.is_finite() && x > 0.0 { x as f32 } else { 0.0 };
    u64::from(clean(inflow).to_bits()) | u64::from(clean(demand).to_bits()) << 32
}

/// Unpacks [`Slot::rates`] into (`inflow`, `demand`).
#[inline]
pub(crate) fn unpack_rates(r: u64) -> (f64, f64) {
    (f32::from_bits(r as u32) as f64, f32::from_bits((r >> 32) as u32) as f64)
}

impl Slot {
    /// Reads (`base`, `at`) consistently.
    #[inline]
    pub fn read_base(&self) -> (u64, u64) {
        loop {
            let s1 = self.seq.load(Acquire);
            if s1 & 1 == 0 {
                let base = self.base.load(Relaxed);
                let at = self.at.load(Relaxed);
                fence(Acquire);
                if self.seq.load(Relaxed) == s1 {
                    return (base, at);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Stores (`base`, `at`). Only the limiter's writer (holding its lock) calls this.
    pub fn write_base(&self, base: u64, at: u64) {
        let s = self.seq.load(Relaxed);
        self.seq.store(s.wrapping_add(1), Relaxed);
        fence(Release);
        self.base.store(base, Relaxed);
        self.at.store(at, Relaxed);
        self.seq.store(s.wrapping_add(2), Release);
    }

    /// The fill estimate in milli-units at `now` (see [`crate::Limiter`] for the formula).
    /// `fresh` is false while no root answers: then nothing is extrapolated.
    #[inline]
    pub fn estimate(&self, now: u64, fresh: bool, horizon: u64) -> f64 {
        let (base, at) = self.read_base();
        let local = self.local.load(Relaxed) as f64;
        if at == 0 {
            // Never synced nor anchored: no time reference to drain from.
            return local;
        }
        let inflow =
            if fresh { f32::from_bits(self.rates.load(Relaxed) as u32) as f64 } else { 0.0 };
        let limit = self.limit.load(Relaxed) as f64;
        let dt = now.saturating_sub(at);
        let (inside, outside) = if dt <= horizon { (dt, 0) } else { (horizon, dt - horizon) };
        let drain = ((limit - inflow) * inside as f64 + limit * outside as f64) * 1e-9;
        // The bucket drains what this limiter added since as well: draining only the synced
        // part counted a lone busy host's own traffic twice (once as `local`, once as the
        // cluster it stood for) and rejected it under the limit (docs/accuracy.md).
        (base as f64 + local - drain).max(0.0)
    }
}

/// Fixed-address slot storage: chunks allocated on first use, never moved or freed.
pub(crate) struct Slots {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
}

impl Slots {
    pub fn new() -> Self {
        Slots { chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect() }
    }

    #[inline]
    pub fn get(&self, i: u32) -> Option<&Slot> {
        self.chunks.get((i >> CHUNK_SHIFT) as usize)?.get()?.get(i as usize & (CHUNK - 1))
    }

    /// The slot at `i`, allocating its chunk. `i < MAX_SLOTS`.
    pub fn ensure(&self, i: u32) -> &Slot {
        let chunk = self.chunks[(i >> CHUNK_SHIFT) as usize]
            .get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect());
        &chunk[i as usize & (CHUNK - 1)]
    }

    /// Bytes allocated for slots so far.
    pub fn allocated_bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count() * CHUNK * size_of::<Slot>()
            + self.chunks.len() * size_of::<OnceLock<Box<[Slot]>>>()
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub slot: u32,
    off: u32,
}

/// One shard of the name index: a table of entries and the arena their names live in.
#[derive(Clone, Default, Debug)]
pub(crate) struct Shard {
    table: HashTable<Entry>,
    /// Length-prefixed names.
    names: Vec<u8>,
    /// Bytes of `names` no entry points at any more.
    garbage: usize,
}

fn name_at(names: &[u8], off: u32) -> &[u8] {
    let o = off as usize;
    let len = names[o] as usize;
    &names[o + 1..o + 1 + len]
}

impl Shard {
    #[inline]
    pub fn find(&self, hash: u64, name: &[u8]) -> Option<u32> {
        self.table.find(hash, |e| name_at(&self.names, e.off) == name).map(|e| e.slot)
    }

    /// Inserts or repoints `name`. `name.len() <= 255`.
    pub fn insert(&mut self, hash: u64, name: &[u8], slot: u32, hasher: &impl Fn(&[u8]) -> u64) {
        if let Some(e) = self.table.find_mut(hash, |e| name_at(&self.names, e.off) == name) {
            e.slot = slot;
            return;
        }
        let off = self.names.len() as u32;
        self.names.push(name.len() as u8);
        self.names.extend_from_slice(name);
        let names = &self.names;
        self.table.insert_unique(hash, Entry { slot, off }, |e| hasher(name_at(names, e.off)));
    }

    pub fn remove(&mut self, hash: u64, name: &[u8]) -> Option<u32> {
        let names = &self.names;
        let found = self.table.find_entry(hash, |e| name_at(names, e.off) == name).ok()?;
        let (e, _) = found.remove();
        self.garbage += 1 + name.len();
        Some(e.slot)
    }

    /// The name of the entry pointing at `slot` (a linear scan: only for rejection messages).
    pub fn name_of_slot(&self, slot: u32) -> Option<&[u8]> {
        self.table.iter().find(|e| e.slot == slot).map(|e| name_at(&self.names, e.off))
    }

    /// A copy with room for `entries` more names of `bytes` in total.
    pub fn copy_with_room(
        &self,
        entries: usize,
        bytes: usize,
        hasher: &impl Fn(&[u8]) -> u64,
    ) -> Shard {
        let mut names = Vec::with_capacity(self.names.len() + bytes);
        names.extend_from_slice(&self.names);
        let mut table = self.table.clone();
        let old = &self.names;
        table.reserve(entries, |e| hasher(name_at(old, e.off)));
        Shard { table, names, garbage: self.garbage }
    }

    /// Rewrites the arena without garbage once garbage dominates.
    pub fn compact_if_sparse(&mut self, hasher: &impl Fn(&[u8]) -> u64) {
        if self.garbage < 1024 || self.garbage * 2 < self.names.len() {
            return;
        }
        let mut fresh = Shard::default();
        fresh.table.reserve(self.table.len(), |_| 0);
        for e in self.table.iter() {
            let name = name_at(&self.names, e.off);
            fresh.insert(hasher(name), name, e.slot, hasher);
        }
        *self = fresh;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.table.allocation_size() + self.names.capacity()
    }
}

/// The sharded index from names to slots.
pub(crate) struct Index {
    pub shards: Box<[ArcSwap<Shard>]>,
}

impl Index {
    pub fn new() -> Self {
        Index { shards: (0..SHARDS).map(|_| ArcSwap::from_pointee(Shard::default())).collect() }
    }

    /// The shard a hash belongs to. hashbrown takes low bits for the bucket and the top 7 for
    /// its tag, so the shard number comes from the middle.
    #[inline]
    pub fn shard_of(hash: u64) -> usize {
        (hash >> 32) as usize & (SHARDS - 1)
    }

    /// Replaces a shard. Copies are exact-sized: a table of a million quotas is cloned shard
    /// by shard for every batch of changes, and growth slack would stay for good.
    pub fn publish(&self, shard: usize, mut s: Shard, hasher: &impl Fn(&[u8]) -> u64) {
        s.names.shrink_to_fit();
        let names = &s.names;
        s.table.shrink_to_fit(|e| hasher(name_at(names, e.off)));
        self.shards[shard].store(Arc::new(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn slot_is_96_bytes() {
        assert_eq!(size_of::<Slot>(), 96);
    }

    #[test]
    fn rates_pack_and_unpack() {
        assert_eq!(unpack_rates(pack_rates(1500.0, 3e12)), (1500.0, 3e12f32 as f64));
        assert_eq!(unpack_rates(pack_rates(f64::NAN, -1.0)), (0.0, 0.0));
    }

    #[test]
    fn shard_insert_find_remove_compact() {
        let st = foldhash::fast::FixedState::with_seed(1);
        let h = |n: &[u8]| st.hash_one(n);
        let mut s = Shard::default();
        for i in 0..3000u32 {
            let n = format!("quota-{i}");
            s.insert(h(n.as_bytes()), n.as_bytes(), i, &h);
        }
        assert_eq!(s.find(h(b"quota-42"), b"quota-42"), Some(42));
        assert_eq!(s.name_of_slot(42), Some(&b"quota-42"[..]));
        for i in 0..2500u32 {
            let n = format!("quota-{i}");
            assert_eq!(s.remove(h(n.as_bytes()), n.as_bytes()), Some(i));
        }
        assert_eq!(s.find(h(b"quota-42"), b"quota-42"), None);
        let before = s.names.len();
        s.compact_if_sparse(&h);
        assert!(s.names.len() < before / 4, "{} vs {before}", s.names.len());
        assert_eq!(s.len(), 500);
        assert_eq!(s.find(h(b"quota-2999"), b"quota-2999"), Some(2999));
    }

    #[test]
    fn seqlock_pair_roundtrip() {
        let s = Slot::default();
        s.write_base(5, 7);
        assert_eq!(s.read_base(), (5, 7));
        s.write_base(9, 11);
        assert_eq!(s.read_base(), (9, 11));
    }
}
