//! Stripes: one root's counters split by a hash of their id over several states, each
//! behind a lock of its own, so that syncs apply on several cores at once.

use super::{RootConfig, RootState, RootStats, SyncAnswer};
use crate::quota::QuotaId;
use std::sync::Arc;

/// Most stripes of one root ([`RootState::striped`]).
pub const MAX_STRIPES: u32 = 64;

/// The stripe (of `count`) that holds the counter of quota `id` within one root. Not
/// [`Shard::of`](crate::shard::Shard::of): a root of shard `i/n` holds only ids whose shard
/// hash is `i` mod `n`, and striping it by the same hash would put all of them on one
/// stripe. The high half of a differently seeded splitmix64 spreads them evenly whatever
/// the shard.
pub fn stripe_of(id: QuotaId, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    let mut z = id ^ 0x2545_f491_4f6c_dd1d;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 32) % u64::from(count)) as u32
}

/// Which of its root's counters a state holds: those of quotas whose [`stripe_of`] among
/// `count` is `index`. A root that is not striped is stripe 0 of 1, which holds them all.
/// Not the root's [`Shard`](crate::shard::Shard) (see [`RootState::in_shard`]): a shard is
/// which counters of the cluster a root aggregates, a stripe which of those one lock guards.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stripe {
    index: u32,
    count: u32,
}

impl Stripe {
    /// The whole of a root that is not striped.
    pub(super) const WHOLE: Stripe = Stripe { index: 0, count: 1 };

    /// Whether the counter of quota `id` is this stripe's.
    #[inline]
    pub(super) fn contains(self, id: QuotaId) -> bool {
        stripe_of(id, self.count) == self.index
    }

    /// Whether this is the lead: the stripe that keeps every quota and answers the quota
    /// pages.
    pub(super) fn is_lead(self) -> bool {
        self.index == 0
    }
}

impl RootStats {
    /// Adds the counter-level totals of another stripe of the same root (`self` being the
    /// lead's): deltas, hints, claims and resets happen in one stripe each, while syncs,
    /// sessions and batches are seen by every stripe and counted once, by the lead.
    pub fn add_stripe(&mut self, o: &RootStats) {
        self.deltas_applied += o.deltas_applied;
        self.deltas_unknown += o.deltas_unknown;
        self.deltas_held += o.deltas_held;
        self.deltas_foreign += o.deltas_foreign;
        self.hints_applied += o.hints_applied;
        self.hints_added += o.hints_added;
        self.claims_parked += o.claims_parked;
        self.claims_dropped += o.claims_dropped;
        self.rejected_capped += o.rejected_capped;
        self.hints_capped += o.hints_capped;
        self.hints_late += o.hints_late;
        self.hints_redundant += o.hints_redundant;
        self.late_credited += o.late_credited;
        self.late_credit_taken_back += o.late_credit_taken_back;
        self.late_dropped += o.late_dropped;
        self.resets += o.resets;
        self.dropped_before_reset += o.dropped_before_reset;
        self.keys_created += o.keys_created;
        self.keys_refused += o.keys_refused;
        self.interest_full = self.interest_full.max(o.interest_full);
    }
}

impl RootState {
    /// One root's state split into `count` stripes (1 to [`MAX_STRIPES`]) by a hash of the
    /// counter's id, for a server that puts each behind a lock of its own so that syncs
    /// apply on several cores at once: each sync goes to every stripe in turn, and each
    /// stripe applies the deltas, hints and interest of its own counters. The stripes
    /// share the instance id and the version counter; stripe 0, the lead, also keeps every
    /// quota and answers the quota pages, the others keep only their counters' quotas.
    /// Each stripe holds every session, with `1/count` of the parked, interest and key budgets.
    /// Join the stripes' answers with [`SyncAnswer::join`]; apply quotas to the lead last
    /// (see [`RootState::apply_quota_arcs`]).
    pub fn striped(config: RootConfig, count: u32) -> Vec<RootState> {
        let count = count.clamp(1, MAX_STRIPES);
        if count == 1 {
            return vec![RootState::new(config)];
        }
        let share = |n: usize| n.div_ceil(count as usize);
        let mut part = config.clone();
        part.max_parked = share(config.max_parked);
        part.max_held = share(config.max_held);
        part.max_parked_per_limiter = share(config.max_parked_per_limiter);
        part.max_interest = share(config.max_interest);
        part.max_interest_per_limiter = share(config.max_interest_per_limiter);
        // Keys spread over the stripes by id, as counters do.
        part.max_keys = share(config.max_keys);
        part.max_keys_per_template = share(config.max_keys_per_template);
        let lead = RootState::new(part.clone());
        (0..count)
            .map(|index| RootState {
                instance: lead.instance,
                version: Arc::clone(&lead.version),
                stripe: Stripe { index, count },
                ..RootState::new(part.clone())
            })
            .collect()
    }

    /// Whether this root aggregates the counter of `id` (see [`RootConfig::shard`]), in
    /// whichever of its stripes.
    pub(super) fn in_shard(&self, id: QuotaId) -> bool {
        self.config.shard.is_none_or(|s| s.holds(id))
    }
}

impl SyncAnswer {
    /// One answer from the answers of a root's stripes, in stripe order (the lead first),
    /// to a sync that read `version` ([`RootState::version`]) before it went to the first
    /// stripe: every change up to it is in the stripes' answers or was in an earlier one,
    /// where a version read afterwards could name a change a stripe logged after the sync
    /// had been there. `None` for no answers.
    pub fn join(parts: Vec<SyncAnswer>, version: u64) -> Option<SyncAnswer> {
        let mut parts = parts.into_iter();
        let mut lead = parts.next()?;
        let mut rest = parts.peekable();
        if rest.peek().is_none() {
            return Some(lead);
        }
        lead.version = version;
        for p in rest {
            lead.acked_seq = lead.acked_seq.min(p.acked_seq);
            lead.counters.extend(p.counters);
            lead.grants.extend(p.grants);
        }
        Some(lead)
    }
}
