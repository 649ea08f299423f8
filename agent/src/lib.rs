//! # yarl-agent
//!
//! The sync agent of a [`yarl_core::Limiter`]: a background thread that runs the core's pure
//! [`yarl_core::SyncEngine`] once per interval against every root, in parallel, over HTTP or
//! HTTPS. `yarl-core` itself has no I/O; this crate is the part that talks to the network.
//!
//! * [`HttpTransport`]: `POST {root}/v1/sync` in protocol v2 (binary; JSON v1 for roots
//!   that answer `415`), bearer token, TLS with rustls (the system's trust store, or a CA
//!   file).
//! * [`SyncThread`]: one OS thread with a single-threaded tokio runtime; a [`Supervisor`]
//!   can stop it between rounds (the nginx module uses that to hand the agent role over
//!   between workers).
//! * [`drive`]: the round loop itself, to run as a task on an application's own tokio
//!   runtime instead (the `yarl-tower` crate does).
//! * [`parse_root_url`]: what a root URL may look like.
//!
//! ```no_run
//! use std::sync::Arc;
//! use yarl_agent::{HttpOptions, HttpTransport, SyncThread};
//! use yarl_core::{Limiter, SyncConfig, SyncEngine};
//!
//! let limiter = Arc::new(Limiter::builder().build());
//! let engine = SyncEngine::new(limiter.clone(), vec!["http://127.0.0.1:7700".into()], SyncConfig::default())?;
//! let transport = HttpTransport::new(&HttpOptions::default())?;
//! let sync = SyncThread::spawn(engine, Arc::new(transport))?;
//! let d = limiter.account("s3_photos_read", 1)?;
//! if !d.allowed() { /* 429, Retry-After: d.retry_after */ }
//! sync.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod thread;
mod transport;
mod url;

pub use thread::{drive, NoSupervisor, Supervisor, SyncThread};
pub use transport::{
    load_ca, CallFuture, HttpOptions, HttpTransport, Protocol, Transport, TransportError,
    MAX_ANSWER_BYTES, V2_RETRY,
};
pub use url::parse_root_url;
