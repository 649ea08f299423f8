//! Where everything lives in a block: the header's words, the regions and their sizes, the
//! check that a block holds this layout, and formatting. Every other file of the zone reads
//! the offsets from here.
//!
//! A block outlives the code that formatted it (nginx keeps a zone across reloads, and
//! processes of an older build share it during a binary upgrade), so a block is only read by
//! code of the same [`LAYOUT_VERSION`]. `layout_is_pinned_to_its_version` below keeps that
//! promise honest: it records every header, slot and root word, the region offsets of three
//! block sizes, the index and name encodings and the name hash, next to the version, in
//! `layout.golden`. Moving a word without bumping the version fails it.

use super::index;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Declares the word indices of a record as constants, and a table of them by name that the
/// golden test reads, so a word added later is pinned without anyone remembering to list it.
macro_rules! word_table {
    ($table:ident: $($(#[$a:meta])* $vis:vis const $name:ident = $v:expr;)*) => {
        $($(#[$a])* $vis const $name: usize = $v;)*
        /// Every word index above, by name.
        #[allow(dead_code)]
        pub(crate) const $table: &[(&str, usize)] = &[$((stringify!($name), $name)),*];
    };
}
pub(crate) use word_table;

/// `b"YARLZONE"`: the first word of a formatted block.
pub const MAGIC: u64 = u64::from_le_bytes(*b"YARLZONE");

/// Version of the layout described in this file. A block formatted by another version is
/// formatted again, never read (bump it with any change to the layout, the name hash or the
/// meaning of a field).
pub const LAYOUT_VERSION: u64 = 20;

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
pub(crate) const HEADER_WORDS: usize = (hdr::OVERRIDES + OVERRIDE_BITS / 64).next_multiple_of(8);
const _: () = assert!(hdr::AUX + AUX_LANES * AUX_COUNTERS == hdr::TSTAT_IDS);
const _: () = assert!(hdr::TSTAT_IDS + TEMPLATE_STATS == hdr::TSTAT_COUNTS);
const _: () = assert!(hdr::TSTAT_COUNTS + (TEMPLATE_STATS + 1) * TSTAT_WORDS <= hdr::OVERRIDES);
/// Bits of the override filter ([`hdr::OVERRIDES`]): 4 KiB, so that a thousand overrides
/// take 3 % of them and ten thousand 26 % (a key in a taken bit probes the index).
pub(crate) const OVERRIDE_BITS: usize = 32768;
/// Templates whose keys are counted apart (in the order the block first held them); the
/// keys of any others are counted together, as `_other`.
pub const TEMPLATE_STATS: usize = 64;
/// Words of one template's counts: keys held, keys evicted, keys refused for want of room.
pub(crate) const TSTAT_WORDS: usize = 3;
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
/// Most entries of the permit table: one per concurrency counter (a quota with
/// `max_in_flight`) the block serves, open-addressed by id (see `limiter/permits.rs`). A
/// block has one per eight quota slots, a power of two from 64 to this (32 KiB).
pub const PERMIT_ENTRIES: usize = 1024;
/// Fewest entries of the permit table.
pub(crate) const MIN_PERMIT_ENTRIES: usize = 64;
/// Words of one permit entry: the counter's id (0 empty, all ones a deleted entry), then
/// its [`PERMIT_WORDS`](crate::concurrency::PERMIT_WORDS) permit words.
pub(crate) const PERMIT_ENTRY_WORDS: usize = 1 + crate::concurrency::PERMIT_WORDS;
/// Rows of the ledger of who holds the permits: one per process that acquires (an nginx
/// worker), so a process that dies without releasing (`kill -9`) gives its slots back
/// through its row (see `limiter/ledger.rs`). A process beyond these takes no row: what it
/// holds when killed stays taken until the zone is made again.
pub const LEDGER_ROWS: usize = 64;
/// Words of one ledger row with `permit_cap` permit entries: the owner, then a 32-bit count
/// per entry, two to a word.
pub(crate) const fn ledger_row_words(permit_cap: usize) -> usize {
    1 + permit_cap / 2
}
/// Arena words reserved per slot (name tails and unresolved parents).
const ARENA_WORDS_PER_SLOT: u64 = 2;
/// Most keys a block can hold (slots of the key table, see `keys.rs`): slot numbers stay
/// below 2^32 with the quotas'.
pub const MAX_KEYS: u32 = 1 << 26;
/// Bytes one key takes in a block: its slot and its dirty bit.
pub const BYTES_PER_KEY: usize = SLOT_WORDS * 8 + 1;

/// Header word indices.
pub(crate) mod hdr {
    super::word_table! { ALL:
        pub const MAGIC = 0;
        pub const VERSION = 1;
        pub const WORDS = 2;
        pub const SLOT_CAP = 3;
        pub const SHARDS = 4;
        pub const SHARD_CAP = 5;
        pub const ARENA_WORDS = 6;
        pub const SLOTS_AT = 7;
        pub const SEED = 8;
        pub const LIMITER_ID = 9;
        /// The secret half of the limiter's wire id, never printed (see
        /// `Limiter::wire_id`): the printed half alone does not make a session.
        pub const LIMITER_KEY = 11;
        /// Bumped every time the block is prepared again (an nginx reload reusing the zone).
        pub const GENERATION = 10;
        /// Until when (limiter clock, ns) the request path extrapolates the rest of the
        /// cluster's inflow `HELD_STRETCH` ns longer than its own horizon: a few intervals
        /// past the last round whose answers a shard's view held (see
        /// `CounterAccess::anchor_held`), whose counters' last view grows older than the
        /// horizon meanwhile. A deadline, so it lapses with an agent that stops.
        pub const HELD_UNTIL = 12;
        pub const HELD_STRETCH = 13;
        /// Bumped by the writer before it walks the key table to give keys new template
        /// numbers or free them (templates or the cluster's secret changed): an insert that
        /// read the old ones sees it and inserts its key again (see `Limiter::key_of`).
        pub const KEY_GEN = 14;

        pub const EPOCH = 16;
        pub const QUOTAS = 17;
        pub const REJECTIONS = 18;
        pub const FRESH = 19;
        pub const LOCAL_SINCE = 20;
        pub const NEXT_SEQ = 21;
        pub const INFLIGHT_SEQ = 22;
        pub const ROUNDS = 23;
        pub const NEXT_SLOT = 24;
        pub const FREE_HEAD = 25;
        pub const FREE_TAIL = 26;
        pub const FREE_COUNT = 27;
        pub const ARENA_BUMP = 28;
        pub const ARENA_FREE_WORDS = 29;
        pub const MISSING = 30;
        pub const REBUILDS = 31;
        pub const AGENT = 32;
        pub const AGENT_STARTS = 34;
        pub const LAST_REFETCH = 35;
        pub const LAST_ROUND_END = 36;
        /// Random token of the handle whose writer caches match the block (see
        /// `limiter/writer.rs`).
        pub const WRITER = 37;
        /// Next entry of the ring of recent rejections.
        pub const RECENT_HEAD = 38;
        /// Highest quota epoch ever applied (EPOCH goes back to 0 for a refetch, this never).
        pub const EPOCH_SEEN = 39;
        /// Non-zero when a request path saw its own traffic run well ahead of what it counted
        /// in its last interval: the sync agent starts a round early.
        pub const URGENT = 40;
        /// Early rounds started.
        pub const EARLY_ROUNDS = 41;
        /// When the current round began: `local` counts from then.
        pub const ROUND_BEGAN = 42;
        /// The sync agent's write section: its holder (high half) and when it entered, ms.
        pub const SECTION_LOCK = 43;
        /// The last process to enter the write section.
        pub const SECTION_LAST = 44;
        /// Write sections left after another process had entered meanwhile.
        pub const SECTION_OVERLAPS = 45;
        /// Entries into the write section refused while another live process was inside.
        pub const SECTION_WAITS = 46;
        /// Answers that carried a key secret other than the one this block took first (a
        /// root of another database, or a man in the middle that answered first).
        pub const KEY_SECRET_CONFLICTS = 47;
        /// `SPARE_AREAS` pairs: (area + 1, time it was retired).
        pub const SPARES = 48;
        /// Free-list heads of the arena, by record size in words (index = size).
        pub const ARENA_FREE = 64;
        /// Slots of the key table and where it starts.
        pub const KEY_CAP = 100;
        pub const KEYS_AT = 101;
        /// The block's own secret (two words) for the 128-bit hash that names keys.
        pub const KEY_SECRET = 102;
        /// The cluster's secret (two words) the wire ids of keys are derived with, and
        /// whether it is set (see `keys.rs`).
        pub const CLUSTER_SECRET = 104;
        pub const CLUSTER_SECRET_SET = 106;
        /// Keys held, inserted, evicted, and refused for want of room.
        pub const KEYS_LIVE = 107;
        pub const KEYS_INSERTED = 108;
        pub const KEY_EVICTIONS = 109;
        pub const KEYS_REFUSED = 110;
        /// Where the agent's eviction sweep of the key table stands.
        pub const KEY_HAND = 111;
        /// Templates held, and a bitmap of their prefixes' lengths (4 words, bit n: a
        /// template's prefix is n bytes long).
        pub const TEMPLATES = 112;
        pub const TEMPLATE_LENS = 113;
        /// Limiters the roots last said they heard from lately (0 before any answer): what
        /// a counter no root has reported yet is scaled by (see `Slot::estimate`).
        pub const PEERS = 117;
        /// Keys that took what the roots had reported of them on their first sight here
        /// (`SyncEngine::adopt_keys`). Zero in blocks made before it: a count from then.
        pub const KEYS_ADOPTED = 118;
        /// Permit entries in use, and concurrency quotas refused one (the table was full).
        pub const PERMITS_LIVE = 119;
        pub const PERMITS_REFUSED = 120;
        /// Processes that found no free ledger row, and slots given back from the rows of
        /// processes that died holding them.
        pub const LEDGER_FULL = 121;
        pub const LEDGER_REAPED = 122;
        /// A bitmap of the first bytes of templates' prefixes (4 words, bit b: a template's
        /// prefix starts with byte b): most names no template covers are told so by one
        /// load.
        pub const TEMPLATE_FIRST = 123;
        /// Acquires refused a slot by a cap (or that a cap in shadow mode would have
        /// refused), every counter together: the per-entry counts go with their entries.
        pub const PERMIT_REFUSALS = 127;
        /// `AUX_LANES` lanes of `AUX_COUNTERS` words, each lane on its own cache line.
        pub const AUX = 128;
        /// `TEMPLATE_STATS` words: the template slot + 1 each entry of the counts below
        /// belongs to (0: free), written by the writer only.
        pub const TSTAT_IDS = 640;
        /// `TEMPLATE_STATS + 1` entries of `TSTAT_WORDS` counts; the last is `_other`.
        pub const TSTAT_COUNTS = 704;
        /// The override filter: `OVERRIDE_BITS` bits, a name's given by its key hash, each
        /// set while a quota whose name a template covers (overrides, and templates under
        /// a shorter one) has it. A name whose bit is clear has no quota
        /// of its own, so a key's request path skips the index (see `limiter/keys.rs`).
        /// The writer keeps the exact count behind each bit in its own memory. Before a
        /// batch that may make, delete or rename a template it sets every bit (every name
        /// takes the index) and counts again from the quotas at its end; a writer that
        /// takes over counts again too.
        pub const OVERRIDES = 904;
    }
}

/// The hash of quota names in the index, seeded per block ([`hdr::SEED`]) so that every
/// process sharing the block finds a name at the same place. Part of the layout: another
/// hash function (or a new version of this one) places names elsewhere.
#[derive(Clone)]
pub(crate) struct NameHasher(foldhash::fast::FixedState);

impl NameHasher {
    pub(crate) fn with_seed(seed: u64) -> NameHasher {
        NameHasher(foldhash::fast::FixedState::with_seed(seed))
    }

    #[inline]
    pub(crate) fn hash(&self, name: &[u8]) -> u64 {
        std::hash::BuildHasher::hash_one(&self.0, name)
    }
}

/// Where each region starts, in words from the start of the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub words: usize,
    pub slot_cap: u32,
    pub key_cap: u32,
    pub shards: u32,
    pub shard_cap: u32,
    pub arena_words: u32,
    pub roots: usize,
    pub recent: usize,
    pub permits: usize,
    pub permit_cap: usize,
    pub ledger: usize,
    pub permit_slots: usize,
    pub dir: usize,
    pub dirty: usize,
    pub dirty_sum: usize,
    pub cold: usize,
    pub slots: usize,
    pub keys: usize,
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
    /// The layout of `slot_cap` quota slots and `key_cap` key slots in a block whose first
    /// word is at byte address `addr`.
    fn with_slots(words: usize, addr: usize, slot_cap: u32, key_cap: u32) -> Layout {
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
        let permits = at;
        let permit_cap =
            (slot_cap as usize / 8).next_power_of_two().clamp(MIN_PERMIT_ENTRIES, PERMIT_ENTRIES);
        at += permit_cap * PERMIT_ENTRY_WORDS;
        let ledger = at;
        at += LEDGER_ROWS * ledger_row_words(permit_cap);
        // Per permit entry, its quota's slot + 1 (names for `yarl_stats` and metrics) and
        // the acquires it refused since it was made.
        let permit_slots = at;
        at += 2 * permit_cap;
        let dir = at;
        at += MAX_SHARDS;
        let dirty = at;
        // One space of slot numbers: the quota slots, then the key table's.
        let dirty_words = (slot_cap as usize + key_cap as usize).div_ceil(64);
        at += dirty_words;
        // A bit per dirty word that may have bits set: a round reads these, not every word
        // of a large key table.
        let dirty_sum = at;
        at += dirty_words.div_ceil(64);
        let cold = at;
        at += slot_cap as usize * COLD_WORDS;
        // Slots start on a 128-byte boundary of the address space: one slot is one pair of
        // cache lines, which the adjacent-line prefetcher fetches together.
        let word_addr = addr / 8;
        while !(word_addr + at).is_multiple_of(SLOT_WORDS) {
            at += 1;
        }
        let slots = at;
        at += slot_cap as usize * SLOT_WORDS;
        let keys = at;
        at += key_cap as usize * SLOT_WORDS;
        let index = at;
        at += (shards as usize + SPARE_AREAS) * shard_cap as usize / 2;
        let arena = at;
        at += arena_words as usize;
        Layout {
            words,
            slot_cap,
            key_cap,
            shards,
            shard_cap,
            arena_words,
            roots,
            recent,
            permits,
            permit_cap,
            ledger,
            permit_slots,
            dir,
            dirty,
            dirty_sum,
            cold,
            slots,
            keys,
            index,
            arena,
            end: at,
        }
    }

    /// The layout with `key_cap` key slots and as many quota slots as fit in `words` words
    /// at `addr`.
    pub(crate) fn fit(words: usize, addr: usize, key_cap: u32) -> Option<Layout> {
        let key_cap = key_cap.min(MAX_KEYS);
        let fits = |n: u32| Layout::with_slots(words, addr, n, key_cap).end <= words;
        if !fits(MIN_QUOTAS) {
            return None;
        }
        let (mut lo, mut hi) = (MIN_QUOTAS, MAX_QUOTAS);
        if fits(hi) {
            return Some(Layout::with_slots(words, addr, hi, key_cap));
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
        Some(Layout::with_slots(words, addr, lo, key_cap))
    }

    /// Slot numbers in use by either table: quota slots, then key slots.
    pub(crate) fn all_slots(&self) -> u32 {
        self.slot_cap + self.key_cap
    }

    fn stored(&self, w: &[AtomicU64]) -> bool {
        let get = |i: usize| w[i].load(Relaxed);
        get(hdr::WORDS) == self.words as u64
            && get(hdr::SLOT_CAP) == u64::from(self.slot_cap)
            && get(hdr::SHARDS) == u64::from(self.shards)
            && get(hdr::SHARD_CAP) == u64::from(self.shard_cap)
            && get(hdr::ARENA_WORDS) == u64::from(self.arena_words)
            && get(hdr::SLOTS_AT) == self.slots as u64
            && get(hdr::KEY_CAP) == u64::from(self.key_cap)
            && get(hdr::KEYS_AT) == self.keys as u64
    }
}

/// Bytes a block needs to hold `quotas` quotas (names up to 23 bytes) and `keys` keys, at
/// any address.
pub fn bytes_for(quotas: u32, keys: u32) -> usize {
    let n = quotas.clamp(MIN_QUOTAS, MAX_QUOTAS);
    // Room for the worst alignment of the slot region.
    (Layout::with_slots(0, 0, n, keys.min(MAX_KEYS)).end + SLOT_WORDS) * 8
}

/// How many quotas a block of `bytes` holds (names up to 23 bytes) beside `keys` keys;
/// `None` when fewer than [`MIN_QUOTAS`].
pub fn quotas_for_bytes(bytes: usize, keys: u32) -> Option<u32> {
    Layout::fit((bytes / 8).saturating_sub(SLOT_WORDS), 0, keys).map(|l| l.slot_cap)
}

pub(super) fn addr_of(words: &[AtomicU64]) -> usize {
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
    let keys = u32::try_from(words[hdr::KEY_CAP].load(Relaxed)).unwrap_or(u32::MAX);
    let layout = Layout::fit(words.len(), addr_of(words), keys)
        .ok_or_else(|| "the block is too small".to_string())?;
    if !layout.stored(words) {
        return Err("the block's size or layout differs from its header".into());
    }
    Ok(layout)
}

pub(super) fn format(w: &[AtomicU64], l: &Layout, zeroed: bool) {
    w[hdr::MAGIC].store(0, Release);
    if !zeroed {
        // Slots, cold entries and arena records are written whole when allocated; everything
        // read before that must start at zero.
        let zero = |from: usize, to: usize| w[from..to].iter().for_each(|x| x.store(0, Relaxed));
        zero(0, HEADER_WORDS);
        zero(l.roots, l.cold);
        // Keys are claimed by a compare-and-swap on an empty slot, so the table starts zero.
        zero(l.keys, l.index);
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
    set(hdr::KEY_CAP, u64::from(l.key_cap));
    set(hdr::KEYS_AT, l.keys as u64);
    set(hdr::KEY_SECRET, fastrand::u64(..));
    set(hdr::KEY_SECRET + 1, fastrand::u64(..));
    set(hdr::SEED, fastrand::u64(..));
    set(hdr::LIMITER_ID, fastrand::u64(1..));
    set(hdr::LIMITER_KEY, secret_word());
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

/// A word nobody outside this process can predict: the process's random hashing keys
/// (from the operating system) mixed with the thread's generator. For the secret half of
/// the limiter's wire id, which other hosts never see printed.
fn secret_word() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(fastrand::u64(..));
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_trip() {
        for n in [MIN_QUOTAS, 1_000, 190_000, 1_000_000] {
            let bytes = bytes_for(n, 0);
            let got = quotas_for_bytes(bytes, 0).unwrap();
            assert!(got >= n, "{n} quotas need {bytes} bytes, which hold {got}");
            assert!(got < n + n / 50 + 200, "{n}: {got}");
        }
        let per = bytes_for(1_000_000, 0) as f64 / 1e6;
        assert!(per < 170.0, "{per} bytes per quota");
        assert_eq!(quotas_for_bytes(1000, 0), None);
        let q = quotas_for_bytes(32 << 20, 0).unwrap();
        assert!((195_000..210_000).contains(&q), "32 MiB hold {q}");
    }

    #[test]
    fn layout_regions_do_not_overlap_and_slots_are_aligned() {
        for addr in [0usize, 8, 64, 4096 + 24] {
            let l = Layout::fit(1 << 20, addr, 1000).unwrap();
            let regions =
                [l.roots, l.dir, l.dirty, l.cold, l.slots, l.keys, l.index, l.arena, l.end];
            assert!(regions.windows(2).all(|w| w[0] <= w[1]), "{l:?}");
            assert!(l.end <= l.words);
            assert_eq!((addr / 8 + l.slots) % SLOT_WORDS, 0);
            assert_eq!((addr / 8 + l.keys) % SLOT_WORDS, 0);
            assert_eq!(l.keys + l.key_cap as usize * SLOT_WORDS, l.index);
            assert!(l.dirty + (l.all_slots() as usize).div_ceil(64) <= l.dirty_sum);
            assert!(l.dirty_sum + (l.all_slots() as usize).div_ceil(64 * 64) <= l.cold);
            assert!(l.cold + l.slot_cap as usize * COLD_WORDS <= l.slots);
        }
    }

    /// Everything a block's bytes mean, as text: the version, every constant that sizes a
    /// region, every header, slot and root word, the regions of three block sizes at three
    /// addresses, the encodings of an index entry, a directory word and a name, and the
    /// name hash.
    fn describe() -> String {
        use super::super::{arena::name, roots, slot};
        use std::fmt::Write;
        let mut s = String::new();
        let mut line = |k: &str, v: String| writeln!(s, "{k} {v}").unwrap();
        line("version", LAYOUT_VERSION.to_string());
        line("magic", format!("{MAGIC:#018x}"));
        for (k, v) in [
            ("slot_words", SLOT_WORDS),
            ("cold_words", COLD_WORDS),
            ("max_roots", MAX_ROOTS),
            ("root_words", ROOT_WORDS),
            ("max_shards", MAX_SHARDS),
            ("spare_areas", SPARE_AREAS),
            ("header_words", HEADER_WORDS),
            ("override_bits", OVERRIDE_BITS),
            ("aux_counters", AUX_COUNTERS),
            ("aux_lanes", AUX_LANES),
            ("recent_rejections", RECENT_REJECTIONS),
            ("permit_entries", PERMIT_ENTRIES),
            ("min_permit_entries", MIN_PERMIT_ENTRIES),
            ("permit_entry_words", PERMIT_ENTRY_WORDS),
            ("ledger_rows", LEDGER_ROWS),
            ("ledger_row_words_min", ledger_row_words(MIN_PERMIT_ENTRIES)),
            ("arena_words_per_slot", ARENA_WORDS_PER_SLOT as usize),
            ("min_quotas", MIN_QUOTAS as usize),
            ("max_quotas", MAX_QUOTAS as usize),
            ("max_keys", MAX_KEYS as usize),
            ("name_inline_words", name::INLINE),
        ] {
            line(k, v.to_string());
        }
        for (table, words) in [("hdr", hdr::ALL), ("slot", slot::FIELDS), ("root", roots::FIELDS)] {
            for (k, v) in words {
                line(&format!("{table}.{k}"), v.to_string());
            }
        }
        for (bytes, addr) in [(256usize << 10, 0usize), (32 << 20, 64), (200 << 20, 4096 + 24)] {
            let l = Layout::fit(bytes / 8, addr, (bytes / 4 / BYTES_PER_KEY) as u32).unwrap();
            line(&format!("layout {bytes}@{addr}"), format!("{l:?}"));
        }
        line("index.entry", format!("{:#010x}", index::entry(0xA5, 123_456)));
        line("index.tomb", format!("{:#010x}", index::TOMB));
        line("index.dir", format!("{:#018x}", index::pack_dir(3, 1_000, 7)));
        let n = b"s3_bucket-0000001_read.and-a-longer-tail";
        let words: Vec<String> =
            (0..name::words(n)).map(|i| format!("{:x}", name::word(n, i))).collect();
        line("name.words", words.join(" "));
        line("name.hash", format!("{:#018x}", NameHasher::with_seed(0x5EED).hash(n)));
        let rates = slot::Rates { inflow: 1500.0, demand: 3e12, own: 0.25 };
        line("slot.rates", format!("{:#018x}", rates.pack()));
        line("slot.ms32", format!("{:#010x}", slot::to_ms32(86_400_000_000_123)));
        line("slot.shadow", format!("{:#018x}", slot::SHADOW));
        {
            use crate::concurrency::permits::{IN_FLIGHT, ROUND, SHARE};
            line(
                "permit.words",
                format!(
                    "in_flight={IN_FLIGHT} (count | generation << 32) share={SHARE} round={ROUND}"
                ),
            );
            let w = crate::concurrency::PermitWords::default();
            w.view().publish(7, 86_400_000_000_123);
            line("permit.share", format!("{:#018x}", w.share_word()));
        }
        s
    }

    /// The layout recorded for [`LAYOUT_VERSION`] (see the file's doc). To record a new
    /// version's: `YARL_RECORD_LAYOUT=1 cargo test -p yarl-core layout_is_pinned`.
    #[test]
    fn layout_is_pinned_to_its_version() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/zone/layout.golden");
        let recorded = std::fs::read_to_string(path).unwrap_or_default();
        let now = describe();
        if recorded == now {
            return;
        }
        let version_of =
            |t: &str| t.lines().next().and_then(|l| l.strip_prefix("version ")).map(str::to_owned);
        let changed: Vec<String> = now
            .lines()
            .filter(|l| !recorded.lines().any(|r| r == *l))
            .map(|l| format!("  now:      {l}"))
            .chain(
                recorded
                    .lines()
                    .filter(|r| !now.lines().any(|l| l == *r))
                    .map(|r| format!("  recorded: {r}")),
            )
            .collect();
        if version_of(&recorded) == version_of(&now) {
            panic!(
                "the zone layout changed but LAYOUT_VERSION is still {LAYOUT_VERSION}: bump it \
                 (a block of another layout must be formatted again, never read), then record \
                 the new layout with YARL_RECORD_LAYOUT=1.\n{}",
                changed.join("\n")
            );
        }
        if std::env::var_os("YARL_RECORD_LAYOUT").is_some() {
            std::fs::write(path, &now).unwrap();
            return;
        }
        panic!(
            "LAYOUT_VERSION {LAYOUT_VERSION} has no recorded layout in {path} (it records version \
             {:?}): record it with YARL_RECORD_LAYOUT=1 cargo test -p yarl-core layout_is_pinned\n{}",
            version_of(&recorded),
            changed.join("\n")
        );
    }
}
