//! Concurrency quotas in the zone: the permit table, one entry per counter with a
//! `max_in_flight`, and the request path's acquire and release (the rules are in
//! [`crate::concurrency`]).
//!
//! The table is open-addressed by counter id, with linear probing, in a region of the
//! block (`Layout::permits`, 64 to 1,024 entries). The writer (the sync agent, applying
//! quotas) makes an entry when a quota gains a cap and frees it (a deleted mark, so probes
//! pass over it) when the cap or the quota goes; request paths only read ids and work on
//! the permit words, with atomics. A quota with a cap and no entry (the table full) is not
//! capped on this host, and counted (`PERMITS_REFUSED`): the operator sees it in
//! `yarl_stats`, and a larger zone has more entries.
//!
//! An acquire walks the quota's chain and takes a slot at every level that has a cap,
//! all or nothing: a refusal at a parent gives back what the levels below took. A
//! [`Permit`] remembers the entries it took, their ids and the generation of their words
//! (so a release after the entry was freed and reused for another counter touches nothing).

use super::writer::hash_id;
use super::Limiter;
use crate::concurrency::{Permits, PERMIT_WORDS};
use crate::quota::QuotaId;
use crate::zone::keys::is_key_id;
use crate::zone::{hdr, PERMIT_ENTRY_WORDS};
use crate::MAX_CHAIN;
use std::sync::atomic::{AtomicU64, Ordering::*};

const EMPTY: u64 = 0;
const DELETED: u64 = u64::MAX;
/// An entry being made (its words set before its id is published): probes that meet it
/// wait, so that two request paths meeting a new key at once make one entry, not two. No
/// counter has this id (key ids have bit 62 clear, quota ids are small).
const BUSY: u64 = u64::MAX - 1;
/// Times a request path looks again for an entry another is making right now.
const BUSY_TRIES: u32 = 256;
/// The bit of an entry's slot word that marks a key's entry: its slot part names the
/// key's template, not the key (names of keys are clients' data; figures fold into the
/// template's).
const KEY_ENTRY: u64 = 1 << 63;
/// The bit of a key entry's slot word that says no root has answered for it yet: until one
/// has, the key's requests that find no share of its own may take a slot of its
/// template's own counter (see [`Limiter::acquire`]).
const KEY_FRESH: u64 = 1 << 62;
/// The cap's bits in a slot word (above the slot + 1).
const CAP_MASK: u64 = (1 << 30) - 1;

/// Slots taken by [`Limiter::acquire`] at every capped level of a quota's chain; give them
/// back with [`Limiter::release`] when the request ends, however it ends. Plain data (no
/// pointers), so a request can keep it wherever it keeps its state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Permit {
    /// (entry, generation of its words, counter id) of each slot taken, leaf first (a key
    /// new to the host may hold a slot of its template's counter beside its own count: one
    /// more than the chain).
    taken: [(u16, u32, QuotaId); MAX_CHAIN + 1],
    len: u8,
}

impl Permit {
    /// Whether it holds no slot (no level of the chain has a cap on this host).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn taken(&self) -> &[(u16, u32, QuotaId)] {
        &self.taken[..usize::from(self.len)]
    }
}

/// What [`Limiter::acquire`] decided.
// A permit is plain data a request keeps in its own state; boxing it would allocate once
// per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Admitted: release the permit when the request ends (an empty one when nothing in
    /// the chain has a cap here, or the name has no quota).
    Admitted(Permit),
    /// Refused: the counter of this id is at its share on this host.
    Refused(QuotaId),
    /// Admitted although the counter of this id (a quota in shadow mode) is at its share on
    /// this host: the permit holds the levels that had room (release it as for
    /// [`Acquired::Admitted`]), the refusal is counted, and the request is one the quota
    /// would have refused (`REJECTED_DRY_RUN`).
    WouldRefuse(Permit, QuotaId),
}

/// One concurrency counter as this host holds it (for `yarl_stats` and metrics): a quota,
/// or a template with the figures of its keys added up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyInfo {
    /// The quota's (or template's) name.
    pub name: String,
    /// Its id.
    pub id: QuotaId,
    /// For a template: its keys with an entry on this host now (each capped on its own),
    /// whose figures are added into this row's.
    pub keys: u32,
    /// Requests holding a slot of it on this host now.
    pub in_flight: u32,
    /// The share of its `max_in_flight` this host holds now (0: none, or the grants lapsed).
    pub share: u32,
    /// Acquires it refused on this host since its cap arrived.
    pub refused: u64,
}

/// The host's concurrency counters and their bookkeeping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrencyStatus {
    /// Every counter with a permit entry, by name.
    pub quotas: Vec<ConcurrencyInfo>,
    /// Times a capped quota found no permit entry (the table was full): it is not capped
    /// on this host; a larger zone has more entries.
    pub entries_refused: u64,
    /// Acquires refused a slot on this host (or that a cap in shadow mode would have
    /// refused), every counter together, since the zone was made: unlike the rows', this
    /// count never loses what a counter whose entry went had.
    pub refused: u64,
    /// Processes that found no ledger row (their slots leak if they are killed).
    pub ledger_full: u64,
    /// Slots given back from the ledger rows of processes that died holding them.
    pub reaped: u64,
}

/// A capped quota as the RateLimit fields describe it (`qu="concurrent-requests"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLevel {
    /// The quota's name.
    pub name: String,
    /// Its `max_in_flight` (cluster-wide).
    pub cap: u32,
    /// Requests this host can still admit on it now: its share less what it runs.
    pub remaining: u32,
    /// For a key under a capped template (`name` is then the template's): the key's wire
    /// id, the RateLimit fields' partition key.
    pub key: Option<QuotaId>,
}

fn slot_word((slot, cap): (u32, u32)) -> u64 {
    (u64::from(slot) + 1) | (u64::from(cap) << 32)
}

fn word_cap(word: u64) -> u32 {
    ((word >> 32) & CAP_MASK) as u32
}

/// Why [`Limiter::probe_entry`] found no entry.
enum Missing {
    /// None: this free (or deleted) entry can take it (`None`: the table is full).
    Free(Option<usize>),
    /// An entry is being made on the way: look again.
    Busy,
}

impl Limiter {
    fn permit_region(&self) -> &[AtomicU64] {
        let l = &self.layout;
        &self.words()[l.permits..l.permits + l.permit_cap * PERMIT_ENTRY_WORDS]
    }

    fn entry_id(&self, e: usize) -> &AtomicU64 {
        &self.permit_region()[e * PERMIT_ENTRY_WORDS]
    }

    pub(super) fn entry_permits(&self, e: usize) -> Permits<'_> {
        let at = e * PERMIT_ENTRY_WORDS + 1;
        let words: &[AtomicU64; PERMIT_WORDS] = self.permit_region()[at..at + PERMIT_WORDS]
            .try_into()
            .expect("a permit entry holds PERMIT_WORDS words after its id");
        Permits::new(words)
    }

    /// The entry of counter `id`: `Ok(entry)`, or `Err(first free or deleted entry seen)`
    /// when it has none (`Err(None)`: the table is full). An entry being made counts as
    /// taken.
    pub(super) fn find_entry(&self, id: QuotaId) -> Result<usize, Option<usize>> {
        match self.probe_entry(id, false) {
            Ok(e) => Ok(e),
            Err(Missing::Free(free)) => Err(free),
            Err(Missing::Busy) => Err(None),
        }
    }

    /// [`find_entry`](Self::find_entry) for whoever makes entries: with `wait`, an entry
    /// being made on the way is reported (it may be `id`'s), so the caller looks again
    /// rather than making a second entry for the same counter.
    fn probe_entry(&self, id: QuotaId, wait: bool) -> Result<usize, Missing> {
        let cap = self.layout.permit_cap;
        let start = (hash_id(id) % cap as u64) as usize;
        let mut free = None;
        for k in 0..cap {
            let e = (start + k) % cap;
            match self.entry_id(e).load(Acquire) {
                w if w == id => return Ok(e),
                EMPTY => return Err(Missing::Free(free.or(Some(e)))),
                // The counter's own deleted entry comes first: made again there, it keeps
                // counting the requests it admitted before (see `make_entry`).
                DELETED if self.deleted_owner(e) == id => free = Some(e),
                DELETED => free = free.or(Some(e)),
                BUSY if wait => return Err(Missing::Busy),
                _ => {}
            }
        }
        Err(Missing::Free(free))
    }

    /// The counter whose slots entry `e` counts: its id, or, deleted, the id it had (0 or
    /// all ones: none).
    pub(super) fn permit_entry_owner(&self, e: usize) -> u64 {
        match self.entry_id(e).load(Acquire) {
            DELETED => self.deleted_owner(e),
            id => id,
        }
    }

    /// Whether entry `e` counts the slots of counter `id`: it is `id`'s, or `id`'s deleted
    /// entry (requests admitted before a cap was removed still give their slots back, so
    /// the count is right if the cap comes back).
    pub(super) fn holds(&self, e: usize, id: QuotaId) -> bool {
        // An entry being made is no counter's yet (a reaper that read it BUSY must give
        // nothing back to whichever counter it is made for).
        if id == EMPTY || id == DELETED || id == BUSY {
            return false;
        }
        match self.entry_id(e).load(Acquire) {
            DELETED => self.deleted_owner(e) == id,
            w => w == id,
        }
    }

    /// Gives back `n` slots of entry `e` if it still counts `id`'s in generation
    /// `generation`; whether it did.
    pub(super) fn permit_entry_release_many(
        &self,
        e: usize,
        id: u64,
        generation: u32,
        n: u32,
    ) -> bool {
        self.holds(e, id) && self.entry_permits(e).release_many_in(n, generation)
    }

    /// The generation entry `e`'s words count in (see [`Permits::renew`]).
    pub(super) fn permit_entry_generation(&self, e: usize) -> u32 {
        self.entry_permits(e).generation()
    }

    /// The permits of counter `id` on this host, if it has a cap here: for the sync agent
    /// (publishing shares, taking a round's figures) and for inspection.
    pub fn permits(&self, id: QuotaId) -> Option<Permits<'_>> {
        self.find_entry(id).ok().map(|e| self.entry_permits(e))
    }

    /// Every concurrency counter with its figures now, by name.
    pub fn concurrency_status(&self) -> ConcurrencyStatus {
        let now = self.clock.now_nanos();
        let mut rows: std::collections::BTreeMap<String, ConcurrencyInfo> = Default::default();
        for e in 0..self.layout.permit_cap {
            let id = self.entry_id(e).load(Acquire);
            if id == EMPTY || id == DELETED || id == BUSY {
                continue;
            }
            let p = self.entry_permits(e);
            let key = self.entry_slot(e).load(Acquire) & KEY_ENTRY != 0;
            let row =
                rows.entry(self.entry_name(e, id)).or_insert_with_key(|name| ConcurrencyInfo {
                    name: name.clone(),
                    id: 0,
                    keys: 0,
                    in_flight: 0,
                    share: 0,
                    refused: 0,
                });
            // A key's row is its template's: the template's own entry (keys that found no
            // room in the key table share it) gives the id.
            if key {
                row.keys += 1;
            } else {
                row.id = id;
            }
            row.in_flight = row.in_flight.saturating_add(p.in_flight());
            row.share = row.share.saturating_add(p.share(now));
            row.refused = row.refused.saturating_add(self.entry_refused(e).load(Relaxed));
        }
        let quotas: Vec<ConcurrencyInfo> = rows.into_values().collect();
        let (ledger_full, reaped) = self.ledger_figures();
        ConcurrencyStatus {
            quotas,
            entries_refused: self.hdr(hdr::PERMITS_REFUSED).load(Relaxed),
            refused: self.hdr(hdr::PERMIT_REFUSALS).load(Relaxed),
            ledger_full,
            reaped,
        }
    }

    /// Every counter with a permit entry, and its permits.
    pub fn permit_entries(&self) -> Vec<(QuotaId, Permits<'_>)> {
        (0..self.layout.permit_cap)
            .filter_map(|e| match self.entry_id(e).load(Acquire) {
                EMPTY | DELETED | BUSY => None,
                id => Some((id, self.entry_permits(e))),
            })
            .collect()
    }

    /// Frees entries a process left half made (killed between marking an entry BUSY and
    /// publishing its id: probes that meet it would wait on it for ever). `seen` holds
    /// the entries found BUSY at the last call; those still BUSY now are freed. The sync
    /// agent calls it once a round, far longer than making an entry takes.
    pub(crate) fn sweep_busy_entries(&self, seen: &mut Vec<usize>) -> usize {
        let mut busy = Vec::new();
        let mut freed = 0;
        for e in 0..self.layout.permit_cap {
            if self.entry_id(e).load(Acquire) != BUSY {
                continue;
            }
            if seen.contains(&e)
                && self.entry_id(e).compare_exchange(BUSY, DELETED, AcqRel, Acquire).is_ok()
            {
                // Deleted with no owner: the maker may have written its slot word.
                self.entry_slot(e).store(0, Release);
                freed += 1;
            } else {
                busy.push(e);
            }
        }
        *seen = busy;
        freed
    }

    /// Whether live entries hold at least half the permit table.
    pub(crate) fn permit_table_half_full(&self) -> bool {
        self.hdr(hdr::PERMITS_LIVE).load(Relaxed) * 2 >= self.layout.permit_cap as u64
    }

    /// Whether key `id`'s entry still has a capped template behind it: the sync agent
    /// frees the entries of keys whose template lost its cap or went.
    pub(crate) fn key_entry_capped(&self, id: QuotaId) -> bool {
        let Ok(e) = self.find_entry(id) else { return false };
        let word = self.entry_slot(e).load(Acquire);
        word & KEY_ENTRY != 0 && self.template_cap((word & 0xffff_ffff) as u32).is_some()
    }

    /// The cap of the template in `slot + 1` (`t1`), if it has one on this host: its own
    /// entry holds it.
    fn template_cap(&self, t1: u32) -> Option<u32> {
        let t = t1.checked_sub(1)?;
        let id = self.live_slot(t)?.id();
        let e = self.find_entry(id).ok()?;
        Some(word_cap(self.entry_slot(e).load(Acquire))).filter(|&c| c > 0)
    }

    /// The cap (`max_in_flight`) of counter `id` on this host, if it has an entry (a
    /// key's is its template's).
    pub(crate) fn permit_cap(&self, id: QuotaId) -> Option<u32> {
        let e = self.find_entry(id).ok()?;
        Some(word_cap(self.entry_slot(e).load(Acquire))).filter(|&c| c > 0)
    }

    /// Frees key `id`'s entry (the sync agent, when the key has had nothing in flight for
    /// a while, or its template lost its cap). Requests still holding a slot of it give it
    /// back to the tombstone, as for a quota's.
    pub(crate) fn free_key_entry(&self, id: QuotaId) {
        if !is_key_id(id) {
            return;
        }
        let _w = self.writer();
        // Its refusals go to its template's own entry, so the template's row (which adds
        // up its keys' entries) never counts down: a Prometheus counter.
        if let Ok(e) = self.find_entry(id) {
            let t = (self.entry_slot(e).load(Acquire) as u32).checked_sub(1);
            let te = t.and_then(|t| self.live_slot(t)).and_then(|x| self.find_entry(x.id()).ok());
            if let Some(te) = te.filter(|&te| te != e) {
                let n = self.entry_refused(e).swap(0, Relaxed);
                self.entry_refused(te).fetch_add(n, Relaxed);
            }
        }
        self.set_permit_entry(id, None);
    }

    /// `slot + 1 | max_in_flight << 32` of entry `e`'s quota (0: unknown).
    fn entry_slot(&self, e: usize) -> &AtomicU64 {
        &self.words()[self.layout.permit_slots + 2 * e]
    }

    fn entry_name(&self, e: usize, id: QuotaId) -> String {
        let word = self.entry_slot(e).load(Acquire);
        if word & KEY_ENTRY != 0 {
            // Its template's name, if the template is still there.
            return match (word as u32).checked_sub(1).and_then(|t| self.live_slot(t)) {
                Some(_) => self.slot_name(word as u32 - 1),
                None => "#key".into(),
            };
        }
        match word as u32 {
            0 => format!("#{id}"),
            s => self.slot_name(s - 1),
        }
    }

    /// Each capped level `permit` holds a slot of, for the RateLimit fields: its name, cap
    /// and what this host can still admit on it now.
    ///
    /// A key's request that runs on its template's slot (the key new here) holds both; the
    /// key's level stands for the two, so the template's is left out.
    pub fn permit_levels(&self, permit: &Permit) -> Vec<SlotLevel> {
        let taken = permit.taken();
        let slot =
            |k: usize| taken.get(k).map(|&(e, _, _)| self.entry_slot(usize::from(e)).load(Acquire));
        let borrowed = match (slot(0), slot(1)) {
            (Some(key), Some(pool)) => {
                key & KEY_ENTRY != 0 && pool & KEY_ENTRY == 0 && key as u32 == pool as u32
            }
            _ => false,
        };
        taken
            .iter()
            .enumerate()
            .filter(|&(k, _)| !(borrowed && k == 1))
            .filter_map(|(_, &(e, _, id))| self.slot_level_at(usize::from(e), id))
            .collect()
    }

    /// `fields` (a chain's `RateLimit-Policy` and `RateLimit` values, if any) with the items
    /// of the concurrency caps appended ([`ratelimit::concurrency_fields`]): every capped
    /// level `permits` hold a slot of, or the one that `refused` the request.
    ///
    /// [`ratelimit::concurrency_fields`]: crate::ratelimit::concurrency_fields
    pub fn with_slot_fields(
        &self,
        fields: Option<(String, String)>,
        permits: &[Permit],
        refused: Option<QuotaId>,
    ) -> Option<(String, String)> {
        let slots = match refused {
            Some(id) => {
                let levels: Vec<_> = self.slot_level(id).into_iter().collect();
                crate::ratelimit::concurrency_fields(&levels, true)
            }
            None if permits.is_empty() => None,
            None => {
                let levels: Vec<_> = permits.iter().flat_map(|p| self.permit_levels(p)).collect();
                crate::ratelimit::concurrency_fields(&levels, false)
            }
        };
        match (fields, slots) {
            (Some((p, s)), Some((cp, cs))) => Some((format!("{p}, {cp}"), format!("{s}, {cs}"))),
            (fields, slots) => fields.or(slots),
        }
    }

    /// The level of counter `id` (one that refused an acquire), as [`permit_levels`](Self::permit_levels).
    pub fn slot_level(&self, id: QuotaId) -> Option<SlotLevel> {
        self.find_entry(id).ok().and_then(|e| self.slot_level_at(e, id))
    }

    fn slot_level_at(&self, e: usize, id: QuotaId) -> Option<SlotLevel> {
        if e >= self.layout.permit_cap || self.entry_id(e).load(Acquire) != id {
            return None;
        }
        let p = self.entry_permits(e);
        let word = self.entry_slot(e).load(Acquire);
        Some(SlotLevel {
            name: self.entry_name(e, id),
            cap: word_cap(word),
            remaining: p.share(self.clock.now_nanos()).saturating_sub(p.in_flight()),
            key: (word & KEY_ENTRY != 0).then_some(id),
        })
    }

    /// The counter a deleted entry counted the slots of (0: none); see `set_permit_entry`.
    fn deleted_owner(&self, e: usize) -> u64 {
        self.entry_slot(e).load(Acquire)
    }

    /// Counts an acquire entry `e` refused (or would have, in shadow mode).
    fn count_refusal(&self, e: usize) {
        self.entry_refused(e).fetch_add(1, Relaxed);
        self.hdr(hdr::PERMIT_REFUSALS).fetch_add(1, Relaxed);
    }

    pub(super) fn entry_refused(&self, e: usize) -> &AtomicU64 {
        &self.words()[self.layout.permit_slots + 2 * e + 1]
    }

    /// Gives counter `id` an entry if it is `capped` (`Some((quota slot, max_in_flight))`),
    /// or frees its entry if not. Writer only (the sync agent applying quotas, under the
    /// writer lock); request paths make keys' entries beside it ([`Limiter::acquire`]).
    pub(super) fn set_permit_entry(&self, id: QuotaId, capped: Option<(u32, u32)>) {
        if id == EMPTY || id == DELETED || id == BUSY {
            return;
        }
        match (self.find_entry(id), capped) {
            (Err(_), None) => {}
            (Ok(e), Some(at)) => self.entry_slot(e).store(slot_word(at), Release),
            (Ok(e), None) => {
                // Deleted, the entry keeps the id it had in its slot word: requests that
                // hold slots still give them back (by entry and id), so the count is right
                // if the cap comes back; once the entry goes to another counter they
                // change nothing. Not in its refusals' word, which a request refused just
                // before the delete may still add 1 to (the owner would become the next
                // quota's id, and that quota would take the entry over with this count).
                self.entry_slot(e).store(id, Release);
                self.entry_id(e).store(DELETED, Release);
                self.hdr(hdr::PERMITS_LIVE).fetch_sub(1, Relaxed);
            }
            (Err(_), Some(at)) => {
                if self.make_entry(id, slot_word(at)).is_none() {
                    self.hdr(hdr::PERMITS_REFUSED).fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Makes counter `id`'s entry, its slot word `word`, unless another process makes it at
    /// the same moment (then that one); `None` when the table is full (or another stays in
    /// the middle of making an entry on the way for longer than it should: it died there).
    fn make_entry(&self, id: QuotaId, word: u64) -> Option<usize> {
        for _ in 0..BUSY_TRIES {
            let e = match self.probe_entry(id, true) {
                Ok(e) => return Some(e),
                Err(Missing::Busy) => {
                    std::hint::spin_loop();
                    continue;
                }
                Err(Missing::Free(None)) => return None,
                Err(Missing::Free(Some(e))) => e,
            };
            if let Some(made) = self.make_entry_at(e, id, word) {
                return Some(made);
            }
        }
        None
    }

    /// Makes counter `id`'s entry at free entry `e` (found by a probe), its slot word
    /// `word`: `e`, or the entry of `id` that another process made earlier on the probe
    /// path meanwhile; `None` if another process took `e` first.
    fn make_entry_at(&self, e: usize, id: QuotaId, word: u64) -> Option<usize> {
        let prev = self.entry_id(e).load(Acquire);
        if prev == DELETED && self.deleted_owner(e) == id {
            // The counter's own deleted entry: the requests admitted under it still
            // run and give their slots back to it, here and in the ledger, so it comes
            // back with its count (and the share it may still hold from the roots,
            // which count it until its lease ends), never through a moment in which a
            // release would miss it.
            if self.entry_id(e).compare_exchange(prev, id, AcqRel, Acquire).is_err() {
                return None;
            }
            self.entry_slot(e).store(word, Release);
            self.entry_refused(e).store(0, Release);
            self.hdr(hdr::PERMITS_LIVE).fetch_add(1, Relaxed);
            return Some(self.keep_first_entry(id, e));
        }
        if (prev != EMPTY && prev != DELETED)
            || self.entry_id(e).compare_exchange(prev, BUSY, AcqRel, Acquire).is_err()
        {
            return None;
        }
        self.entry_slot(e).store(word, Release);
        self.entry_refused(e).store(0, Release);
        let p = self.entry_permits(e);
        p.renew();
        p.publish(0, 0);
        p.take_round();
        // Cleared before the id is published, and again after: an acquire of the
        // entry's previous counter that counts in the ledger meanwhile is wiped by the
        // second, or sees the new id and takes its count back (`acquire`).
        self.ledger_clear_column(e);
        // Published only if still this process's: a process stopped here for longer than
        // the agent waits for a dead maker (`sweep_busy_entries`, a round) may find the
        // entry freed and taken by another counter, whose id must stay.
        if self.entry_id(e).compare_exchange(BUSY, id, AcqRel, Acquire).is_err() {
            return None;
        }
        self.ledger_clear_column(e);
        self.hdr(hdr::PERMITS_LIVE).fetch_add(1, Relaxed);
        Some(self.keep_first_entry(id, e))
    }

    /// Two processes making one counter's entry at once, each at a free entry of its probe
    /// path (one took an EMPTY entry further on while the agent freed an earlier one, which
    /// the other then took), both publish: the one further along the path gives way, so
    /// that every request finds one entry. Each looks again once its own is published,
    /// waiting out entries being made on the way, so whichever publishes last sees the
    /// other. A request that found the one giving way in the moment before gives its slot
    /// back and tries again (`count_taken`).
    fn keep_first_entry(&self, id: QuotaId, e: usize) -> usize {
        for _ in 0..BUSY_TRIES {
            match self.probe_entry(id, true) {
                Err(Missing::Busy) => std::hint::spin_loop(),
                Ok(first) if first != e => {
                    if self.entry_id(e).compare_exchange(id, DELETED, AcqRel, Acquire).is_ok() {
                        self.hdr(hdr::PERMITS_LIVE).fetch_sub(1, Relaxed);
                    }
                    return first;
                }
                _ => return e,
            }
        }
        e
    }

    /// The entry counting key `id`'s slots (the key in key slot `s`), made now if the key
    /// is new here (`None` when there is no room: counted), with its template's entry and
    /// id; `None` if its template has no cap.
    fn key_permit_entry(&self, s: u32, id: QuotaId) -> Option<(Option<usize>, usize, QuotaId)> {
        let t = self.template_of_key(s)?;
        let tid = self.live_slot(t)?.id();
        let te = self.find_entry(tid).ok()?;
        let cap = word_cap(self.entry_slot(te).load(Acquire));
        if cap == 0 {
            return None;
        }
        if let Ok(e) = self.find_entry(id) {
            return Some((Some(e), te, tid));
        }
        // Clients choose keys: a quarter of the table stays for the quotas' caps, which
        // arrive whenever an operator adds one.
        let cap_entries = self.layout.permit_cap as u64;
        let room = self.hdr(hdr::PERMITS_LIVE).load(Relaxed) < cap_entries - cap_entries / 4;
        let made = room.then(|| self.make_entry(id, slot_word((t, cap)) | KEY_ENTRY | KEY_FRESH));
        let made = made.flatten();
        if made.is_none() {
            self.hdr(hdr::PERMITS_REFUSED).fetch_add(1, Relaxed);
        }
        Some((made, te, tid))
    }

    /// `pairs` (key, template) with the keys of `reports` that it lacks, each with the
    /// template its entry names: a key capped by its template may have no count to sync,
    /// and a root grants shares only to keys whose template it learnt.
    pub(crate) fn with_permit_templates(
        &self,
        mut pairs: Vec<(QuotaId, QuotaId)>,
        reports: &[crate::proto::InFlightReport],
    ) -> Vec<(QuotaId, QuotaId)> {
        for r in reports {
            if !is_key_id(r.id) || pairs.iter().any(|p| p.0 == r.id) {
                continue;
            }
            let Ok(e) = self.find_entry(r.id) else { continue };
            let word = self.entry_slot(e).load(Acquire);
            let t = (word as u32).checked_sub(1).and_then(|t| self.live_slot(t));
            if let (true, Some(t)) = (word & KEY_ENTRY != 0, t) {
                pairs.push((r.id, t.id()));
            }
        }
        pairs
    }

    /// A root answered for key `id` on this host (the sync agent, applying a grant): from
    /// now on its requests run on its own shares only.
    pub(crate) fn key_entry_answered(&self, id: QuotaId) {
        if let Ok(e) = self.find_entry(id) {
            self.entry_slot(e).fetch_and(!KEY_FRESH, AcqRel);
        }
    }

    /// Takes a slot of every capped level of `name`'s chain for a request starting now, all
    /// or nothing, on the shares this host holds (no I/O, no lock: one compare-and-swap per
    /// capped level). A name without a quota, or whose chain has no cap here, is admitted
    /// with an empty permit.
    ///
    /// Shares come from the roots' grants, which the [`SyncEngine`](crate::SyncEngine)
    /// publishes into the permits ([`Limiter::permits`]): until the first grant (or once
    /// the grants lapsed) a capped quota refuses every acquire. A process that joined the
    /// ledger ([`Limiter::join_ledger`]) counts the slots there too, so they come back if it
    /// dies holding them.
    pub fn acquire<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> Acquired {
        if self.hdr(hdr::PERMITS_LIVE).load(Relaxed) == 0 {
            return Acquired::Admitted(Permit::default());
        }
        // A level whose entry changed hands under the request gives back what it took and
        // the request tries once more (see `count_taken`).
        let name = name.as_ref();
        let mut refused = None;
        for _ in 0..2 {
            match self.try_acquire(name) {
                Ok(done) => return done,
                Err(id) => refused = Some(id),
            }
        }
        Acquired::Refused(refused.unwrap_or_default())
    }

    fn try_acquire(&self, name: &[u8]) -> Result<Acquired, QuotaId> {
        let now = self.clock.now_nanos();
        let mut permit = Permit::default();
        let Some((mut s, mut slot)) = self.resolve(name, now) else {
            return Ok(Acquired::Admitted(permit));
        };
        // A key's id read once the writer's claim over it (while it gives the key new
        // numbers) is gone; one it still holds (its agent stopped or died inside the
        // rewrite) is capped by its template's own counter, as a key still being inserted.
        let mut first_id = None;
        let mut would = None;
        if self.is_key_slot(s) {
            let id = self.settled_id(&slot);
            if crate::zone::keys::is_claim(id) {
                let Some(t) = self.template_of_key(s) else {
                    return Ok(Acquired::Admitted(permit));
                };
                let Some(x) = self.live_slot(t) else { return Ok(Acquired::Admitted(permit)) };
                (s, slot) = (t, x);
            } else {
                first_id = Some(id);
            }
        }
        for level in 0..MAX_CHAIN {
            let level_id = match first_id.take() {
                Some(id) => id,
                None => slot.id(),
            };
            // A key (only ever the chain's first level) is capped by its template: its
            // entry is made on first sight, here, with no share until the roots grant one.
            // Until a root has answered for it, a request that finds no share of the key's
            // own takes a slot of the template's own counter (capped at the same C across
            // the cluster, for every key without a share of its own together), so a key
            // new to this host is not refused for the round trip its first grant takes.
            // A key that found no room for an entry runs on the template's own counter,
            // with every other such key (as a key that found no room in the key table
            // runs on the template's bucket): capped together rather than not at all.
            let (entry, pool, level_id) = if level == 0 && is_key_id(level_id) {
                match self.key_permit_entry(s, level_id) {
                    Some((Some(e), te, tid)) => (Some(e), Some((te, tid)), level_id),
                    Some((None, te, tid)) => (Some(te), None, tid),
                    None => (None, None, level_id),
                }
            } else {
                (self.find_entry(level_id).ok(), None, level_id)
            };
            if let Some(own) = entry {
                let counted = match self.entry_permits(own).acquire_in(now) {
                    Some(g) => self.count_taken(&mut permit, own, g, level_id),
                    None => {
                        let fresh = self.entry_slot(own).load(Acquire) & KEY_FRESH != 0;
                        match pool.filter(|_| fresh).and_then(|(te, tid)| {
                            Some((te, tid, self.entry_permits(te).acquire_in(now)?))
                        }) {
                            Some((te, tid, tg)) => {
                                // Counted on the key too: its share, once granted, covers
                                // what it runs here, and the roots hear of it in the key's
                                // report.
                                let g = self.entry_permits(own).add_in();
                                if self.count_taken(&mut permit, own, g, level_id) {
                                    self.count_taken(&mut permit, te, tg, tid)
                                } else {
                                    self.entry_permits(te).release_in(tg);
                                    false
                                }
                            }
                            // In shadow mode a cap counts what it would refuse and lets the
                            // request on without a slot of it.
                            None if slot.shadow() => {
                                self.count_refusal(own);
                                would = would.or(Some(level_id));
                                true
                            }
                            None => {
                                self.count_refusal(own);
                                self.release(&permit);
                                return Ok(Acquired::Refused(level_id));
                            }
                        }
                    }
                };
                if !counted {
                    self.release(&permit);
                    return Err(level_id);
                }
            }
            let p = slot.parent();
            match (p != 0).then(|| self.live_slot(p - 1)).flatten() {
                Some(next) => slot = next,
                None => break,
            }
        }
        Ok(match would {
            Some(id) => Acquired::WouldRefuse(permit, id),
            None => Acquired::Admitted(permit),
        })
    }

    /// Counts the slot just taken of entry `e` (counter `id`) in this process's ledger row
    /// and in `permit`.
    /// `false` (and nothing counted) if the entry went to another counter between finding
    /// it and taking the slot (a worker preempted there while the agent freed it and a
    /// request path made it anew): the count must not stay on the new counter, which would
    /// never give it back.
    fn count_taken(&self, permit: &mut Permit, e: usize, generation: u32, id: QuotaId) -> bool {
        self.ledger_taken(e);
        if !self.holds(e, id) {
            self.ledger_released(e);
            self.entry_permits(e).release_in(generation);
            return false;
        }
        permit.taken[usize::from(permit.len)] = (e as u16, generation, id);
        permit.len += 1;
        true
    }

    /// Gives back the slots of `permit` (a request ended). Idempotent only in the sense
    /// that a slot never goes below zero: release each permit once.
    pub fn release(&self, permit: &Permit) {
        self.release_then(permit, || {});
    }

    /// [`release`](Self::release), running `between` after each level was found still its
    /// counter's and before its slot is given back (a test's preemption).
    #[inline(always)]
    fn release_then(&self, permit: &Permit, mut between: impl FnMut()) {
        for &(e, generation, id) in permit.taken() {
            let e = usize::from(e);
            if e < self.layout.permit_cap && self.holds(e, id) {
                self.ledger_released(e);
                between();
                // The generation, not the check above, makes it this counter's slot: the
                // entry may have been freed and made for another counter since.
                self.entry_permits(e).release_in(generation);
            }
        }
    }
}

#[cfg(test)]
impl Limiter {
    /// Where counter `id`'s probe path starts.
    pub(crate) fn permit_start(&self, id: QuotaId) -> usize {
        (hash_id(id) % self.layout.permit_cap as u64) as usize
    }

    /// Makes counter `id`'s entry as a process that probed, found a free entry, then was
    /// preempted while `meanwhile` ran, would: at the entry it found. The entry it settled
    /// on, and every entry that holds `id` after.
    pub(crate) fn make_entry_preempted(
        &self,
        id: QuotaId,
        meanwhile: impl FnOnce(),
    ) -> (Option<usize>, Vec<usize>) {
        let Err(Missing::Free(Some(e))) = self.probe_entry(id, true) else {
            panic!("no free entry for {id}")
        };
        meanwhile();
        let got = self.make_entry_at(e, id, 0);
        let cap = self.layout.permit_cap;
        (got, (0..cap).filter(|&k| self.entry_id(k).load(Acquire) == id).collect())
    }

    /// Releases `permit` as a process preempted after finding each level still its
    /// counter's, while `meanwhile` ran, would.
    pub(crate) fn release_preempted(&self, permit: &Permit, meanwhile: impl FnOnce()) {
        let mut meanwhile = Some(meanwhile);
        self.release_then(permit, || {
            if let Some(f) = meanwhile.take() {
                f()
            }
        });
    }

    /// Makes counter `id`'s entry (as a request path does for a key).
    pub(crate) fn make_permit_entry(&self, id: QuotaId) -> Option<usize> {
        self.make_entry(id, 0)
    }

    /// Leaves every free entry as a process killed while making it would (tests); how
    /// many.
    pub(crate) fn leave_free_entries_busy(&self) -> usize {
        (0..self.layout.permit_cap)
            .filter(|&e| self.entry_id(e).compare_exchange(EMPTY, BUSY, AcqRel, Acquire).is_ok())
            .count()
    }
}
