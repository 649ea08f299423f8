//! # yarl-sim
//!
//! A deterministic simulator of a YARL cluster. It drives the **real** `yarl-core` state
//! machines (`Limiter`, `SyncEngine`, `RootState`) from a discrete-event loop on a virtual
//! clock, so what it measures is what the product does, not what a model of it would do.
//! The network between limiters and roots is simulated: each sync call is made at `t`,
//! reaches its root at `t + rtt/2` and is answered at `t + rtt` (or times out), with jitter,
//! lost calls and per-host clock skew.
//!
//! [`reference`] holds the algorithms the report compares with (token bucket per host,
//! fixed window, sliding-window approximation); only those are implemented here.

pub mod cluster;
pub mod concurrency;
pub mod experiments;
pub mod load;
mod metrics;
pub mod reference;

pub use cluster::{run, Network, RunResult, Scenario, Strategy, YarlConfig};
pub use load::{KeyHosts, KeyPattern, KeySpace, Load, Phase, Retry, Spread, Weights};
