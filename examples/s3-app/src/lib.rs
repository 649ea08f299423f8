//! # yarl-s3-app
//!
//! A small S3-style object store in the shape of the YARL article's S3: an nginx in front
//! **checks** each bucket's read or write quota (`s3_<bucket>_read`, `s3_<bucket>_write`)
//! without counting anything, and this application, which knows what each request really
//! costs, **accounts** the quota of the handler that serves it, whose parent is the bucket
//! quota nginx checks:
//!
//! | request | handler quota (accounted here) | weight | parent nginx checks |
//! |---|---|---|---|
//! | `GET /{bucket}` (list) | `s3_<bucket>_list` | 1, then 1 per object listed, after the response | `s3_<bucket>_read` |
//! | `GET /{bucket}/{key}` | `s3_<bucket>_get` | 1 | `s3_<bucket>_read` |
//! | `HEAD /{bucket}/{key}` | `s3_<bucket>_head` | 1 | `s3_<bucket>_read` |
//! | `PUT /{bucket}/{key}` | `s3_<bucket>_put` and `s3_<bucket>_bytes_in` (together) | 1 and the body's length | `s3_<bucket>_write` |
//! | `DELETE /{bucket}/{key}` | `s3_<bucket>_delete` | 1 | `s3_<bucket>_write` |
//! | `PUT /{bucket}` | `s3_<bucket>_create` | 1 | `s3_<bucket>_write` |
//! | `DELETE /{bucket}` | `s3_<bucket>_destroy` | 1 | `s3_<bucket>_write` |
//!
//! The parents are an operator's choice made at the roots (`PUT /v1/quotas/s3_photos_list`
//! with `"parent": "s3_photos_read"`), not code: a listing of many objects drains the
//! bucket's read quota by what it cost, so nginx refuses the bucket's next reads after its
//! next sync, before they reach the application.
//!
//! A GET's bytes are charged by the nginx in front (`yarl_charge s3_<bucket>_bytes_out
//! $bytes_sent`, `nginx-conf/s3.conf`), which knows what it really sent to the client; an
//! application serving clients directly would use [`Quotas::charge_body`] instead.
//!
//! Requests are path style (`/photos/cat.jpg`) or virtual-host style
//! (`Host: photos.s3.example.net`, rewritten to path style before routing). Every input
//! is bounded ([`store::Limits`], keys of 1,024 bytes, 1,000 keys per listing, bodies read
//! within 10 s); errors are `{"code": …, "error": …}` with a 4xx status (507 when the whole
//! store is full).
//!
//! This is an example, not S3: no authentication, no multipart uploads, JSON instead of
//! XML, everything in memory.

pub mod error;
pub mod store;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::handler::Handler;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use error::AppError;
use http::request::Parts;
use serde::Deserialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use store::{bucket_name, key_name, valid_bucket, Store, MAX_LIST_KEYS};
use yarl_tower::{Cost, Quotas, Rule, Yarl, YarlLayer};

/// How long a request body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The objects.
    pub store: Arc<Store>,
    /// The limiter and its sync with the roots.
    pub yarl: Yarl,
}

/// The bucket of a path-style request, if its first segment is a bucket name.
fn bucket_of(req: &Parts) -> Option<&str> {
    let first = req.uri.path().strip_prefix('/')?.split('/').next()?;
    valid_bucket(first).then_some(first)
}

/// The layer of a handler: its quota `s3_<bucket>_<op>`, weight 1, plus whatever `more`
/// adds. Requests whose bucket is not a bucket name name no quota (the handler answers 400).
fn handler_quota(
    yarl: &Yarl,
    op: &'static str,
    more: fn(&Parts, &str, &mut Quotas),
) -> YarlLayer<impl Rule> {
    yarl.layer(move |req: &Parts, q: &mut Quotas| {
        if let Some(bucket) = bucket_of(req) {
            q.account(format!("s3_{bucket}_{op}"), 1);
            more(req, bucket, q);
        }
    })
    // The handler quotas' fields tell a client which quota limits it.
    .headers(true)
    .rejection_body(
        HeaderValue::from_static("application/json"),
        r#"{"code":"SlowDown","error":"rate limited by the handler's quota, see Retry-After"}"#,
    )
}

/// A listing's cost grows with what it returns: one unit up front, and the number of
/// objects listed (the handler's [`Cost`]) once it is known.
fn list_cost(_: &Parts, bucket: &str, q: &mut Quotas) {
    q.charge_reported(format!("s3_{bucket}_list"));
}

/// Bytes stored: the declared length, accounted with the PUT itself, all or nothing.
fn bytes_in(req: &Parts, bucket: &str, q: &mut Quotas) {
    if let Some(n) = content_length(&req.headers) {
        q.account(format!("s3_{bucket}_bytes_in"), n);
    }
}

fn nothing(_: &Parts, _: &str, _: &mut Quotas) {}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// The routes (path style), each handler behind its own quota.
pub fn app(state: AppState) -> Router {
    let y = &state.yarl;
    Router::new()
        .route("/_yarl/status", get(status))
        .route(
            "/{bucket}",
            get(list.layer(handler_quota(y, "list", list_cost)))
                .put(create_bucket.layer(handler_quota(y, "create", nothing)))
                .delete(delete_bucket.layer(handler_quota(y, "destroy", nothing))),
        )
        .route(
            "/{bucket}/{*key}",
            get(get_object.layer(handler_quota(y, "get", nothing)))
                .head(head_object.layer(handler_quota(y, "head", nothing)))
                .put(put_object.layer(handler_quota(y, "put", bytes_in)))
                .delete(delete_object.layer(handler_quota(y, "delete", nothing))),
        )
        .fallback(|| async { AppError::InvalidBucketName })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed })
        .with_state(state)
}

/// [`app`] behind the virtual-host rewrite (`Host: <bucket>.<domain>` → `/<bucket>/…`),
/// optionally with an access log on stdout (one JSON line per request).
pub fn service(
    state: AppState,
    domain: String,
    access_log: bool,
) -> impl tower::Service<
    Request,
    Response = Response,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response, Infallible>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    let mut router = app(state);
    if access_log {
        router = router.layer(axum::middleware::from_fn(log_request));
    }
    let domain = Arc::<str>::from(domain.to_ascii_lowercase());
    tower::ServiceBuilder::new()
        .map_request(move |req: Request| virtual_host(req, &domain))
        .service(router)
}

/// Rewrites a virtual-host style request to path style.
pub fn virtual_host(mut req: Request, domain: &str) -> Request {
    let Some(host) = req.headers().get(HOST).and_then(|h| h.to_str().ok()) else { return req };
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.to_ascii_lowercase();
    let Some(bucket) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')) else {
        return req;
    };
    if !valid_bucket(bucket) {
        return req;
    }
    let path = req.uri().path();
    let path = if path == "/" { String::new() } else { path.to_owned() };
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    if let Ok(uri) = format!("/{bucket}{path}{query}").parse::<Uri>() {
        *req.uri_mut() = uri;
    }
    req
}

async fn log_request(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    let ratelimit = response.headers().get("ratelimit").and_then(|v| v.to_str().ok());
    let line = serde_json::json!({
        "method": method.as_str(),
        "path": path,
        "status": response.status().as_u16(),
        "ratelimit": ratelimit,
    });
    println!("{line}");
    response
}

async fn status(
    State(s): State<AppState>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Json<serde_json::Value> {
    let l = s.yarl.limiter();
    let quota = q.get("quota").and_then(|name| {
        let i = l.quota(name)?;
        Some(serde_json::json!({
            "name": name, "limit": i.limit, "low_burst": i.low_burst, "high_burst": i.high_burst,
            "parent": i.parent, "fill": i.fill, "rejections": i.rejections,
        }))
    });
    Json(serde_json::json!({
        "quotas": l.quota_count(),
        "epoch": l.epoch(),
        "rejections": l.rejections(),
        "sync": s.yarl.sync_status(),
        "quota": quota,
        "store": { "buckets": s.store.bucket_count(), "bytes": s.store.bytes() },
    }))
}

async fn create_bucket(
    State(s): State<AppState>,
    Path(bucket): Path<String>,
) -> Result<StatusCode, AppError> {
    s.store.create_bucket(bucket_name(&bucket)?)?;
    Ok(StatusCode::OK)
}

async fn delete_bucket(
    State(s): State<AppState>,
    Path(bucket): Path<String>,
) -> Result<StatusCode, AppError> {
    s.store.delete_bucket(bucket_name(&bucket)?)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct ListParams {
    #[serde(default)]
    prefix: String,
    #[serde(rename = "max-keys")]
    max_keys: Option<usize>,
    #[serde(rename = "start-after")]
    start_after: Option<String>,
}

async fn list(
    State(s): State<AppState>,
    Path(bucket): Path<String>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<(Extension<Cost>, Json<store::Listing>), AppError> {
    let bucket = bucket_name(&bucket)?;
    let Query(p) = params.map_err(|e| AppError::InvalidArgument(e.body_text()))?;
    let max = p.max_keys.unwrap_or(MAX_LIST_KEYS);
    if max == 0 || max > MAX_LIST_KEYS {
        return Err(AppError::InvalidArgument(format!("max-keys is 1 to {MAX_LIST_KEYS}")));
    }
    if p.prefix.len() > store::MAX_KEY_BYTES {
        return Err(AppError::InvalidArgument("prefix is at most 1024 bytes".into()));
    }
    let listing = s.store.list(bucket, &p.prefix, p.start_after.as_deref(), max)?;
    // What the listing cost: one unit per object it returned, charged to s3_<bucket>_list
    // and its ancestors after the response.
    Ok((Extension(Cost(listing.keys.len() as u64)), Json(listing)))
}

async fn get_object(
    State(s): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
) -> Result<Response, AppError> {
    let data = s.store.get(bucket_name(&bucket)?, key_name(&key)?)?;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

async fn head_object(
    State(s): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
) -> Result<Response, AppError> {
    let data = s.store.get(bucket_name(&bucket)?, key_name(&key)?)?;
    Ok((
        [(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))],
        [(CONTENT_LENGTH, HeaderValue::from(data.len()))],
    )
        .into_response())
}

async fn put_object(
    State(s): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, AppError> {
    let (bucket, key) = (bucket_name(&bucket)?, key_name(&key)?);
    let max = s.store.limits().max_object_bytes;
    let declared = content_length(&headers).ok_or(AppError::MissingContentLength)?;
    if declared > max as u64 {
        return Err(AppError::TooLarge(max));
    }
    let data = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max))
        .await
        .map_err(|_| AppError::RequestTimeout)?
        .map_err(|e| AppError::BadBody(e.to_string()))?;
    s.store.put(bucket, key, data)?;
    Ok(StatusCode::OK)
}

async fn delete_object(
    State(s): State<AppState>,
    Path((bucket, key)): Path<(String, String)>,
) -> Result<StatusCode, AppError> {
    s.store.delete(bucket_name(&bucket)?, key_name(&key)?)?;
    Ok(StatusCode::NO_CONTENT)
}
