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
//! [`Permit`] remembers the entries it took (and their ids, so a release after the entry
//! was freed and reused for another counter touches nothing).

use super::writer::hash_id;
use super::Limiter;
use crate::concurrency::{Permits, PERMIT_WORDS};
use crate::quota::QuotaId;
use crate::zone::{hdr, PERMIT_ENTRY_WORDS};
use crate::MAX_CHAIN;
use std::sync::atomic::{AtomicU64, Ordering::*};

const EMPTY: u64 = 0;
const DELETED: u64 = u64::MAX;

/// Slots taken by [`Limiter::acquire`] at every capped level of a quota's chain; give them
/// back with [`Limiter::release`] when the request ends, however it ends. Plain data (no
/// pointers), so a request can keep it wherever it keeps its state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Permit {
    /// (entry, counter id) of each slot taken, leaf first.
    taken: [(u16, QuotaId); MAX_CHAIN],
    len: u8,
}

impl Permit {
    /// Whether it holds no slot (no level of the chain has a cap on this host).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn taken(&self) -> &[(u16, QuotaId)] {
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
}

/// One concurrency counter as this host holds it (for `yarl_stats` and metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyInfo {
    /// The quota's name.
    pub name: String,
    /// Its id.
    pub id: QuotaId,
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
}

fn slot_word((slot, cap): (u32, u32)) -> u64 {
    (u64::from(slot) + 1) | (u64::from(cap) << 32)
}

impl Limiter {
    fn permit_region(&self) -> &[AtomicU64] {
        let l = &self.layout;
        &self.words()[l.permits..l.permits + l.permit_cap * PERMIT_ENTRY_WORDS]
    }

    fn entry_id(&self, e: usize) -> &AtomicU64 {
        &self.permit_region()[e * PERMIT_ENTRY_WORDS]
    }

    fn entry_permits(&self, e: usize) -> Permits<'_> {
        let at = e * PERMIT_ENTRY_WORDS + 1;
        let words: &[AtomicU64; PERMIT_WORDS] = self.permit_region()[at..at + PERMIT_WORDS]
            .try_into()
            .expect("a permit entry holds PERMIT_WORDS words after its id");
        Permits::new(words)
    }

    /// The entry of counter `id`: `Ok(entry)`, or `Err(first free or deleted entry seen)`
    /// when it has none (`Err(None)`: the table is full).
    fn find_entry(&self, id: QuotaId) -> Result<usize, Option<usize>> {
        let cap = self.layout.permit_cap;
        let start = (hash_id(id) % cap as u64) as usize;
        let mut free = None;
        for k in 0..cap {
            let e = (start + k) % cap;
            match self.entry_id(e).load(Acquire) {
                w if w == id => return Ok(e),
                EMPTY => return Err(free.or(Some(e))),
                // The counter's own deleted entry comes first: made again there, it keeps
                // counting the requests it admitted before (see `set_permit_entry`).
                DELETED if self.entry_refused(e).load(Acquire) == id => free = Some(e),
                DELETED => free = free.or(Some(e)),
                _ => {}
            }
        }
        Err(free)
    }

    /// The counter whose slots entry `e` counts: its id, or, deleted, the id it had (0 or
    /// all ones: none).
    pub(super) fn permit_entry_owner(&self, e: usize) -> u64 {
        match self.entry_id(e).load(Acquire) {
            DELETED => self.entry_refused(e).load(Acquire),
            id => id,
        }
    }

    /// Whether entry `e` counts the slots of counter `id`: it is `id`'s, or `id`'s deleted
    /// entry (requests admitted before a cap was removed still give their slots back, so
    /// the count is right if the cap comes back).
    fn holds(&self, e: usize, id: QuotaId) -> bool {
        if id == EMPTY || id == DELETED {
            return false;
        }
        match self.entry_id(e).load(Acquire) {
            DELETED => self.entry_refused(e).load(Acquire) == id,
            w => w == id,
        }
    }

    /// Gives back `n` slots of entry `e` if it still counts `id`'s; whether it did.
    pub(super) fn permit_entry_release_many(&self, e: usize, id: u64, n: u32) -> bool {
        let ours = self.holds(e, id);
        if ours {
            self.entry_permits(e).release_many(n);
        }
        ours
    }

    /// The permits of counter `id` on this host, if it has a cap here: for the sync agent
    /// (publishing shares, taking a round's figures) and for inspection.
    pub fn permits(&self, id: QuotaId) -> Option<Permits<'_>> {
        self.find_entry(id).ok().map(|e| self.entry_permits(e))
    }

    /// Every concurrency counter with its figures now, by name.
    pub fn concurrency_status(&self) -> ConcurrencyStatus {
        let now = self.clock.now_nanos();
        let mut quotas: Vec<ConcurrencyInfo> = (0..self.layout.permit_cap)
            .filter_map(|e| {
                let id = self.entry_id(e).load(Acquire);
                if id == EMPTY || id == DELETED {
                    return None;
                }
                let p = self.entry_permits(e);
                Some(ConcurrencyInfo {
                    name: self.entry_name(e, id),
                    id,
                    in_flight: p.in_flight(),
                    share: p.share(now),
                    refused: self.entry_refused(e).load(Relaxed),
                })
            })
            .collect();
        quotas.sort_by(|a, b| a.name.cmp(&b.name));
        let (ledger_full, reaped) = self.ledger_figures();
        ConcurrencyStatus {
            quotas,
            entries_refused: self.hdr(hdr::PERMITS_REFUSED).load(Relaxed),
            ledger_full,
            reaped,
        }
    }

    /// Every counter with a permit entry, and its permits.
    pub fn permit_entries(&self) -> Vec<(QuotaId, Permits<'_>)> {
        (0..self.layout.permit_cap)
            .filter_map(|e| match self.entry_id(e).load(Acquire) {
                EMPTY | DELETED => None,
                id => Some((id, self.entry_permits(e))),
            })
            .collect()
    }

    /// `slot + 1 | max_in_flight << 32` of entry `e`'s quota (0: unknown).
    fn entry_slot(&self, e: usize) -> &AtomicU64 {
        &self.words()[self.layout.permit_slots + 2 * e]
    }

    fn entry_name(&self, e: usize, id: QuotaId) -> String {
        match self.entry_slot(e).load(Acquire) as u32 {
            0 => format!("#{id}"),
            s => self.slot_name(s - 1),
        }
    }

    /// Each capped level `permit` holds a slot of, for the RateLimit fields: its name, cap
    /// and what this host can still admit on it now.
    pub fn permit_levels(&self, permit: &Permit) -> Vec<SlotLevel> {
        permit
            .taken()
            .iter()
            .filter_map(|&(e, id)| self.slot_level_at(usize::from(e), id))
            .collect()
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
        Some(SlotLevel {
            name: self.entry_name(e, id),
            cap: (self.entry_slot(e).load(Acquire) >> 32) as u32,
            remaining: p.share(self.clock.now_nanos()).saturating_sub(p.in_flight()),
        })
    }

    fn entry_refused(&self, e: usize) -> &AtomicU64 {
        &self.words()[self.layout.permit_slots + 2 * e + 1]
    }

    /// Gives counter `id` an entry if it is `capped` (`Some((quota slot, max_in_flight))`),
    /// or frees its entry if not. Writer only (the sync agent applying quotas, under the
    /// writer lock).
    pub(super) fn set_permit_entry(&self, id: QuotaId, capped: Option<(u32, u32)>) {
        if id == EMPTY || id == DELETED {
            return;
        }
        match (self.find_entry(id), capped) {
            (Err(_), None) => {}
            (Ok(e), Some(at)) => self.entry_slot(e).store(slot_word(at), Release),
            (Ok(e), None) => {
                // Deleted, the entry keeps the id it had in its refusals' word: requests
                // that hold slots still give them back (by entry and id), so the count is
                // right if the cap comes back; once the entry goes to another counter
                // they change nothing.
                self.entry_refused(e).store(id, Release);
                self.entry_id(e).store(DELETED, Release);
                self.hdr(hdr::PERMITS_LIVE).fetch_sub(1, Relaxed);
            }
            (Err(Some(e)), Some(at)) if self.holds(e, id) => {
                // The cap is back where it was: the requests admitted under it still run
                // and are still counted, here and in the ledger.
                self.entry_slot(e).store(slot_word(at), Release);
                let p = self.entry_permits(e);
                p.publish(0, 0);
                p.take_round();
                self.entry_id(e).store(id, Release);
                self.entry_refused(e).store(0, Relaxed);
                self.hdr(hdr::PERMITS_LIVE).fetch_add(1, Relaxed);
            }
            (Err(Some(e)), Some(at)) => {
                self.entry_slot(e).store(slot_word(at), Release);
                self.entry_refused(e).store(0, Release);
                let p = self.entry_permits(e);
                p.release_many(u32::MAX);
                p.publish(0, 0);
                p.take_round();
                // Cleared before the id is published, and again after: an acquire of the
                // entry's previous counter that counts in the ledger meanwhile is wiped
                // by the second, or sees the new id and takes its count back (`acquire`).
                self.ledger_clear_column(e);
                self.entry_id(e).store(id, Release);
                self.ledger_clear_column(e);
                self.hdr(hdr::PERMITS_LIVE).fetch_add(1, Relaxed);
            }
            (Err(None), Some(_)) => {
                self.hdr(hdr::PERMITS_REFUSED).fetch_add(1, Relaxed);
            }
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
        let now = self.clock.now_nanos();
        let mut permit = Permit::default();
        if self.hdr(hdr::PERMITS_LIVE).load(Relaxed) == 0 {
            return Acquired::Admitted(permit);
        }
        let Some((_, mut slot)) = self.resolve(name.as_ref(), now) else {
            return Acquired::Admitted(permit);
        };
        for _ in 0..MAX_CHAIN {
            let id = slot.id();
            if let Ok(e) = self.find_entry(id) {
                if !self.entry_permits(e).acquire(now) {
                    self.entry_refused(e).fetch_add(1, Relaxed);
                    self.release(&permit);
                    return Acquired::Refused(id);
                }
                self.ledger_taken(e);
                if self.entry_id(e).load(Acquire) != id {
                    // The entry went to another counter meanwhile: this slot's count must
                    // not stay in its column.
                    self.ledger_released(e);
                }
                permit.taken[usize::from(permit.len)] = (e as u16, id);
                permit.len += 1;
            }
            let p = slot.parent();
            match (p != 0).then(|| self.live_slot(p - 1)).flatten() {
                Some(next) => slot = next,
                None => break,
            }
        }
        Acquired::Admitted(permit)
    }

    /// Gives back the slots of `permit` (a request ended). Idempotent only in the sense
    /// that a slot never goes below zero: release each permit once.
    pub fn release(&self, permit: &Permit) {
        for &(e, id) in permit.taken() {
            let e = usize::from(e);
            if e < self.layout.permit_cap && self.holds(e, id) {
                self.ledger_released(e);
                self.entry_permits(e).release();
            }
        }
    }
}
