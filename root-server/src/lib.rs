//! # yarl-root
//!
//! The YARL root server: limiters send it what they counted, it sums the deltas of all
//! limiters (exactly once, in memory) and answers with the cluster-wide counters and the
//! quotas they have not seen yet. Quotas live in a database (SQLite or PostgreSQL) that
//! several roots may share; an admin API drives it with curl.
//!
//! # Brief overview
//!
//! * [`app`]: the router (sync route, admin routes, health, metrics), testable without a
//!   socket.
//! * [`AppState`]: the core's `RootState` behind a lock, plus the store and the poller.
//! * [`db`]: the [`db::QuotaStore`] trait and its SQLite and PostgreSQL implementations.
//! * [`ApiError`]: every error and its status.
//! * [`quotas_file`]: the client side of `yarl-root quotas export|apply` (quota trees as
//!   YAML files, applied in one batch).
//!
//! # Routes and body limits
//!
//! | route | body limit | body deadline | at once | token |
//! |---|---|---|---|---|
//! | `POST /v1/sync` | [`SYNC_BODY_LIMIT`] | 10 s | 2 × cores, and 256 MiB of bodies | sync |
//! | `POST /v1/quotas:batch` | [`BATCH_BODY_LIMIT`] | 60 s | 1 | admin |
//! | `PUT/GET/DELETE /v1/quotas/{name}`, `POST /v1/quotas/{name}:reset`, `GET /v1/quotas`, `GET /v1/copy` | [`BODY_LIMIT`] | 10 s | 32 | admin |
//! | `GET /healthz`, `GET /metrics`, `GET /v1/openapi.json` | none read | — | — | none |
//!
//! A declared `Content-Length` over the limit is refused before reading; a request that
//! waits longer than `Settings::queue_wait` (a sync: `Settings::sync_queue_wait`) for its
//! turn gets `503` with `Retry-After`.
//! The accept loop ([`serve`]) adds the connection cap, the header and idle timeout, TLS
//! ([`tls`]) and the bounded graceful shutdown.
//!
//! `/v1/quotas:batch` cannot collide with a quota name: names are matched only after
//! `/v1/quotas/`, so a quota called `quotas:batch` is `/v1/quotas/quotas:batch`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod auth;
pub mod db;
mod error;
mod guard;
mod metrics;
mod openapi;
pub mod quotas_file;
pub mod serve;
mod state;
mod sync_api;
pub mod tls;

pub use error::ApiError;
pub use state::{default_stripes, default_sync_concurrency, AppState, Background, Settings};
pub use sync_api::SYNC_BODY_TIMEOUT;

use axum::extract::State;
use axum::http::{header, Uri};
use axum::middleware::from_fn_with_state;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use std::sync::Arc;

/// Body limit of the admin and other small routes (1 MiB).
pub const BODY_LIMIT: usize = 1 << 20;
/// Body limit of `POST /v1/sync` (64 MiB: a limiter with a million active counters sends
/// about 30 MB of deltas).
pub const SYNC_BODY_LIMIT: usize = 64 << 20;
/// Body limit of `POST /v1/quotas:batch` (256 MiB: a million quotas take about 100 MB).
pub const BATCH_BODY_LIMIT: usize = 256 << 20;

/// The whole HTTP API over `state`.
pub fn app(state: AppState) -> Router {
    let token = |t: &Option<String>| auth::Token(t.as_deref().map(|t| Arc::from(t.as_bytes())));
    let admin_token = token(&state.0.settings.admin_token);
    let sync_token = token(&state.0.settings.sync_token);

    let admin = Router::new()
        .route("/v1/quotas", get(admin::list))
        .route("/v1/quotas:batch", post(admin::batch))
        .route("/v1/copy", get(admin::copy))
        .route(
            "/v1/quotas/{name}",
            put(admin::put).get(admin::get).delete(admin::delete).post(admin::action),
        )
        // route_layer: only matched routes ask for a token, so unknown paths stay 404s.
        .route_layer(from_fn_with_state(admin_token, auth::require));
    let sync = Router::new()
        .route("/v1/sync", post(sync_api::sync))
        .route_layer(from_fn_with_state(sync_token, auth::require));

    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_json))
        .merge(admin)
        .merge(sync)
        .fallback(|uri: Uri| async move { ApiError::NoRoute(uri.path().to_owned()) })
        .method_not_allowed_fallback(|uri: Uri| async move {
            let mut resp = ApiError::MethodNotAllowed.into_response();
            // axum keeps an `Allow` the fallback set, and adds its own otherwise.
            if uri.path().starts_with("/v1/quotas/") && !uri.path().ends_with(":reset") {
                resp.headers_mut()
                    .insert(header::ALLOW, header::HeaderValue::from_static(error::QUOTA_METHODS));
            }
            resp
        })
        // Outermost: sees every answer, including the 401s of the token layers.
        .layer(from_fn_with_state(state.clone(), guard::observe))
        .layer(axum::middleware::from_fn(serve::close_if_body_left))
        .with_state(state)
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Health {
    /// Always `ok`: the root answers.
    #[schema(pattern = "^ok$")]
    status: &'static str,
    /// Whether the last database access worked; a root serves its limiters either way.
    database: DbHealth,
    /// The newest quota epoch this root has loaded.
    epoch: u64,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum DbHealth {
    Up,
    Down,
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = 200, description = "The root is up.", body = Health)),
)]
async fn healthz(State(st): State<AppState>) -> Json<Health> {
    use std::sync::atomic::Ordering::Relaxed;
    let db_up = !st.0.metrics.db_down.load(Relaxed);
    Json(Health {
        status: "ok",
        database: if db_up { DbHealth::Up } else { DbHealth::Down },
        epoch: st.epoch(),
    })
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4.", body = String, content_type = "text/plain"),
    ),
)]
async fn metrics(State(st): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let snap = st.snapshot().await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        st.0.metrics.render(&snap, st.0.store.kind()),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    responses(
        (status = 200, description = "This document.", body = Object, content_type = "application/json"),
    ),
)]
async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], openapi::json())
}
