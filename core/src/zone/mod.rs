//! The limiter's memory: one fixed block of 64-bit atomic words holding every quota, counter,
//! name, index entry and the sync engine's persistent state.
//!
//! Everything inside the block refers to everything else by **offsets, never pointers**, and
//! every access is an atomic load or store, so the same block can be a heap buffer (an
//! application, a test) or an nginx shared-memory zone that every worker maps, survives
//! `nginx -s reload`, and is read by workers while one sync agent writes (one limiter per
//! nginx, whatever its number of workers). The crate stays free of `unsafe`: the embedder hands over a slice of
//! `AtomicU64` ([`Block`]), and all reads are bounds-checked, so even a block written by a
//! different layout can only give wrong numbers, never a crash.
//!
//! # Layout
//!
//! Offsets, sizes, validation and formatting live in `layout.rs`, pinned to
//! [`LAYOUT_VERSION`] by a golden test.
//!
//! | region | words | what |
//! |---|---|---|
//! | header | 640 | magic, layout version, sizes, limiter identity, epoch, sync sequence numbers, allocator heads, agent lease; 64 lanes of 8 embedder counters |
//! | roots | 64 × 64 | per root: instance, `since`, acknowledged `seq`, health (see [`roots`]) |
//! | recent rejections | 2048 | a ring of (slot, second) of the latest rejections |
//! | permits | 4 per entry, one entry per 8 slots (64 to 1,024) | concurrency counters: id, requests in flight, share and lease, the round's acquires |
//! | ledger | 64 rows of 1 + entries / 2 | per process: its pid, then what it holds of each permit entry (32 bits each) |
//! | permit slots | 2 per permit entry | the entry's quota slot + 1 and max_in_flight (its name and cap, for figures), its refusals (deleted: the id it had) |
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
pub mod keys;
mod layout;
pub mod roots;
pub(crate) mod slot;

use layout::{addr_of, format};
pub use layout::{
    bytes_for, quotas_for_bytes, AUX_COUNTERS, AUX_LANES, BYTES_PER_KEY, LAYOUT_VERSION,
    LEDGER_ROWS, MAGIC, MAX_KEYS, MAX_QUOTAS, MAX_ROOTS, MIN_QUOTAS, PERMIT_ENTRIES,
    TEMPLATE_STATS,
};
pub(crate) use layout::{
    hdr, ledger_row_words, validate, Layout, NameHasher, COLD_WORDS, OVERRIDE_BITS,
    PERMIT_ENTRY_WORDS, RECENT_REJECTIONS, ROOT_WORDS, SLOT_WORDS, SPARE_AREAS, TSTAT_WORDS,
};

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

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

    /// A heap block just large enough for `quotas` quotas (at least [`MIN_QUOTAS`]) and no
    /// keys.
    pub fn for_quotas(quotas: u32) -> Block {
        Block::for_capacity(quotas, 0)
    }

    /// A heap block just large enough for `quotas` quotas (at least [`MIN_QUOTAS`]) and
    /// `keys` keys (names under templates).
    pub fn for_capacity(quotas: u32, keys: u32) -> Block {
        Block::heap(bytes_for(quotas, keys))
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
    /// The block cannot hold even [`MIN_QUOTAS`] quotas beside its keys.
    #[error(
        "{bytes} bytes hold fewer than {MIN_QUOTAS} quotas beside the keys; at least \
         {min_bytes} are needed"
    )]
    TooSmall {
        /// Size given.
        bytes: usize,
        /// Smallest usable size.
        min_bytes: usize,
    },
    /// The block is mapped by processes that use it ([`prepare_reused`]) and would have to
    /// be formatted again.
    #[error("the running workers use it, and it cannot be formatted again under them ({0})")]
    InUse(String),
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

/// Formats `block` for a limiter unless it already holds one of this layout. Call it once
/// where the block is created (nginx: the zone's init callback in the master, with the old
/// zone on reload); every user then opens it with [`crate::LimiterBuilder::open`].
///
/// A reused block keeps its quotas, counters, limiter identity and sync state; its
/// generation is bumped so that a sync agent of the previous configuration hands over.
/// `keys` is how many keys (names under templates) the key table holds; a block with
/// another number is formatted again.
pub fn prepare(block: &Block, keys: u32) -> Result<Prepared, ZoneError> {
    let words = block.words();
    let layout = fit(block, keys)?;
    match validate(words) {
        Ok(held) if held.key_cap != layout.key_cap => {
            format(words, &layout, false);
            Ok(Prepared::Reformatted(format!(
                "the key table held {} keys, now {}",
                held.key_cap, layout.key_cap
            )))
        }
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

/// [`prepare`] for a block that other processes use already (nginx on reload: the
/// workers of the running configuration go on until their requests end): a block of
/// another layout is refused with [`ZoneError::InUse`] rather than formatted again under
/// them, which cleared the counters, the in-flight slots and the ledger they held and
/// handed their rows to the new workers.
pub fn prepare_reused(block: &Block, keys: u32) -> Result<Prepared, ZoneError> {
    let layout = fit(block, keys)?;
    match validate(block.words()) {
        Ok(held) if held.key_cap == layout.key_cap => prepare(block, keys),
        Ok(held) => Err(ZoneError::InUse(format!(
            "its key table holds {} keys, the configuration asks for {}",
            held.key_cap, layout.key_cap
        ))),
        Err(why) => Err(ZoneError::InUse(why)),
    }
}

fn fit(block: &Block, keys: u32) -> Result<Layout, ZoneError> {
    let words = block.words();
    Layout::fit(words.len(), addr_of(words), keys)
        .ok_or(ZoneError::TooSmall { bytes: block.bytes(), min_bytes: bytes_for(MIN_QUOTAS, keys) })
}

/// Formats a heap block created by [`Block::heap`] (already zero) or any block, with room
/// for `keys` keys.
pub(crate) fn format_new(block: &Block, keys: u32) -> Result<Layout, ZoneError> {
    let words = block.words();
    let layout = fit(block, keys)?;
    let zeroed = block.is_heap() && words[hdr::MAGIC].load(Relaxed) == 0;
    format(words, &layout, zeroed);
    Ok(layout)
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
    /// Templates held.
    pub templates: u64,
    /// Most keys (names under templates) the key table holds.
    pub key_capacity: u64,
    /// Keys held now.
    pub keys: u64,
    /// Keys inserted since the block was formatted.
    pub keys_inserted: u64,
    /// Keys new here that took the roots' last report of them at once.
    pub keys_adopted: u64,
    /// Drained keys whose slot a new key took.
    pub key_evictions: u64,
    /// New keys the table had no room for near their place: they shared their template's
    /// own bucket.
    pub keys_refused: u64,
    /// Answers from roots that carried another key secret than the one this block took
    /// first: those roots' keys are not this host's (another database, or a man in the
    /// middle that answered first).
    pub key_secret_conflicts: u64,
}

pub(crate) fn usage(w: &[AtomicU64], l: &Layout) -> ZoneUsage {
    let get = |i: usize| w[i].load(Relaxed);
    let slots_used = get(hdr::NEXT_SLOT);
    let arena_used =
        get(hdr::ARENA_BUMP).saturating_sub(1).saturating_sub(get(hdr::ARENA_FREE_WORDS));
    let fixed = l.cold;
    let index = (l.arena - l.index) as u64;
    let bytes_used = (fixed as u64
        + slots_used * (SLOT_WORDS + COLD_WORDS) as u64
        + get(hdr::KEYS_LIVE) * SLOT_WORDS as u64
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
        templates: get(hdr::TEMPLATES),
        key_capacity: u64::from(l.key_cap),
        keys: get(hdr::KEYS_LIVE),
        keys_inserted: get(hdr::KEYS_INSERTED),
        keys_adopted: get(hdr::KEYS_ADOPTED),
        key_evictions: get(hdr::KEY_EVICTIONS),
        keys_refused: get(hdr::KEYS_REFUSED),
        key_secret_conflicts: get(hdr::KEY_SECRET_CONFLICTS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_formats_reuses_and_reformats() {
        let b = Block::heap(1 << 20);
        assert_eq!(prepare(&b, 100), Ok(Prepared::Formatted));
        let id = b.words()[hdr::LIMITER_ID].load(Relaxed);
        assert_eq!(prepare(&b, 100), Ok(Prepared::Reused));
        assert_eq!(b.words()[hdr::LIMITER_ID].load(Relaxed), id, "identity survives");
        assert_eq!(b.words()[hdr::GENERATION].load(Relaxed), 2);
        match prepare(&b, 200) {
            Ok(Prepared::Reformatted(why)) => assert!(why.contains("key table"), "{why}"),
            other => panic!("{other:?}"),
        }
        let id = b.words()[hdr::LIMITER_ID].load(Relaxed);
        b.words()[hdr::VERSION].store(LAYOUT_VERSION + 1, Relaxed);
        match prepare(&b, 200) {
            Ok(Prepared::Reformatted(why)) => assert!(why.contains("layout version"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_ne!(b.words()[hdr::LIMITER_ID].load(Relaxed), id, "a new limiter");
        b.words()[hdr::MAGIC].store(7, Relaxed);
        assert!(matches!(prepare(&b, 200), Ok(Prepared::Reformatted(w)) if w.contains("magic")));
        assert!(matches!(prepare(&Block::heap(4096), 0), Err(ZoneError::TooSmall { .. })));
    }

    #[test]
    fn a_block_in_use_is_reused_or_refused_never_formatted_again() {
        let b = Block::heap(1 << 20);
        assert_eq!(prepare(&b, 100), Ok(Prepared::Formatted));
        let id = b.words()[hdr::LIMITER_ID].load(Relaxed);
        assert_eq!(prepare_reused(&b, 100), Ok(Prepared::Reused));
        match prepare_reused(&b, 200) {
            Err(ZoneError::InUse(why)) => assert!(why.contains("key table"), "{why}"),
            other => panic!("{other:?}"),
        }
        b.words()[hdr::VERSION].store(LAYOUT_VERSION + 1, Relaxed);
        assert!(
            matches!(prepare_reused(&b, 100), Err(ZoneError::InUse(w)) if w.contains("layout"))
        );
        b.words()[hdr::VERSION].store(LAYOUT_VERSION, Relaxed);
        assert_eq!(b.words()[hdr::LIMITER_ID].load(Relaxed), id, "nothing was formatted");
        assert_eq!(b.words()[hdr::GENERATION].load(Relaxed), 2);
    }
}
