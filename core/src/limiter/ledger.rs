//! The ledger of who holds the permits: a row per process that acquires, counting what it
//! holds of each permit entry, so that the slots of a process that died without releasing
//! them (an nginx worker killed with `-9`, a crash) go back to the counters instead of
//! leaking until the zone is made again.
//!
//! A process joins with its pid ([`Limiter::join_ledger`]) and leaves when it exits
//! ([`Limiter::leave_ledger`]); any process may reap the rows of dead ones
//! ([`Limiter::reap_ledger`], with a liveness test the embedder supplies: `core` makes no
//! system call). A row's owner word says who it belongs to; reaping first swaps it to "being
//! reaped by me", so two reapers never give the same slots back twice, and a reaper that
//! dies half way leaves a row the next one finishes (the counts are taken with swaps, so
//! the ones it had taken and not yet given back are lost: a leak, never a double give).
//!
//! One ledger row per process: a second handle in the same process must not join (it
//! would reap the first one's row as a previous life of its pid).
//!
//! The order of the steps makes every race err towards a slot held too long, never one
//! given back too soon (which could admit more than the cap): an acquire counts in the
//! ledger after the permit is taken, a release uncounts before the permit is given back. A
//! process killed between the two leaks that one slot, as without a ledger.
//!
//! Counts are 32 bits, two to a word: a process holds at most a share (below 2^24) of an
//! entry. A new entry's column is cleared when the writer makes it, so counts left for a
//! deleted counter never release the new one's slots.

use super::Limiter;
use crate::zone::{hdr, ledger_row_words, LEDGER_ROWS};
use std::sync::atomic::{AtomicU64, Ordering::*};

const FREE: u64 = 0;
/// Owner word: `OWNED | pid` while the process lives, `REAPING | reaper's pid` while its
/// slots are given back.
const OWNED: u64 = 1 << 32;
const REAPING: u64 = 2 << 32;
const STATE: u64 = 0xFFFF_FFFF << 32;
const HALF: u64 = 0xFFFF_FFFF;

impl Limiter {
    fn ledger_row_at(&self, r: usize) -> &[AtomicU64] {
        let w = ledger_row_words(self.layout.permit_cap);
        let at = self.layout.ledger + r * w;
        &self.words()[at..at + w]
    }

    /// The word and bit shift of entry `e`'s count in row `r`.
    fn ledger_cell(&self, r: usize, e: usize) -> (&AtomicU64, u32) {
        (&self.ledger_row_at(r)[1 + e / 2], if e.is_multiple_of(2) { 0 } else { 32 })
    }

    /// Counts a slot of entry `e` taken by this process (after the permit was taken).
    pub(super) fn ledger_taken(&self, e: usize) {
        let row = self.ledger_row.load(Relaxed);
        if row != 0 {
            let (w, shift) = self.ledger_cell(row - 1, e);
            w.fetch_add(1 << shift, Relaxed);
        }
    }

    /// Uncounts a slot of entry `e` (before the permit is given back). Never below zero: a
    /// column cleared for a new counter while a request of the old one ran stays at zero.
    pub(super) fn ledger_released(&self, e: usize) {
        let row = self.ledger_row.load(Relaxed);
        if row != 0 {
            let (w, shift) = self.ledger_cell(row - 1, e);
            let _ = w.fetch_update(Release, Relaxed, |v| {
                ((v >> shift) & HALF != 0).then(|| v - (1 << shift))
            });
        }
    }

    /// Clears entry `e`'s column in every row: the writer made the entry for a new counter.
    pub(super) fn ledger_clear_column(&self, e: usize) {
        for r in 0..LEDGER_ROWS {
            let (w, shift) = self.ledger_cell(r, e);
            w.fetch_and(!(HALF << shift), Relaxed);
        }
    }

    /// Takes a ledger row for the process `pid`, so what it acquires from now on is given
    /// back if it dies holding it. First reaps the rows of dead processes (`alive` says
    /// whether a pid still runs) and any row left under `pid` itself (a process that had the
    /// same pid before). `false` when every row is taken by a live process: this process
    /// acquires without a ledger (counted: [`Limiter::ledger_figures`]).
    pub fn join_ledger(&self, pid: u32, alive: impl Fn(u32) -> bool) -> bool {
        if self.ledger_row.load(Relaxed) != 0 {
            return true;
        }
        let me = OWNED | u64::from(pid);
        self.reap_ledger(pid, |p| p != pid && alive(p));
        for r in 0..LEDGER_ROWS {
            if self.ledger_row_at(r)[0].compare_exchange(FREE, me, AcqRel, Relaxed).is_ok() {
                self.ledger_owner.store(me, Relaxed);
                self.ledger_row.store(r + 1, Relaxed);
                return true;
            }
        }
        self.hdr(hdr::LEDGER_FULL).fetch_add(1, Relaxed);
        false
    }

    /// Gives back what this process still holds and frees its row (the process is exiting;
    /// call it after its last request).
    pub fn leave_ledger(&self) {
        let row = self.ledger_row.swap(0, Relaxed);
        if row != 0 {
            let owner = &self.ledger_row_at(row - 1)[0];
            let held = owner.load(Acquire);
            // Only a row still this process's: one reaped and taken by another is not.
            if held == self.ledger_owner.load(Relaxed)
                && owner.compare_exchange(held, REAPING | (held & HALF), AcqRel, Relaxed).is_ok()
            {
                self.give_back(row - 1);
                owner.store(FREE, Release);
            }
        }
    }

    /// Gives back the slots held by processes that died (`alive(pid)` false), and finishes
    /// rows whose reaper died; `reaper` is the calling process's pid. Returns the slots
    /// given back. Any process may call it at any time; the sync agent's worker does at
    /// every tick.
    pub fn reap_ledger(&self, reaper: u32, alive: impl Fn(u32) -> bool) -> u64 {
        let mut given = 0;
        for r in 0..LEDGER_ROWS {
            let owner = &self.ledger_row_at(r)[0];
            let w = owner.load(Acquire);
            let state = w & STATE;
            if w == FREE || (state != OWNED && state != REAPING) || alive((w & HALF) as u32) {
                continue;
            }
            let mine = REAPING | u64::from(reaper);
            if owner.compare_exchange(w, mine, AcqRel, Relaxed).is_ok() {
                given += self.give_back(r);
                owner.store(FREE, Release);
            }
        }
        if given > 0 {
            self.hdr(hdr::LEDGER_REAPED).fetch_add(given, Relaxed);
        }
        given
    }

    fn give_back(&self, r: usize) -> u64 {
        let mut given = 0;
        for (i, w) in self.ledger_row_at(r)[1..].iter().enumerate() {
            if w.load(Relaxed) == 0 {
                continue;
            }
            // The counters the counts belong to, and their words' generations, read before the
            // counts are taken: an entry the writer gives to another counter meanwhile (its
            // column cleared, a generation started) must not get them.
            let ids = [self.permit_entry_owner(2 * i), self.permit_entry_owner(2 * i + 1)];
            let gens =
                [self.permit_entry_generation(2 * i), self.permit_entry_generation(2 * i + 1)];
            let v = w.swap(0, AcqRel);
            for (k, n) in [(0, v & HALF), (1, v >> 32)] {
                if n != 0 && self.permit_entry_release_many(2 * i + k, ids[k], gens[k], n as u32) {
                    given += n;
                }
            }
        }
        given
    }

    /// Processes that found no ledger row, and slots given back from dead processes' rows.
    pub fn ledger_figures(&self) -> (u64, u64) {
        (self.hdr(hdr::LEDGER_FULL).load(Relaxed), self.hdr(hdr::LEDGER_REAPED).load(Relaxed))
    }
}
