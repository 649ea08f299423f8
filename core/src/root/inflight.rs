//! Concurrency counters at a root: the escrow of this root's part of each one's
//! `max_in_flight`, and the shares it grants the limiters that report on it (the rules are
//! in [`crate::concurrency`]).
//!
//! Every root of a counter's shard is one replica of its escrow: `--replica i/n` says which,
//! and replica `i` owns [`replica_part`] of the cap, so replicas that never talk to each other
//! never grant more than the cap between them. A limiter is a holder by a hash of its whole
//! id (the printed half and the secret half), so a sync-token holder who read another
//! limiter's printed id cannot report, and take shares, as it; and a session this root
//! forgot and meets again keeps its place in the escrow.

use super::{IdMap, IdSet, RootState};
use crate::concurrency::{replica_part, Escrow, EscrowStats, Grant, HolderId};
use crate::proto::{InFlightGrant, SyncRequest};
use crate::quota::QuotaId;
use crate::zone::keys::is_key_id;
use std::collections::VecDeque;
use std::hash::BuildHasher;

/// The escrows of one root (or stripe), by counter.
#[derive(Debug, Default)]
pub(super) struct Escrows {
    by_id: IdMap<Escrow>,
    /// Every escrow's id once, in the order the sweep looks at them (a few per step, so a
    /// root with millions never stops to look at all of them at once): one whose leases
    /// all ended goes, the others go to the back. An id whose escrow went meanwhile is
    /// dropped when it comes up.
    queue: VecDeque<QuotaId>,
    /// The ids in `queue`.
    queued: IdSet,
    /// Hashes limiter ids into holder ids, with this process's random seed.
    seed: foldhash::quality::RandomState,
}

impl RootState {
    /// The grants answering `req`'s concurrency reports (those of this stripe's counters),
    /// at `now`. A quota with no `max_in_flight` here (or no quota this root knows) is
    /// granted 0, and its escrow, if the cap was just removed, goes; a key without an entry
    /// or a cap gets no grant at all.
    pub(super) fn grant_shares(&mut self, req: &SyncRequest, now: u64) -> Vec<InFlightGrant> {
        if req.in_flight.is_empty() {
            return Vec::new();
        }
        let holder: HolderId = self.escrows.seed.hash_one(req.limiter.as_str());
        let lease_ns = self.config.lease_ns;
        let (index, count) = self.config.replica;
        let mut out = Vec::with_capacity(req.in_flight.len());
        for r in &req.in_flight {
            if !self.stripe.contains(r.id) || !self.in_shard(r.id) {
                continue;
            }
            // A key gets an entry from a report only under a template with a cap: an entry
            // made for nothing would hold a place of the bounded keys until the template
            // goes, and honest limiters report every key they run.
            let known = self.quotas.contains_key(&r.id)
                || (self.asked_template_cap(r.id) > 0 && self.key_entry(r.id));
            let cap =
                if known { self.live_limits(r.id).map_or(0, |l| l.max_in_flight()) } else { 0 };
            let grant = if cap == 0 {
                if self.escrows.by_id.remove(&r.id).is_some() {
                    self.forget_if_bare(r.id);
                }
                if is_key_id(r.id) {
                    // A key this root holds no entry for (over its bounds on keys, or its
                    // template lost its cap) gets no answer: the host goes on running it
                    // on the template's own counter, as a key it found no room for,
                    // rather than refusing it for good on a share of 0.
                    continue;
                }
                Grant { share: 0, lease_ns }
            } else {
                let part = replica_part(cap, index, count);
                let max_holders = self.config.max_holders;
                let escrows = &mut self.escrows;
                if escrows.queued.insert(r.id) {
                    escrows.queue.push_back(r.id);
                }
                let e = escrows
                    .by_id
                    .entry(r.id)
                    .or_insert_with(|| Escrow::new(cap, part, lease_ns, max_holders));
                if e.capacity() != cap {
                    e.set_part(cap, part);
                }
                e.report(holder, now, &r.report)
            };
            out.push(InFlightGrant { id: r.id, grant });
        }
        out
    }

    /// The `max_in_flight` of the template this request says key `id` belongs to (0: none,
    /// or not a key).
    fn asked_template_cap(&self, id: QuotaId) -> u32 {
        self.keys.asked.get(&id).and_then(|&t| self.live_limits(t)).map_or(0, |l| l.max_in_flight())
    }

    /// Looks at up to `max` escrows (from the front of the queue; all of them once with
    /// `None`) and drops those left with no holder at `now` (their leases ended), with the
    /// entry of a key that has nothing else: so that a root no one scrapes does not keep
    /// one per key it ever granted, and no sweep step holds the lock for all of them.
    pub(super) fn sweep_escrows(&mut self, now: u64, max: Option<usize>) {
        let n = max.unwrap_or(usize::MAX).min(self.escrows.queue.len());
        for _ in 0..n {
            let Some(id) = self.escrows.queue.pop_front() else { break };
            let holders = self.escrows.by_id.get_mut(&id).map(|e| e.stats(now).holders);
            let live = holders.is_some_and(|h| h > 0);
            if holders == Some(0) {
                self.escrows.by_id.remove(&id);
            }
            if live {
                self.escrows.queue.push_back(id);
            } else {
                self.escrows.queued.remove(&id);
                self.forget_if_bare(id);
            }
        }
    }

    /// Whether counter `id` has an escrow here.
    pub(super) fn has_escrow(&self, id: QuotaId) -> bool {
        self.escrows.by_id.contains_key(&id)
    }

    /// Each concurrency counter's escrow figures at `now` (leases ended by then dropped),
    /// by id, with the quota's name (`None` for a key: names of keys are clients' data and
    /// stay out of metrics).
    pub fn in_flight_stats(&mut self, now: u64) -> Vec<(QuotaId, Option<String>, EscrowStats)> {
        let mut rows: Vec<_> =
            self.escrows.by_id.iter_mut().map(|(&id, e)| (id, e.stats(now))).collect();
        rows.sort_unstable_by_key(|s| s.0);
        rows.into_iter()
            .map(|(id, s)| {
                let name = (!is_key_id(id)).then(|| self.quota(id).map(|q| q.name.clone()));
                (id, name.flatten(), s)
            })
            .collect()
    }
}
