//! The sync engine's side of concurrency quotas: for each counter with a permit entry in
//! the zone, the book of what each root granted ([`HostShares`]), the reports each round
//! sends, the grants each answer brings, and the publishing of the shares into the zone's
//! permits between rounds (see [`crate::concurrency`]).

use crate::concurrency::{Due, Grant, HostShares, MAX_LEASE_NS};
use crate::limiter::Limiter;
use crate::proto::{InFlightGrant, InFlightReport};
use crate::quota::QuotaId;
use crate::shard::Shard;
use crate::zone::keys::is_key_id;
use std::collections::HashMap;

/// Rounds with nothing admitted, refused or running after which a key's permit entry goes
/// while the permit table is at least half full ...
const KEY_QUIET_ROUNDS: u32 = 3;
/// ... and after which it goes anyway. Entries are freed sparingly: a freed entry is a
/// tombstone the table's probes walk past until another counter takes it.
const KEY_IDLE_ROUNDS: u32 = 60;

/// What the engine knows of its concurrency counters.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    books: HashMap<QuotaId, HostShares>,
    /// The sequence of the last reports: a root takes each report once. From the monotonic
    /// clock, so an agent that takes over from another (a worker restarted) goes on above
    /// what its predecessor sent under the same limiter id.
    seq: u64,
    /// When the reports in flight were sent: a grant holds from then on.
    sent_at: u64,
    /// Permit entries found half made at the last round ([`Limiter::sweep_busy_entries`]).
    busy: Vec<usize>,
}

impl InFlight {
    /// The reports of a round starting at `now`, per root (by index among `shards`, the
    /// shard of each root; a counter goes to the roots of its own shard). Each counter's
    /// demand is measured over the time since it was last measured, when that is at least
    /// `min_span` (else the last demand is sent again: see
    /// [`HostShares::round_at_least`]).
    pub(super) fn reports(
        &mut self,
        limiter: &Limiter,
        shards: &[u32],
        count: u32,
        now: u64,
        min_span: u64,
    ) -> Vec<Vec<InFlightReport>> {
        let mut out = vec![Vec::new(); shards.len()];
        limiter.sweep_busy_entries(&mut self.busy);
        let entries = limiter.permit_entries();
        // Counters whose cap (or quota) went leave the book.
        self.books.retain(|id, _| entries.iter().any(|(e, _)| e == id));
        if entries.is_empty() {
            return out;
        }
        self.seq = (self.seq + 1).max(now);
        self.sent_at = now;
        let mut sorted = entries;
        sorted.sort_unstable_by_key(|e| e.0);
        for (id, permits) in sorted {
            let book = self.books.entry(id).or_insert_with(|| HostShares::new(shards.len(), now));
            let (demand, refused) = book.round_at_least(now, permits, min_span);
            // A key's entry goes once nothing has run on it for a while (keys come and go
            // by the million; the table holds at most 1,024 entries), sooner when the table
            // fills, or at once when its template lost its cap. The roots count what they
            // granted it until its lease ends, as for any share.
            let quiet = book.quiet_rounds();
            let idle = permits.in_flight() == 0
                && (quiet >= KEY_IDLE_ROUNDS
                    || (quiet >= KEY_QUIET_ROUNDS && limiter.permit_table_half_full()));
            if is_key_id(id) && (idle || !limiter.key_entry_capped(id)) {
                limiter.free_key_entry(id);
                self.books.remove(&id);
                continue;
            }
            let shard = Shard::of(id, count);
            for (r, &s) in shards.iter().enumerate() {
                if s == shard {
                    let report = book.report(r, now, self.seq, permits, demand, refused);
                    out[r].push(InFlightReport { id, report });
                }
            }
        }
        out
    }

    /// Takes root `root`'s grants, received at `now`, and publishes the shares. `true` if
    /// a share shrank: the roots should hear at once that it is applied.
    pub(super) fn apply(
        &mut self,
        limiter: &Limiter,
        root: usize,
        grants: &[InFlightGrant],
        now: u64,
    ) -> bool {
        let mut shrank = false;
        for g in grants {
            let (Some(book), Some(permits)) = (self.books.get_mut(&g.id), limiter.permits(g.id))
            else {
                continue;
            };
            // No more than the cap, for no longer than a root may grant: a forged grant
            // (a root that lies, a man in the middle) admits no more than an honest one.
            let grant = Grant {
                share: g.grant.share.min(limiter.permit_cap(g.id).unwrap_or(u32::MAX)),
                lease_ns: g.grant.lease_ns.min(MAX_LEASE_NS),
            };
            shrank |= book.apply(root, grant, self.sent_at, now, permits.in_flight());
            if is_key_id(g.id) {
                limiter.key_entry_answered(g.id);
            }
            book.poll(now, permits, u64::MAX);
        }
        shrank
    }

    /// The frequent poll between rounds: publishes every counter's shares (a lapsed lease
    /// stops admissions on time), and says whether the roots should hear from this host
    /// now (it refuses requests, at most once in `early_gap`; or it runs within shares that
    /// shrank).
    ///
    /// Also says (second) whether a counter has an entry and no book yet (a key a request
    /// path met for the first time, which runs on its template's slots until its first
    /// grant), looking at most
    /// once in `new_gap`: a round then brings its grant sooner. Clients choose keys, so
    /// those rounds come out of the engine's early-round budget.
    pub(super) fn poll(
        &mut self,
        limiter: &Limiter,
        now: u64,
        early_gap: u64,
        new_gap: u64,
    ) -> (bool, bool) {
        let mut due = false;
        for (id, book) in &mut self.books {
            if let Some(permits) = limiter.permits(*id) {
                due |= book.poll(now, permits, early_gap) != Due::No;
            }
        }
        let fresh = !due
            && now.saturating_sub(self.sent_at) >= new_gap
            && limiter.permit_entries().iter().any(|(id, _)| !self.books.contains_key(id));
        (due, fresh)
    }
}
