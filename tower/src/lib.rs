//! # yarl-tower
//!
//! [`tower`](https://docs.rs/tower) middleware for YARL: **cluster-wide**, weighted,
//! hierarchical rate limits for axum, tonic, hyper or any tower `Service`, decided locally
//! without a network call on the request path.
//!
//! A [`Yarl`] holds a [`yarl_core::Limiter`] (every quota and the cluster-wide counters in
//! memory) and a tokio task that syncs it with the YARL root servers once per interval,
//! like the nginx module's agent: each limiter sends what it counted, the roots sum what
//! every limiter counted and hand out quota changes. A [`YarlLayer`] decides each request
//! on the quotas a [`Rule`] names for it:
//!
//! * [`Quotas::check`]: decide, count nothing (the nginx module's `yarl_check`);
//! * [`Quotas::account`]: decide and, if the request passes, add a weight to the quota and
//!   every ancestor (`yarl_account`); several checks and accounts of one request pass or
//!   fail together, and a rejection adds nothing anywhere;
//! * [`Quotas::charge_body`] and [`Quotas::charge_reported`]: after the response, add a
//!   cost only the response knows (its body's bytes; a [`Cost`] the handler reports)
//!   without deciding (`yarl_charge`): it limits the next requests.
//! * [`Quotas::concurrency`]: hold a slot of a quota's `max_in_flight` (requests in flight
//!   across the cluster) until the response body ends or is dropped (`yarl_concurrency`).
//!
//! Rejections answer `429` (configurable) with `Retry-After`, and with
//! [`YarlLayer::headers`] the same IETF `RateLimit-Policy` / `RateLimit` fields as the
//! module. Names no quota has pass: creating the quota through a root's admin API is how an
//! operator starts limiting, with no restart.
//!
//! # Example
//!
//! An object store: each handler accounts its own quota (`s3_<bucket>_get`, whose parent
//! is the bucket's read quota `s3_<bucket>_read` that an nginx in front checks), and a
//! listing is charged the number of objects it returned.
//!
//! ```no_run
//! use axum::{extract::Path, routing::get, Extension, Router};
//! use http::request::Parts;
//! use yarl_tower::{Cost, Quotas, Yarl};
//!
//! fn bucket(req: &Parts) -> &str {
//!     req.uri.path().split('/').nth(1).unwrap_or_default()
//! }
//!
//! async fn list(Path(bucket): Path<String>) -> (Extension<Cost>, String) {
//!     let keys = vec![format!("{bucket}/a"), format!("{bucket}/b")];
//!     (Extension(Cost(keys.len() as u64)), keys.join("\n"))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let yarl = Yarl::builder()
//!         .roots(["http://127.0.0.1:7700"])
//!         .token(std::fs::read_to_string("/etc/yarl/sync.token")?.trim())
//!         .start()?;
//!     let app = Router::new()
//!         .route(
//!             "/{bucket}/{*key}",
//!             get(|| async { "object" }).layer(yarl.layer(|req: &Parts, q: &mut Quotas| {
//!                 q.account(format!("s3_{}_get", bucket(req)), 1);
//!             })),
//!         )
//!         .route(
//!             "/{bucket}",
//!             get(list).layer(yarl.layer(|req: &Parts, q: &mut Quotas| {
//!                 let name = format!("s3_{}_list", bucket(req));
//!                 q.account(name.clone(), 1).charge_reported(name);
//!             })),
//!         );
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
//!         .await?;
//!     // One last sync round sends what was counted since the previous one.
//!     yarl.shutdown().await;
//!     Ok(())
//! }
//! ```
//!
//! Any tower service works the same way. Here with a limiter whose quota is set by hand
//! instead of coming from a root, and a manual clock, as in the tests:
//!
//! ```
//! use http::{Request, Response, StatusCode};
//! use std::{convert::Infallible, sync::Arc};
//! use tower::{service_fn, Layer, ServiceExt};
//! use yarl_core::{Limiter, Limits, ManualClock, QuotaUpdate};
//! use yarl_tower::{Quotas, Yarl};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let clock = ManualClock::at(1);
//! let limiter = Limiter::builder().clock(Arc::new(clock.clone())).build();
//! limiter.apply_quotas(&[QuotaUpdate {
//!     id: 1, name: "api".into(), epoch: 1, deleted: false, reset_epoch: 0,
//!     limits: Limits::from_units(1.0, 2.0, 2.0).unwrap(), // 1/s, bursts of 2
//!     parent: None,
//! }]);
//! let yarl = Yarl::unsynced(Arc::new(limiter));
//! let hello = service_fn(|_: Request<String>| async {
//!     Ok::<_, Infallible>(Response::new(String::from("hello")))
//! });
//! let svc = yarl
//!     .layer(|_: &http::request::Parts, q: &mut Quotas| { q.account("api", 1); })
//!     .headers(true)
//!     .layer(hello);
//!
//! // Fill 0, 1, 2: at most low_burst, pass.
//! for _ in 0..3 {
//!     let r = svc.clone().oneshot(Request::new(String::new())).await.unwrap();
//!     assert_eq!(r.status(), StatusCode::OK);
//! }
//! let r = svc.clone().oneshot(Request::new(String::new())).await.unwrap();
//! assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(r.headers()["retry-after"], "1");
//! assert_eq!(r.headers()["ratelimit-policy"], r#""api";q=3;w=3"#);
//! assert_eq!(r.headers()["ratelimit"], r#""api";r=0;t=1"#);
//! # }
//! ```
//!
//! # Brief overview
//!
//! * [`Yarl`], [`YarlBuilder`]: the limiter, its roots, token and CA file, the sync task
//!   and its graceful [`shutdown`](Yarl::shutdown).
//! * [`YarlLayer`], [`YarlService`]: the middleware; [`Rule`] and [`Quotas`]: what it
//!   decides on; [`Cost`]: a cost the handler reports.
//! * [`ResponseFuture`], [`ResponseBody`]: the service's future and response body (which
//!   counts the bytes charged with [`Quotas::charge_body`]).
//!
//! # Cost on the request path
//!
//! A request the rule names one quota for costs a hash lookup, a few atomic loads and, when
//! it passes an account, one atomic add per level of the chain; the sync task works on its
//! own between requests, on the application's runtime: its engine work of a round (tens of
//! milliseconds with 100,000s of changed counters) runs in `tokio::task::block_in_place`
//! on a multi-threaded runtime, so the runtime moves requests to another thread meanwhile
//! (on a current-thread runtime it runs inline, and requests wait). `make bench-tower` compares an axum hello-world with this layer,
//! with `tower-governor`, and with no layer.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod body;
mod future;
mod layer;
mod yarl;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use layer::{Cost, Quotas, Rule, YarlLayer, YarlService, RATELIMIT, RATELIMIT_POLICY};
pub use yarl::{Error, Yarl, YarlBuilder, MAX_ROOTS};
