//! The limiter's memory: one fixed block of 64-bit atomic words holding every quota, counter,
//! name, index entry and the sync engine's persistent state.
//!
//! Everything inside the block refers to everything else by **offsets, never pointers**, and
//! every access is an atomic load or store, so the same block can be a heap buffer (an
//! application, a test) or an nginx shared-memory zone that every worker maps, survives
//! `nginx -s reload`, and is read by workers while one sync agent writes (SPEC §3, "One
//! limiter per nginx"). The crate stays free of `unsafe`: the embedder hands over a slice of
//! `AtomicU64` ([`Block`]), and all reads are bounds-checked, so even a block written by a
//! different layout can only give wrong numbers, never a crash.
//!
//! # Layout
//!
//! | region | words | what |
//! |---|---|---|
//! | header | 640 | magic, layout version, sizes, limiter identity, epoch, sync sequence numbers, allocator heads, agent lease; 64 lanes of 8 embedder counters |
//! | roots | 64 × 64 | per root: instance, `since`, acknowledged `seq`, health (see [`roots`]) |
//! | recent rejections | 2048 | a ring of (slot, second) of the latest rejections |
//! | shard directory | 1024 | per index shard: its current area, live and deleted entry counts |
//! | dirty bitmap | 1 bit per slot | slots with counts not yet taken by a sync round |
//! | cold | 2 per slot | epoch; parent name while the parent is unknown (or, when free, the next free slot) |
//! | slots | 16 per slot, 128-byte aligned | one quota and its counter ([`slot`]) |
//! | index | (shards + 4) × shard capacity / 2 | open-addressing name index, 32-bit entries ([`index`]) |
//! | arena | ~2 per slot | name tails beyond 23 bytes, unresolved parent names ([`arena`]) |
//!
//! At about 166 bytes per quota (names up to 23 bytes; 8 bytes more per further 8), a 32 MiB
//! zone holds about 200,000 quotas and 1,000,000 quotas need about 160 MiB.
//!
//! # Who writes what
//!
//! * Request paths (any thread of any process) only add to a slot's `local`/`rejected`
//!   counters, set its dirty bit, and bump statistics counters: atomic read-modify-writes.
//! * One writer at a time (the sync agent, holding the process's writer lock and, across
//!   processes, the agent lease in the header) changes quotas, names, the index, allocator
//!   state and synced counter bases. Readers never wait for it: they validate what they read
//!   (the slot's name and id, a seqlock around the synced base).

pub(crate) mod arena;
pub(crate) mod index;
pub mod roots;
pub(crate) mod slot;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

/// `b"YARLZONE"`: the first word of a formatted block.
pub const MAGIC: u64 = u64::from_le_bytes(*b"YARLZONE");

/// Version of the layout described in this module. A block formatted by another version is
/// formatted again, never read (bump it with any change to the layout, the name hash or the
/// meaning of a field).
pub const LAYOUT_VERSION: u64 = 2;

/// Words of one slot (128 bytes).
pub(crate) const SLOT_WORDS: usize = 16;
/// Words of one slot's cold entry.
pub(crate) const COLD_WORDS: usize = 2;
/// Roots the block keeps state for.
pub const MAX_ROOTS: usize = 64;
/// Words per root entry.
pub(crate) const ROOT_WORDS: usize = 64;
/// Most index shards.
pub(crate) const MAX_SHARDS: usize = 1024;
/// Index areas beyond one per shard, for rebuilding a shard beside the live one.
pub(crate) const SPARE_AREAS: usize = 4;
/// Header words.
pub(crate) const HEADER_WORDS: usize = 128 + AUX_LANES * AUX_COUNTERS;
/// Embedder counters per lane ([`crate::Limiter::aux_counter`]): one cache line.
pub const AUX_COUNTERS: usize = 8;
/// Lanes of embedder counters: writers in different processes use different lanes, so
/// counting a request never bounces a cache line between CPUs.
pub const AUX_LANES: usize = 64;
/// Fewest quotas a block must hold to be usable.
pub const MIN_QUOTAS: u32 = 64;
/// Most quotas a block can hold: an index entry keeps slot + 1 in 24 bits, and all ones is
/// the deleted mark (about 2.7 GiB of zone; a larger zone leaves the rest unused).
pub const MAX_QUOTAS: u32 = (1 << 24) - 2;
/// Entries of the ring of recent rejections (which quota, when): enough to rank the quotas
/// that reject most right now without a per-quota time series.
pub(crate) const RECENT_REJECTIONS: usize = 2048;
/// Arena words reserved per slot (name tails and unresolved parents).
const ARENA_WORDS_PER_SLOT: u64 = 2;

/// Header word indices.
pub(crate) mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const WORDS: usize = 2;
    pub const SLOT_CAP: usize = 3;
    pub const SHARDS: usize = 4;
    pub const SHARD_CAP: usize = 5;
    pub const ARENA_WORDS: usize = 6;
    pub const SLOTS_AT: usize = 7;
    pub const SEED: usize = 8;
    pub const LIMITER_ID: usize = 9;
    /// Bumped every time the block is prepared again (an nginx reload reusing the zone).
    pub const GENERATION: usize = 10;

    pub const EPOCH: usize = 16;
    pub const QUOTAS: usize = 17;
    pub const REJECTIONS: usize = 18;
    pub const FRESH: usize = 19;
    pub const LOCAL_SINCE: usize = 20;
    pub const NEXT_SEQ: usize = 21;
    pub const INFLIGHT_SEQ: usize = 22;
    pub const ROUNDS: usize = 23;
    pub const NEXT_SLOT: usize = 24;
    pub const FREE_HEAD: usize = 25;
    pub const FREE_TAIL: usize = 26;
    pub const FREE_COUNT: usize = 27;
    pub const ARENA_BUMP: usize = 28;
    pub const ARENA_FREE_WORDS: usize = 29;
    pub const MISSING: usize = 30;
    pub const REBUILDS: usize = 31;
    pub const AGENT: usize = 32;
    pub const AGENT_STARTS: usize = 34;
    pub const LAST_REFETCH: usize = 35;
    pub const LAST_ROUND_END: usize = 36;
    /// Random token of the handle whose writer caches match the block (see
    /// `limiter/writer.rs`).
    pub const WRITER: usize = 37;
    /// Next entry of the ring of recent rejections.
    pub const RECENT_HEAD: usize = 38;
    /// Highest quota epoch ever applied (EPOCH goes back to 0 for a refetch, this never).
    pub const EPOCH_SEEN: usize = 39;
    /// Non-zero when a request path saw its own traffic run well ahead of what it counted
    /// in its last interval: the sync agent starts a round early.
    pub const URGENT: usize = 40;
    /// Early rounds started.
    pub const EARLY_ROUNDS: usize = 41;
    /// When the current round began: `local` counts from then.
    pub const ROUND_BEGAN: usize = 42;
    /// `SPARE_AREAS` pairs: (area + 1, time it was retired).
    pub const SPARES: usize = 48;
    /// Free-list heads of the arena, by record size in words (index = size).
    pub const ARENA_FREE: usize = 64;
    /// `AUX_LANES` lanes of `AUX_COUNTERS` words, each lane on its own cache line.
    pub const AUX: usize = 128;
}

/// A block of memory for a limiter: a heap buffer or memory the embedder owns (an nginx
/// shared-memory zone). Cloning shares the same memory.
#[derive(Clone)]
pub struct Block(Arc<Mem>);

enum Mem {
    Heap(Box<[AtomicU64]>),
    Borrowed(&'static [AtomicU64]),
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &*self.0 {
            Mem::Heap(_) => "heap",
            Mem::Borrowed(_) => "borrowed",
        };
        f.debug_struct("Block").field("kind", &kind).field("bytes", &self.bytes()).finish()
    }
}

impl Block {
    /// A zeroed heap block of `bytes` (rounded up to whole words). Pages are only backed by
    /// memory once used.
    pub fn heap(bytes: usize) -> Block {
        Block(Arc::new(Mem::Heap(bytemuck::zeroed_slice_box(bytes.div_ceil(8)))))
    }

    /// A heap block just large enough for `quotas` quotas (at least [`MIN_QUOTAS`]).
    pub fn for_quotas(quotas: u32) -> Block {
        Block::heap(bytes_for_quotas(quotas))
    }

    /// Memory owned by the embedder, e.g. a shared-memory zone mapped at the same address in
    /// every process that uses it.
    pub fn borrowed(words: &'static [AtomicU64]) -> Block {
        Block(Arc::new(Mem::Borrowed(words)))
    }

    /// The words.
    #[inline]
    pub fn words(&self) -> &[AtomicU64] {
        match &*self.0 {
            Mem::Heap(b) => b,
            Mem::Borrowed(s) => s,
        }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.words().len() * 8
    }

    fn is_heap(&self) -> bool {
        matches!(&*self.0, Mem::Heap(_))
    }

    /// Whether two handles share the same memory.
    pub fn same(&self, other: &Block) -> bool {
        std::ptr::eq(self.words().as_ptr(), other.words().as_ptr())
    }
}

/// Why a block cannot hold a limiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZoneError {
    /// The block cannot hold even [`MIN_QUOTAS`] quotas.
    #[error("{bytes} bytes hold fewer than {MIN_QUOTAS} quotas; at least {min_bytes} are needed")]
    TooSmall {
        /// Size given.
        bytes: usize,
        /// Smallest usable size.
        min_bytes: usize,
    },
    /// The block has not been prepared with [`prepare`] (or was prepared by another layout).
    #[error("the memory block is not a prepared limiter zone: {0}")]
    NotPrepared(String),
}

/// What [`prepare`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// The block was empty and is now formatted.
    Formatted,
    /// The block already held a limiter of this layout: it is kept as is.
    Reused,
    /// The block held something else (another layout version, another size): it was
    /// formatted again and everything in it is gone.
    Reformatted(String),
}

/// Where each region starts, in words from the start of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub words: usize,
    pub slot_cap: u32,
    pub shards: u32,
    pub shard_cap: u32,
    pub arena_words: u32,
    pub roots: usize,
    pub recent: usize,
    pub dir: usize,
    pub dirty: usize,
    pub cold: usize,
    pub slots: usize,
    pub index: usize,
    pub arena: usize,
    pub end: usize,
}

fn prev_pow2(x: u32) -> u32 {
    if x <= 1 {
        1
    } else {
        1 << (31 - x.leading_zeros())
    }
}

impl Layout {
    /// The layout of `slot_cap` slots in a block whose first word is at byte address `addr`.
    fn with_slots(words: usize, addr: usize, slot_cap: u32) -> Layout {
        let shards = prev_pow2(slot_cap / 512).min(MAX_SHARDS as u32);
        let per = slot_cap.div_ceil(shards);
        // Load at most ~2/3 when shards are balanced, plus slack for the ones that are not.
        // Even: two entries to a word, so every area starts on a word.
        let shard_cap = (per + per / 2 + 9) & !1;
        let arena_words =
            u32::try_from(u64::from(slot_cap) * ARENA_WORDS_PER_SLOT + 64).unwrap_or(u32::MAX);
        let mut at = HEADER_WORDS;
        let roots = at;
        at += MAX_ROOTS * ROOT_WORDS;
        let recent = at;
        at += RECENT_REJECTIONS;
        let dir = at;
        at += MAX_SHARDS;
        let dirty = at;
        at += (slot_cap as usize).div_ceil(64);
        let cold = at;
        at += slot_cap as usize * COLD_WORDS;
        // Slots start on a 128-byte boundary of the address space: one slot is one pair of
        // cache lines, which the adjacent-line prefetcher fetches together.
        let word_addr = addr / 8;
        while (word_addr + at) % SLOT_WORDS != 0 {
            at += 1;
        }
        let slots = at;
        at += slot_cap as usize * SLOT_WORDS;
        let index = at;
        at += (shards as usize + SPARE_AREAS) * shard_cap as usize / 2;
        let arena = at;
        at += arena_words as usize;
        Layout {
            words,
            slot_cap,
            shards,
            shard_cap,
            arena_words,
            roots,
            recent,
            dir,
            dirty,
            cold,
            slots,
            index,
            arena,
            end: at,
        }
    }

    /// The largest layout that fits `words` words at `addr`.
    pub(crate) fn fit(words: usize, addr: usize) -> Option<Layout> {
        let fits = |n: u32| Layout::with_slots(words, addr, n).end <= words;
        if !fits(MIN_QUOTAS) {
            return None;
        }
        let (mut lo, mut hi) = (MIN_QUOTAS, MAX_QUOTAS);
        if fits(hi) {
            return Some(Layout::with_slots(words, addr, hi));
        }
        // Invariant: fits(lo), !fits(hi).
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(Layout::with_slots(words, addr, lo))
    }

    fn stored(&self, w: &[AtomicU64]) -> bool {
        let get = |i: usize| w[i].load(Relaxed);
        get(hdr::WORDS) == self.words as u64
            && get(hdr::SLOT_CAP) == u64::from(self.slot_cap)
            && get(hdr::SHARDS) == u64::from(self.shards)
            && get(hdr::SHARD_CAP) == u64::from(self.shard_cap)
            && get(hdr::ARENA_WORDS) == u64::from(self.arena_words)
            && get(hdr::SLOTS_AT) == self.slots as u64
    }
}

/// Bytes a block needs to hold `quotas` quotas (names up to 23 bytes), at any address.
pub fn bytes_for_quotas(quotas: u32) -> usize {
    let n = quotas.clamp(MIN_QUOTAS, MAX_QUOTAS);
    // Room for the worst alignment of the slot region.
    (Layout::with_slots(0, 0, n).end + SLOT_WORDS) * 8
}

/// How many quotas a block of `bytes` holds (names up to 23 bytes); `None` when fewer than
/// [`MIN_QUOTAS`].
pub fn quotas_for_bytes(bytes: usize) -> Option<u32> {
    Layout::fit((bytes / 8).saturating_sub(SLOT_WORDS), 0).map(|l| l.slot_cap)
}

fn addr_of(words: &[AtomicU64]) -> usize {
    words.as_ptr() as usize
}

/// Checks a block's header: `Ok(layout)` when it holds a limiter of this layout.
pub(crate) fn validate(words: &[AtomicU64]) -> Result<Layout, String> {
    if words.len() < HEADER_WORDS {
        return Err("the block is smaller than the header".into());
    }
    let magic = words[hdr::MAGIC].load(Acquire);
    if magic == 0 {
        return Err("the block is empty".into());
    }
    if magic != MAGIC {
        return Err(format!("unknown magic {magic:#018x}"));
    }
    let version = words[hdr::VERSION].load(Relaxed);
    if version != LAYOUT_VERSION {
        return Err(format!("layout version {version}, this build reads {LAYOUT_VERSION}"));
    }
    let layout = Layout::fit(words.len(), addr_of(words))
        .ok_or_else(|| "the block is too small".to_string())?;
    if !layout.stored(words) {
        return Err("the block's size or layout differs from its header".into());
    }
    Ok(layout)
}

/// Formats `block` for a limiter unless it already holds one of this layout. Call it once
/// where the block is created (nginx: the zone's init callback in the master, with the old
/// zone on reload); every user then opens it with [`crate::LimiterBuilder::open`].
///
/// A reused block keeps its quotas, counters, limiter identity and sync state; its
/// generation is bumped so that a sync agent of the previous configuration hands over.
pub fn prepare(block: &Block) -> Result<Prepared, ZoneError> {
    let words = block.words();
    let layout = Layout::fit(words.len(), addr_of(words)).ok_or(ZoneError::TooSmall {
        bytes: block.bytes(),
        min_bytes: bytes_for_quotas(MIN_QUOTAS),
    })?;
    match validate(words) {
        Ok(_) => {
            words[hdr::GENERATION].fetch_add(1, AcqRel);
            Ok(Prepared::Reused)
        }
        Err(why) => {
            // Fresh shared memory (an anonymous mapping) is zero; only a block that held
            // something else (another layout, or an allocator's debug fill) is zeroed, so a
            // large zone does not get every index page touched at start.
            let was_empty = words[hdr::MAGIC].load(Relaxed) == 0;
            format(words, &layout, was_empty);
            Ok(if was_empty { Prepared::Formatted } else { Prepared::Reformatted(why) })
        }
    }
}

/// Formats a heap block created by [`Block::heap`] (already zero) or any block.
pub(crate) fn format_new(block: &Block) -> Result<Layout, ZoneError> {
    let words = block.words();
    let layout = Layout::fit(words.len(), addr_of(words)).ok_or(ZoneError::TooSmall {
        bytes: block.bytes(),
        min_bytes: bytes_for_quotas(MIN_QUOTAS),
    })?;
    let zeroed = block.is_heap() && words[hdr::MAGIC].load(Relaxed) == 0;
    format(words, &layout, zeroed);
    Ok(layout)
}

fn format(w: &[AtomicU64], l: &Layout, zeroed: bool) {
    w[hdr::MAGIC].store(0, Release);
    if !zeroed {
        // Slots, cold entries and arena records are written whole when allocated; everything
        // read before that must start at zero.
        let zero = |from: usize, to: usize| w[from..to].iter().for_each(|x| x.store(0, Relaxed));
        zero(0, HEADER_WORDS);
        zero(l.roots, l.dirty + (l.slot_cap as usize).div_ceil(64));
        zero(l.index, l.arena);
    }
    let set = |i: usize, v: u64| w[i].store(v, Relaxed);
    set(hdr::VERSION, LAYOUT_VERSION);
    set(hdr::WORDS, l.words as u64);
    set(hdr::SLOT_CAP, u64::from(l.slot_cap));
    set(hdr::SHARDS, u64::from(l.shards));
    set(hdr::SHARD_CAP, u64::from(l.shard_cap));
    set(hdr::ARENA_WORDS, u64::from(l.arena_words));
    set(hdr::SLOTS_AT, l.slots as u64);
    set(hdr::SEED, fastrand::u64(..));
    set(hdr::LIMITER_ID, fastrand::u64(1..));
    set(hdr::GENERATION, 1);
    set(hdr::NEXT_SEQ, 1);
    set(hdr::ARENA_BUMP, 1);
    for s in 0..l.shards {
        set(l.dir + s as usize, index::pack_dir(s, 0, 0));
    }
    for k in 0..SPARE_AREAS {
        set(hdr::SPARES + 2 * k, u64::from(l.shards) + k as u64 + 1);
        set(hdr::SPARES + 2 * k + 1, 0);
    }
    w[hdr::MAGIC].store(MAGIC, Release);
}

/// What a block holds and how full it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZoneUsage {
    /// Size of the block.
    pub bytes: u64,
    /// Bytes in use: header, tables sized for the capacity that have been touched, slots
    /// and name records allocated so far.
    pub bytes_used: u64,
    /// Most quotas it can hold (names up to 23 bytes).
    pub capacity: u64,
    /// Quotas held.
    pub quotas: u64,
    /// Slots ever allocated (held quotas plus freed slots waiting for reuse).
    pub slots_used: u64,
    /// Arena words (8 bytes) for long names.
    pub arena_words: u64,
    /// Arena words in use.
    pub arena_used: u64,
    /// Quotas a sync delivered that did not fit: they stay unlimited until the zone is
    /// enlarged (approximate: a quota updated again while missing counts again).
    pub missing: u64,
    /// Index shards rebuilt to drop deleted entries.
    pub index_rebuilds: u64,
}

pub(crate) fn usage(w: &[AtomicU64], l: &Layout) -> ZoneUsage {
    let get = |i: usize| w[i].load(Relaxed);
    let slots_used = get(hdr::NEXT_SLOT);
    let arena_used =
        get(hdr::ARENA_BUMP).saturating_sub(1).saturating_sub(get(hdr::ARENA_FREE_WORDS));
    let fixed = l.dirty + (l.slot_cap as usize).div_ceil(64);
    let index = (l.arena - l.index) as u64;
    let bytes_used = (fixed as u64
        + slots_used * (SLOT_WORDS + COLD_WORDS) as u64
        + index
        + get(hdr::ARENA_BUMP))
        * 8;
    ZoneUsage {
        bytes: w.len() as u64 * 8,
        bytes_used,
        capacity: u64::from(l.slot_cap),
        quotas: get(hdr::QUOTAS),
        slots_used,
        arena_words: u64::from(l.arena_words),
        arena_used,
        missing: get(hdr::MISSING),
        index_rebuilds: get(hdr::REBUILDS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_trip() {
        for n in [MIN_QUOTAS, 1_000, 190_000, 1_000_000] {
            let bytes = bytes_for_quotas(n);
            let got = quotas_for_bytes(bytes).unwrap();
            assert!(got >= n, "{n} quotas need {bytes} bytes, which hold {got}");
            assert!(got < n + n / 50 + 200, "{n}: {got}");
        }
        let per = bytes_for_quotas(1_000_000) as f64 / 1e6;
        assert!(per < 170.0, "{per} bytes per quota");
        assert_eq!(quotas_for_bytes(1000), None);
        let q = quotas_for_bytes(32 << 20).unwrap();
        assert!((195_000..210_000).contains(&q), "32 MiB hold {q}");
    }

    #[test]
    fn layout_regions_do_not_overlap_and_slots_are_aligned() {
        for addr in [0usize, 8, 64, 4096 + 24] {
            let l = Layout::fit(1 << 20, addr).unwrap();
            let regions = [l.roots, l.dir, l.dirty, l.cold, l.slots, l.index, l.arena, l.end];
            assert!(regions.windows(2).all(|w| w[0] <= w[1]), "{l:?}");
            assert!(l.end <= l.words);
            assert_eq!((addr / 8 + l.slots) % SLOT_WORDS, 0);
            assert!(l.dirty + (l.slot_cap as usize).div_ceil(64) <= l.cold);
            assert!(l.cold + l.slot_cap as usize * COLD_WORDS <= l.slots);
        }
    }

    #[test]
    fn prepare_formats_reuses_and_reformats() {
        let b = Block::heap(1 << 20);
        assert_eq!(prepare(&b), Ok(Prepared::Formatted));
        let id = b.words()[hdr::LIMITER_ID].load(Relaxed);
        assert_eq!(prepare(&b), Ok(Prepared::Reused));
        assert_eq!(b.words()[hdr::LIMITER_ID].load(Relaxed), id, "identity survives");
        assert_eq!(b.words()[hdr::GENERATION].load(Relaxed), 2);
        b.words()[hdr::VERSION].store(LAYOUT_VERSION + 1, Relaxed);
        match prepare(&b) {
            Ok(Prepared::Reformatted(why)) => assert!(why.contains("layout version"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_ne!(b.words()[hdr::LIMITER_ID].load(Relaxed), id, "a new limiter");
        b.words()[hdr::MAGIC].store(7, Relaxed);
        assert!(matches!(prepare(&b), Ok(Prepared::Reformatted(w)) if w.contains("magic")));
        assert!(matches!(prepare(&Block::heap(4096)), Err(ZoneError::TooSmall { .. })));
    }
}
