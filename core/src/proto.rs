//! The limiter ↔ root sync messages (JSON over `POST /v1/sync`, documented in
//! `docs/sync-protocol.md`).
//!
//! Amounts are integer milli-units (1 unit = 1000), so a message round-trips exactly.
//!
//! Two encodings carry the same messages, chosen by content type: JSON (protocol v1,
//! `application/json`, for debugging and old limiters) and the compact binary [`v2`]
//! (`application/x-yarl-sync+v2`). The `v` field of the types below is the version of the
//! messages' meaning, 1 in both; the binary encoding carries its own version byte.

use crate::quota::{Epoch, QuotaId, QuotaUpdate};
use crate::shard::Shard;
use serde::{Deserialize, Serialize};

pub mod v2;

/// The protocol version this crate speaks; a root refuses any other.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest accepted limiter id, in bytes.
pub const MAX_LIMITER_ID_LEN: usize = 128;

/// Most batches one request may carry: a limiter keeps at most this many unacknowledged
/// (30 by default, `SyncConfig::max_pending_batches`). In memory a batch is 72 bytes and an
/// empty one 2 on the wire of v2: the cap keeps a body's decoded size near its own.
pub const MAX_BATCHES: usize = 1_024;

/// How recently a root must have heard from a limiter to count it in
/// [`SyncResponse::limiters`], ns: ten regular rounds at the default interval, so a limiter
/// that stopped leaves the count within seconds, and one that syncs at most every few
/// seconds still counts.
pub const LIVE_LIMITER_WINDOW: u64 = 10_000_000_000;

/// What a limiter sends to each root once per interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    /// Protocol version ([`PROTOCOL_VERSION`]).
    pub v: u32,
    /// Unique id of this limiter process, random at start.
    pub limiter: String,
    /// The root instance this limiter last heard from at this address; when it differs from
    /// the root's own, `since` is ignored and the root answers every counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_instance: Option<u64>,
    /// That root's counter version in its previous answer to this limiter.
    #[serde(default)]
    pub since: u64,
    /// Highest quota epoch the limiter holds.
    #[serde(default)]
    pub epoch: Epoch,
    /// Local deltas not yet acknowledged by this root, oldest first. A batch is resent
    /// unchanged until acknowledged; the root applies each `seq` once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<DeltaBatch>,
    /// The limiter's view of cluster fills `[id, fill]`, sent when this root may have lost
    /// state (restart, first contact, dropped batches); the root takes the max.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<(QuotaId, u64)>,
    /// The highest quota epoch the limiter ever applied (`epoch` can go back to 0 for a
    /// refetch; this never does): the hints are as of it, so a root drops hints for quotas
    /// reset after it. Absent from limiters that predate resets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_epoch: Option<Epoch>,
    /// Answer only the counters this limiter named lately (in a batch, a hint or `watch`,
    /// within the root's interest time, 10 s by default), instead of every counter changed in
    /// the cluster: an answer then grows with what this limiter serves, not with the
    /// cluster's churn. A counter named for the first time is answered even if it did not
    /// change since `since`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub interest: bool,
    /// Counters this limiter decided on since its last request without counting anything
    /// (`yarl_check`), sorted: they join its interest like the counters of its batches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub watch: Vec<QuotaId>,
    /// For each key (a name under a template: its id has the top bit set, see
    /// [`crate::zone::keys::key_id`]) this request names in a batch, a hint or `watch`: its
    /// template's id, sorted by key. Keys have no row in the database: this is how a root
    /// learns a key's limits and creates its counter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_templates: Vec<(QuotaId, QuotaId)>,
    /// With hints: the batches up to this `seq` are in them (another root took them, and
    /// its fills are this limiter's view). A root that does not know this limiter's session
    /// under its current instance (it restarted, or is new) takes the hints and skips those
    /// batches, which every other limiter's hints carry too; counting both doubled them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hinted_seq: Option<u64>,
    /// For each concurrency counter (a quota with `max_in_flight`) this limiter serves:
    /// what it holds of this root's part, runs and was offered since its last report (see
    /// [`crate::concurrency`]). The root answers each with a grant in
    /// [`SyncResponse::grants`]. Sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<InFlightReport>,
    /// How long (ns) before this request the limiter last merged an answer from a root of
    /// this shard: the age of the view its hints are read from, and the time the batches
    /// it kept since were counted over. A root that started after that answer knows the
    /// view holds none of the batches it sums itself, so it adds such hints to what it
    /// summed rather than taking the max (see `RootState::sync_from`); absent, hints merge
    /// by max. At a first contact, late batches are credited for that time
    /// (`RootState::apply_batches`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_age_ns: Option<u64>,
}

/// One concurrency counter's [`Report`](crate::concurrency::Report) in a request. On the
/// wire its fields sit beside `id`; not with `#[serde(flatten)]`, which buffers every
/// unknown field's value whole before it looks at it (a reviewer made a 40 MB body take
/// 600 MB that way), where a plain struct skips them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "wire::InFlightReport", into = "wire::InFlightReport")]
pub struct InFlightReport {
    /// The counter (a quota's id, or a key's).
    pub id: QuotaId,
    /// The report: `seq` orders one limiter's reports (a root takes each once), the
    /// others are slots.
    pub report: crate::concurrency::Report,
}

/// A root's [`Grant`](crate::concurrency::Grant) of a share of one concurrency counter (on
/// the wire as [`InFlightReport`], for the same reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "wire::InFlightGrant", into = "wire::InFlightGrant")]
pub struct InFlightGrant {
    /// The counter, as reported.
    pub id: QuotaId,
    /// The share and its lease.
    pub grant: crate::concurrency::Grant,
}

/// The JSON shapes of [`InFlightReport`] and [`InFlightGrant`]: one flat object each.
mod wire {
    use super::QuotaId;
    use crate::concurrency::{Grant, Report};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    pub(super) struct InFlightReport {
        id: QuotaId,
        seq: u64,
        held: u32,
        held_total: u32,
        in_flight: u32,
        demand: u32,
        refused: u32,
    }

    impl From<InFlightReport> for super::InFlightReport {
        fn from(w: InFlightReport) -> Self {
            let InFlightReport { id, seq, held, held_total, in_flight, demand, refused } = w;
            let report = Report { seq, held, held_total, in_flight, demand, refused };
            super::InFlightReport { id, report }
        }
    }

    impl From<super::InFlightReport> for InFlightReport {
        fn from(r: super::InFlightReport) -> Self {
            let Report { seq, held, held_total, in_flight, demand, refused } = r.report;
            InFlightReport { id: r.id, seq, held, held_total, in_flight, demand, refused }
        }
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct InFlightGrant {
        id: QuotaId,
        share: u32,
        lease_ns: u64,
    }

    impl From<InFlightGrant> for super::InFlightGrant {
        fn from(w: InFlightGrant) -> Self {
            super::InFlightGrant { id: w.id, grant: Grant { share: w.share, lease_ns: w.lease_ns } }
        }
    }

    impl From<super::InFlightGrant> for InFlightGrant {
        fn from(g: super::InFlightGrant) -> Self {
            InFlightGrant { id: g.id, share: g.grant.share, lease_ns: g.grant.lease_ns }
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What one limiter counted during one interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaBatch {
    /// Per-limiter sequence number, increasing.
    pub seq: u64,
    /// `[quota id, admitted milli-units, rejected milli-units]`: what passed (and was added
    /// to the counter) and what was refused (only feeds the demand meter).
    pub deltas: Vec<(QuotaId, u64, u64)>,
    /// The limiter's `seen_epoch` when it took the batch: counted before a reset of a quota
    /// at a later epoch, so a root drops its deltas for that quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    /// Empty, or one amount per entry of `deltas`: of its admitted milli-units, what this
    /// limiter's own exact bucket had already drained when the batch was cut (empty when
    /// none had). A root adds a batch when it arrives, up to an interval after its counts
    /// were made (longer when the limiter's sync agent stalled, or another worker took the
    /// agent's role over); it credits what drained with the drain its counter wasted
    /// meanwhile, as it does for late batches, and a counter that stood empty does not
    /// take the whole interval's counts of a client under its limit at once. Only the
    /// limiter knows when within the span its counts came; counts made at the end of a
    /// quiet span have drained nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<u64>,
}

/// The root's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResponse {
    /// Protocol version.
    pub v: u32,
    /// Random id of this root process, new at every start.
    pub root_instance: u64,
    /// Highest batch `seq` of this limiter the root has applied.
    pub acked_seq: u64,
    /// The root's counter version now; the limiter sends it back as `since`.
    pub version: u64,
    /// Counters changed since `since`: `[id, fill in milli-units now, attempted demand in
    /// milli-units per second]`.
    #[serde(default)]
    pub counters: Vec<(QuotaId, u64, u64)>,
    /// Quotas and tombstones with an epoch above the limiter's, in epoch order.
    #[serde(default)]
    pub quotas: Vec<QuotaUpdate>,
    /// The epoch the limiter holds once it applied `quotas`.
    pub epoch: Epoch,
    /// More quotas are waiting: sync again at once.
    #[serde(default)]
    pub more: bool,
    /// The highest quota epoch this root has applied from the database: a limiter ignores
    /// its fills for quotas it holds a newer version of (a reset the root has not seen yet
    /// would bring old counts back). Absent from roots that predate resets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_epoch: Option<Epoch>,
    /// The cluster's secret that keys' ids are derived with (every root of a cluster reads
    /// the same from the quota database); only to a limiter holding the sync token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<(u64, u64)>,
    /// How many limiters this root heard from lately ([`LIVE_LIMITER_WINDOW`]): a limiter
    /// takes a counter no root has reported yet to be filled that many times over by what
    /// it counted itself, so that a client new to every host at once gets about one burst
    /// cluster-wide, not one per host. Absent from older roots (taken as 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limiters: Option<u32>,
    /// The shard of the counter space this root aggregates (`"1/2"`), absent on a root
    /// that aggregates every counter. A limiter refuses an answer from a root that serves
    /// another shard than it was configured with.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "shard_text")]
    pub shard: Option<Shard>,
    /// The shares of this root's part of each concurrency counter the request reported,
    /// in its order; a counter without `max_in_flight` (or unknown) is granted 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<InFlightGrant>,
}

/// `Option<Shard>` as the text `"index/count"` in JSON.
mod shard_text {
    use crate::shard::Shard;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Option<Shard>, ser: S) -> Result<S::Ok, S::Error> {
        match s {
            Some(s) => ser.collect_str(s),
            None => ser.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Shard>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| t.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Why a root refused a sync request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    /// The request speaks another protocol version.
    #[error("unsupported protocol version {0}, this root speaks 1")]
    UnsupportedVersion(u32),
    /// The limiter id is empty or too long.
    #[error("limiter id must be 1 to 128 bytes")]
    BadLimiterId,
    /// The root tracks as many limiters as it may; idle ones are forgotten over time.
    #[error("too many limiters ({0}); try again later")]
    TooManyLimiters(usize),
    /// The request carries more deltas, hints and batches than a root accepts at once.
    #[error("request carries {0} entries (deltas + hints + batches), the maximum is {1}")]
    TooLarge(usize, usize),
    /// A batch `seq` runs further ahead of this limiter's last acknowledged one than it
    /// could have counted since its last sync (a limiter makes at most one batch per
    /// interval).
    #[error(
        "batches[].seq {seq} is too far ahead of the last acknowledged seq {acked} \
         (at most {max_ahead} ahead now)"
    )]
    SeqTooFarAhead {
        /// The highest `seq` in the request.
        seq: u64,
        /// The session's acknowledged `seq`.
        acked: u64,
        /// How far ahead it may be now.
        max_ahead: u64,
    },
    /// A batch's `drained` list is neither empty nor one amount per delta.
    #[error("batches[{index}].drained has {len} amounts for {deltas} deltas (0 or one per delta)")]
    BadDrained {
        /// The batch's place in the request.
        index: usize,
        /// Amounts in its `drained`.
        len: usize,
        /// Entries in its `deltas`.
        deltas: usize,
    },
    /// More batches than [`MAX_BATCHES`].
    #[error("request carries {0} batches, the maximum is {MAX_BATCHES}")]
    TooManyBatches(usize),
}
