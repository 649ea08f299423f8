//! `POST /v1/sync`: the limiter ↔ root exchange (wire format: `docs/sync-protocol.md`).
//!
//! JSON is parsed before and serialised after taking the root lock, so the lock is held
//! only for the core's arithmetic.

use crate::admin::read_body;
use crate::error::ApiError;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::time::Instant;
use yarl_core::proto::SyncRequest;

pub(crate) async fn sync(
    State(st): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_body(body, crate::SYNC_BODY_LIMIT)?;
    let req: SyncRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadJson(e.to_string()))?;
    drop(body);
    let started = Instant::now();
    let now = st.now();
    let result = st.0.root.lock().sync(&req, now);
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            st.0.metrics.sync_done(false, started.elapsed());
            return Err(ApiError::Sync(e));
        }
    };
    let json =
        serde_json::to_vec(&resp).map_err(|e| ApiError::Internal(format!("sync answer: {e}")))?;
    st.0.metrics.sync_done(true, started.elapsed());
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
}
