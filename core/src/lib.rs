//! # yarl-core
//!
//! Distributed rate limiting with **local decisions**, after Yandex's YARL. Every limiter (an
//! nginx worker, an application) holds all quotas and the cluster-wide counters in memory and
//! decides on each request without a network call; a sync agent (the `yarl-agent` crate, or
//! the nginx module's) syncs with one or more root servers once per interval. This crate has
//! no I/O: clocks and randomness are injected, and all state lives in a memory block the
//! embedder provides ([`zone`]), so one limiter can be shared by several processes.
//!
//! # Brief overview
//!
//! * [`quota`]: the quota model (`limit`, `low_burst`, `high_burst`, parent) and validation.
//! * [`units`]: exact fixed-point counters (why they cannot drift or overflow).
//! * [`decision`]: pass / reject / reject with probability `(F - low) / (high - low)`, and
//!   Retry-After.
//! * [`zone`]: the memory block and its layout (offsets, no pointers: heap or shared memory).
//! * [`Limiter`]: the quota table for millions of quotas with a lock-free read path;
//!   `check` (count nothing) and `account` (all-or-nothing over the parent chain).
//! * [`sync`]: the limiter's sync state machine.
//! * [`root`]: the root server's aggregation: sums limiters' deltas exactly once.
//! * [`shard`]: the counter space split across groups of roots.
//! * [`proto`]: the versioned wire messages between them.
//! * [`concurrency`]: requests in flight capped cluster-wide, by shares of `C` under leases.
//! * [`ratelimit`]: the IETF `RateLimit-Policy` / `RateLimit` header fields for a chain.
//!
//! ```
//! use yarl_core::{Limiter, Limits, QuotaUpdate, Outcome};
//!
//! let limiter = Limiter::default();
//! limiter.apply_quotas(&[QuotaUpdate {
//!     id: 1, name: "api".into(), epoch: 1, deleted: false, reset_epoch: 0,
//!     limits: Limits::from_units(10.0, 2.0, 2.0).unwrap(), parent: None,
//! }]);
//! assert_eq!(limiter.account("api", 1).unwrap().outcome, Outcome::Passed);
//! assert_eq!(limiter.check("unknown").outcome, Outcome::Unlimited);
//! ```
//!
//! A limiter with no roots still wants rounds: a [`sync::SyncEngine`] with no root URLs
//! folds its counts into its view once per interval. Never folded, the time a count
//! started draining from is kept to the millisecond for 24.8 days, and a bucket never
//! empty that long stops draining.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod concurrency;
pub mod decision;
mod limiter;
pub mod proto;
pub mod quota;
pub mod ratelimit;
pub mod root;
pub mod shard;
pub mod sync;
pub mod units;
pub mod zone;

pub use clock::{Clock, ManualClock, MonotonicClock};
pub use decision::{Decision, Outcome, Random, SeededRandom, ThreadRandom};
pub use limiter::{
    Acquired, AgentLease, ApplyReport, ConcurrencyInfo, ConcurrencyStatus, Estimator, Limiter,
    LimiterBuilder, Permit, QuotaInfo, SlotLevel, TemplateKeys, WeightError, WriteSection,
    ZoneStatus, DEFAULT_CAPACITY, DEFAULT_KEYS, MAX_CHAIN, SECTION_STALE_NS,
};
pub use quota::{
    display_name, escape_name, in_flight_from_number, is_template, raw_name, validate_name, Epoch,
    Limits, QuotaError, QuotaId, QuotaSpec, QuotaUpdate, MAX_IN_FLIGHT,
};
pub use root::{RootConfig, RootState};
pub use shard::Shard;
pub use sync::{SyncConfig, SyncEngine, SyncStatus};
pub use zone::{Block, Prepared, ZoneError, ZoneUsage};
