//! Concurrency quotas: at most `C` requests in flight across the cluster, decided on each
//! host without asking anyone.
//!
//! A rate can be overspent for a moment and paid back; requests in flight cannot: a slot
//! taken is held until the request ends. So counting in flight the way rates are counted
//! (each host adds what it started, the roots sum) would admit `C` on every host between
//! two rounds. Instead the capacity is held **in escrow**:
//!
//! * each root replica of the counter's shard owns a fixed part of `C` (replica `i` of `n`
//!   owns `C / n`, the first `C mod n` replicas one more), so replicas that never talk to
//!   each other can never hand out more than `C` between them;
//! * a root grants each limiter a **share** of its part, under a **lease**; the shares it
//!   has granted, counted as explained below, never sum past its part ([`Escrow`]);
//! * a host admits a request while its in-flight count is under the sum of its unexpired
//!   shares, with one atomic compare-and-swap and no I/O ([`Permits`]);
//! * every round it reports to each root what it holds from it, its in-flight count, the
//!   most it had in flight since its last report and the acquires it refused; the root
//!   moves shares to where the demand is.
//!
//! # Why the shares never sum past `C`
//!
//! A root cannot know when a limiter applies an answer, nor whether it got it. So for each
//! limiter it keeps two figures: what it last *granted*, and what the limiter last said it
//! *holds* (the share it applied, as of its report). It counts the larger of the two, plus
//! whatever the limiter still runs above all its shares (after a share shrank, requests
//! already admitted finish in their own time). A grant only grows out of what is free
//! after counting every other limiter that way; a shrink takes effect in the root's books
//! only once the limiter's next report says it holds the smaller share. Reports carry the
//! limiter's batch sequence: a late or replayed report changes nothing.
//!
//! # Leases, clocks and the guarantee
//!
//! A limiter takes a grant as valid until the moment it *sent* the report the grant answers
//! plus the lease, less a margin, on its own monotonic clock; the root counts the grant
//! until it *received* that report plus the lease, on its clock. The send happens before
//! the receipt, so only the clocks' rates matter: with the margin (a thousandth of the
//! lease plus 50 ms) rates may differ by 0.1 % and the limiter still stops using a share
//! before the root hands it to anyone else. Then:
//!
//! * **new admissions never take the cluster above `C`**: each is made under a share that
//!   its root still counts;
//! * a host that **dies** (its requests die with it) or is **cut off** loses its shares
//!   when its leases end; the survivors get them at their next round after that: at most
//!   the lease plus one interval;
//! * the one excess: requests a **cut-off** host admitted before its lease ended and that
//!   are still running after it. The cluster then runs at most that host's share above
//!   `C`, for as long as those requests run (a host cut off past its lease admits nothing
//!   more). With requests shorter than the lease, as in most uses, the bound is never
//!   reached.
//!
//! The price: a share moves from a host that stopped needing it to one that needs it in
//! about two rounds (the giver's report, its acknowledgement, the taker's report), and a
//! host whose demand appears from nothing waits for a round (the root keeps spare capacity
//! spread over every host while the cluster's demand is under `C`, so only a saturated
//! cluster makes a host wait).

mod escrow;
pub(crate) mod permits;

pub use escrow::{Escrow, EscrowStats, HolderId};
pub use permits::{Due, HostShares, PermitWords, Permits, PERMIT_WORDS};

/// What a limiter tells one root, at each sync, about one concurrency counter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// The limiter's batch sequence: a report at or below the last one seen is a replay
    /// and changes nothing.
    pub seq: u64,
    /// The share of this root's part it holds now: the last grant it applied, or 0 once
    /// that grant's lease ended.
    pub held: u32,
    /// What it holds from every root together (unexpired).
    pub held_total: u32,
    /// Requests in flight on the host as it sends the report.
    pub in_flight: u32,
    /// The concurrency it was offered since its previous report, in thousandths of a slot:
    /// what it ran on average, scaled up by the requests it turned away (see
    /// [`HostShares::round`]).
    pub demand: u32,
    /// Acquires it refused since its previous report.
    pub refused: u32,
}

/// A root's answer to a [`Report`]: the share the limiter may use, and for how long after
/// it sent the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    /// The share of this root's part.
    pub share: u32,
    /// The lease (ns): the share is valid until the report's send time plus this, less
    /// [`lease_margin`].
    pub lease_ns: u64,
}

/// The longest lease a limiter takes from a root's grant (roots grant 200 ms to 60 s): a
/// forged lease of an hour would keep a share after its root went away.
pub const MAX_LEASE_NS: u64 = 60_000_000_000;

/// What a limiter takes off a lease so that it stops using a share before the root counts
/// it free: clocks whose rates differ by up to 0.1 % and 50 ms of scheduling.
pub fn lease_margin(lease_ns: u64) -> u64 {
    lease_ns / 1000 + 50_000_000
}

/// The part of `capacity` replica `index` of `replicas` owns: the parts sum to `capacity`.
pub fn replica_part(capacity: u32, index: u32, replicas: u32) -> u32 {
    let n = replicas.max(1);
    capacity / n + u32::from(index < capacity % n)
}

#[cfg(test)]
mod tests;
