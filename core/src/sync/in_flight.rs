//! The sync engine's side of concurrency quotas: for each counter with a permit entry in
//! the zone, the book of what each root granted ([`HostShares`]), the reports each round
//! sends, the grants each answer brings, and the publishing of the shares into the zone's
//! permits between rounds (see [`crate::concurrency`]).

use crate::concurrency::{Due, Grant, HostShares};
use crate::limiter::Limiter;
use crate::proto::{InFlightGrant, InFlightReport};
use crate::quota::QuotaId;
use crate::shard::Shard;
use std::collections::HashMap;

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
            let grant = Grant { share: g.grant.share, lease_ns: g.grant.lease_ns };
            shrank |= book.apply(root, grant, self.sent_at, now, permits.in_flight());
            book.poll(now, permits, u64::MAX);
        }
        shrank
    }

    /// The frequent poll between rounds: publishes every counter's shares (a lapsed lease
    /// stops admissions on time), and says whether the roots should hear from this host
    /// now (it refuses requests, at most once in `early_gap`; or it runs within shares that
    /// shrank).
    pub(super) fn poll(&mut self, limiter: &Limiter, now: u64, early_gap: u64) -> bool {
        let mut due = false;
        for (id, book) in &mut self.books {
            if let Some(permits) = limiter.permits(*id) {
                due |= book.poll(now, permits, early_gap) != Due::No;
            }
        }
        due
    }
}
