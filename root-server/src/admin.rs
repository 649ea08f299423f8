//! The admin API: quotas in units (floats) on the outside, fixed point in the database.
//!
//! Bodies are read with `crate::guard::read_body_paced` (size checked before reading, a
//! deadline and a pace) and parsed here rather than with axum's `Json`, so every rejection
//! (bad JSON, too large, unreadable, too slow) gets the same `{"error": …}` shape. Every
//! route passes its gate: a bounded number at once, the rest wait a moment and then get
//! `503`. `PUT` reads its body (within a memory budget) before taking its turn, so a client
//! that stalls its body holds no turn; a batch, whose one turn is also its memory, takes the
//! turn first and gives it up within about a second if its body stalls.

use crate::db::{NewQuota, StoreError, StoredQuota};
use crate::error::{parse_json, ApiError, ErrorBody};
use crate::guard::{declared_length, read_body_paced};
use crate::openapi::{NamePrefix, QuotaName};
use crate::AppState;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};
use yarl_core::units::milli_to_units;
use yarl_core::{validate_name, QuotaSpec, QuotaUpdate};

/// Default and largest page of `GET /v1/quotas`.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1_000;

/// The body of `PUT /v1/quotas/{name}`. Unknown fields are refused so a typo such as
/// `"lowburst"` is an error, not a silently defaulted value.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"limit": 10.0, "low_burst": 5.0, "high_burst": 20.0}))]
pub(crate) struct QuotaBody {
    /// Optional; must equal the name in the path.
    #[serde(default)]
    #[schema(value_type = Option<QuotaName>)]
    name: Option<String>,
    /// Units per window (`per`; per second without it) that drain the bucket. Required
    /// unless `max_in_flight` is given (a quota that caps only requests in flight).
    #[serde(default)]
    #[schema(minimum = 0.001, maximum = 1e12)]
    limit: Option<f64>,
    /// The window `limit` counts in: a whole number and a unit, `s`, `m`, `h` or `d`
    /// (`"1h"`; a month is `"30d"`), from 1 s to 30 days; absent: one second.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[1-9][0-9]{0,8}[smhd]$", example = "1h")]
    per: Option<String>,
    /// Fill (units) up to which every request passes; at most `high_burst`. Required
    /// without `per`; with it, `limit - 1` when absent (an idle client gets `limit` at once).
    #[schema(minimum = 0, maximum = 1e15)]
    low_burst: Option<f64>,
    /// Fill (units) from which every request is refused; between the two, requests are
    /// refused with rising probability. Required without `per`; with it, as `low_burst`.
    #[schema(minimum = 0, maximum = 1e15)]
    high_burst: Option<f64>,
    /// A live quota (not a template, not itself) that also counts this one's requests.
    #[serde(default)]
    #[schema(value_type = Option<QuotaName>)]
    parent: Option<String>,
    /// Shadow mode: limiters count what it would reject but let it through.
    #[serde(default)]
    dry_run: bool,
    /// Requests in flight at once across the cluster (1 to 1,000,000), beside the rate or
    /// alone.
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000000)]
    max_in_flight: Option<f64>,
}

/// One item of `POST /v1/quotas:batch`: a quota to create or replace, or
/// `{"name": …, "delete": true}`. The numbers are optional here only so that a delete can
/// leave them out; `parse_batch` requires them of a write and refuses them on a delete.
/// The document describes the two shapes apart ([`BatchItemSchema`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchItem {
    name: String,
    /// `true`: delete the quota named (no other field); absent or `false`: a write.
    #[serde(default)]
    delete: bool,
    /// As in `PUT /v1/quotas/{name}`; required for a write.
    limit: Option<f64>,
    #[serde(default)]
    per: Option<String>,
    low_burst: Option<f64>,
    high_burst: Option<f64>,
    /// A live quota or one earlier in the same batch.
    #[serde(default)]
    parent: Option<String>,
    /// Shadow mode: limiters count what it would reject but let it through.
    #[serde(default)]
    dry_run: bool,
    /// As in `PUT /v1/quotas/{name}`.
    #[serde(default)]
    max_in_flight: Option<f64>,
}

/// The two shapes of a batch item, for the OpenAPI document only: one [`BatchItem`] reads
/// both, and the document must not call an item with neither numbers nor `"delete": true`
/// valid.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum BatchItemSchema {
    Write(BatchWrite),
    Delete(BatchDelete),
}

/// A quota to create or replace.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
#[schema(example = json!({"name": "s3_bucket-1.read", "limit": 10.0, "low_burst": 5.0, "high_burst": 20.0}))]
pub(crate) struct BatchWrite {
    #[schema(value_type = QuotaName)]
    name: String,
    /// Absent, or `false`.
    #[serde(default)]
    #[schema(schema_with = only_false)]
    delete: bool,
    /// As in `PUT /v1/quotas/{name}`: required unless `max_in_flight` is given.
    #[schema(minimum = 0.001, maximum = 1e12)]
    limit: Option<f64>,
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^[1-9][0-9]{0,8}[smhd]$", example = "1h")]
    per: Option<String>,
    #[schema(minimum = 0, maximum = 1e15)]
    low_burst: Option<f64>,
    #[schema(minimum = 0, maximum = 1e15)]
    high_burst: Option<f64>,
    /// A live quota or one earlier in the same batch.
    #[schema(value_type = Option<QuotaName>)]
    parent: Option<String>,
    /// Shadow mode: limiters count what it would reject but let it through.
    #[serde(default)]
    dry_run: bool,
    /// As in `PUT /v1/quotas/{name}`.
    #[schema(minimum = 1, maximum = 1000000)]
    max_in_flight: Option<u32>,
}

/// A quota to delete, as `DELETE /v1/quotas/{name}` does.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
#[schema(example = json!({"name": "s3_bucket-1.read", "delete": true}))]
pub(crate) struct BatchDelete {
    #[schema(value_type = QuotaName)]
    name: String,
    #[schema(schema_with = only_true)]
    delete: bool,
}

fn only_bool(value: bool) -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Boolean)
        .enum_values(Some([value]))
        .build()
}

fn only_true() -> utoipa::openapi::Object {
    only_bool(true)
}

fn only_false() -> utoipa::openapi::Object {
    only_bool(false)
}

/// A parsed batch: the writes and the deletes, each with the index of its item in the
/// request, so that errors name the item the client sent.
#[derive(Debug, Default)]
struct Batch {
    quotas: Vec<NewQuota>,
    deletes: Vec<String>,
    /// Request index of every write, then of every delete (the store's item order).
    index: Vec<usize>,
}

/// A stored quota (or its tombstone, after a delete).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QuotaJson {
    #[schema(value_type = QuotaName)]
    name: String,
    /// Never reused.
    id: u64,
    /// The write's epoch: above every earlier write's.
    epoch: u64,
    /// Units per window (`per`); absent on a quota with only `max_in_flight`, as are
    /// `per` and the bursts.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.001, maximum = 1e12)]
    limit: Option<f64>,
    /// The window, as `PUT` takes it; absent: one second.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^[1-9][0-9]{0,8}[smhd]$")]
    per: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1e15)]
    low_burst: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1e15)]
    high_burst: Option<f64>,
    /// Requests in flight at once across the cluster; absent: no such cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000000)]
    max_in_flight: Option<u32>,
    #[schema(value_type = Option<QuotaName>)]
    parent: Option<String>,
    /// Shadow mode (absent when off).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
    /// Present (`true`) only on the tombstone a delete answers with.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
    /// The epoch of the last `:reset`, absent if never.
    #[serde(skip_serializing_if = "is_zero")]
    reset_epoch: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl From<StoredQuota> for QuotaJson {
    fn from(q: StoredQuota) -> Self {
        let rate = q.limits.has_rate();
        let in_flight = q.limits.max_in_flight();
        QuotaJson {
            id: q.id,
            epoch: q.epoch,
            limit: rate.then(|| q.limits.limit_units()),
            per: (rate && q.limits.window_secs() != 1).then(|| q.limits.limit().window_text()),
            low_burst: rate.then(|| milli_to_units(q.limits.low_burst())),
            high_burst: rate.then(|| milli_to_units(q.limits.high_burst())),
            max_in_flight: (in_flight > 0).then_some(in_flight),
            dry_run: q.limits.dry_run(),
            parent: q.parent,
            deleted: q.deleted,
            reset_epoch: q.reset_epoch,
            name: q.name,
        }
    }
}

/// This root's view of the quota's bucket.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CounterJson {
    fill: f64,
    rate: f64,
    drop_probability: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct QuotaWithCounter {
    #[serde(flatten)]
    quota: QuotaJson,
    /// For a key (a name under a template, with no quota of its own): the template that
    /// limits it; the numbers and parent are the template's, the id the key's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<QuotaName>)]
    template: Option<String>,
    /// `null` until this root has loaded the quota (at most one poll interval).
    counter: Option<CounterJson>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Page {
    /// In name order.
    quotas: Vec<QuotaJson>,
    /// Pass as `after` to get the next page; `null` on the last page.
    #[schema(value_type = Option<QuotaName>)]
    next: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BatchResult {
    /// Quotas written.
    count: usize,
    /// The epoch of the first item; `null` for an empty batch.
    first_epoch: Option<u64>,
    /// The epoch of the last item; `null` for an empty batch.
    last_epoch: Option<u64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    #[serde(default)]
    #[param(value_type = Option<NamePrefix>)]
    prefix: String,
    /// Only names after this one: the `next` of the previous page.
    #[param(value_type = Option<QuotaName>)]
    after: Option<String>,
    /// Page size (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The refusals every admin route may answer with, besides its own.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only described, never built: the answers are `ApiError`s
pub(crate) enum AdminErrors {
    /// No admin token, or the wrong one.
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    Unauthorized(ErrorBody),
    /// Too many admin requests at once, or the database is unreachable.
    #[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait: 1")))]
    Unavailable(ErrorBody),
}

/// Deadline for an admin body (1 MiB).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline for a batch body (256 MiB: 4.3 MB/s).
const BATCH_BODY_TIMEOUT: Duration = Duration::from_secs(60);

fn path_name(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(n)| n)
        .map_err(|r| ApiError::BadRequest(format!("bad quota name: {}", r.body_text())))
}

fn invalid(index: Option<usize>, e: impl std::fmt::Display) -> ApiError {
    ApiError::Invalid { index, message: e.to_string() }
}

/// Feeds a database failure to the rate-limited database log, then passes it on (the
/// refusal itself is counted by `crate::guard::observe`).
fn refused(st: &AppState, e: ApiError) -> ApiError {
    if let ApiError::Store { source, .. } = &e {
        st.db_failed(source);
    }
    e
}

#[utoipa::path(
    put,
    path = "/v1/quotas/{name}",
    operation_id = "put_quota",
    summary = "Create or replace a quota",
    params(("name" = QuotaName, Path, description = "The quota's name.")),
    security(("admin_token" = [])),
    tag = "quotas",
    request_body = QuotaBody,
    responses(
        (status = 200, description = "The quota as stored.", body = QuotaJson,
        links(
            ("GetQuota" = (operation_id = "get_quota", parameters(("name" = "$response.body#/name")))),
            ("ResetQuota" = (operation_id = "reset_quota", parameters(("name" = "$response.body#/name")))),
            ("DeleteQuota" = (operation_id = "delete_quota", parameters(("name" = "$response.body#/name")))),
        )),
        (status = 400, description = "The body is not JSON of this shape, or the path is not UTF-8.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within 10 s.", body = ErrorBody),
        (status = 409, description = "The parent would close a cycle.", body = ErrorBody),
        (status = 413, description = "The body is over 1 MiB.", body = ErrorBody),
        (status = 422, description = "The quota is invalid (the message names the field), the body names another quota, the parent does not exist, or the parent chain would be too long.", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn put(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<QuotaJson>, ApiError> {
    let result = async {
        let name = path_name(name)?;
        // The body first, within a memory budget and at a pace, then the turn: a client
        // that declares a body and stalls holds no turn (see `ADMIN_MEMORY_KIB`).
        let limit = crate::BODY_LIMIT;
        let declared = declared_length(&headers).unwrap_or(limit as u64).min(limit as u64);
        let kib = u32::try_from(declared.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let memory = st.0.guards.admin_memory.enter_n(kib).await?;
        let body = read_body_paced(&headers, body, limit, BODY_TIMEOUT).await?;
        let slot = st.0.guards.admin.enter().await?;
        let b: QuotaBody = parse_json(&body)?;
        if let Some(n) = &b.name {
            if *n != name {
                let (n, name) = (clip(n), clip(&name));
                return Err(invalid(None, format!("body names {n:?} but the path names {name:?}")));
            }
        }
        let spec = QuotaSpec {
            limit: b.limit,
            per: b.per,
            low_burst: b.low_burst,
            high_burst: b.high_burst,
            parent: b.parent,
            dry_run: b.dry_run,
            max_in_flight: in_flight(b.max_in_flight).map_err(|e| invalid(None, e))?,
        };
        let limits = spec.validate(&name).map_err(|e| invalid(None, e))?;
        drop((body, memory));
        let written =
            st.0.store.put_many(vec![NewQuota { name, limits, parent: spec.parent }]).await?;
        drop(slot);
        Ok(written)
    }
    .await;
    let written = result.map_err(|e| refused(&st, e))?;
    st.db_ok();
    st.0.metrics.quota_writes.fetch_add(1, Relaxed);
    let stored = written.quotas.first().cloned();
    st.catch_up(written).await;
    let q = stored.ok_or_else(|| ApiError::Internal("write returned no row".into()))?;
    tracing::info!(name = %q.name, id = q.id, epoch = q.epoch, "quota written");
    Ok(Json(q.into()))
}

#[utoipa::path(
    get,
    path = "/v1/quotas/{name}",
    operation_id = "get_quota",
    summary = "A quota, or a key under a template, with its counter on this root",
    params(("name" = QuotaName, Path, description = "The quota's name.")),
    security(("admin_token" = [])),
    tag = "quotas",
    responses(
        (status = 200, description = "The quota; for a key, the template's numbers and `template`.", body = QuotaWithCounter),
        (status = 400, description = "The path is not UTF-8.", body = ErrorBody),
        (status = 404, description = "No such quota, and no template covers the name.", body = ErrorBody),
        (status = 422, description = "The name is invalid.", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn get(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<QuotaWithCounter>, ApiError> {
    let _slot = st.0.guards.admin.enter().await?;
    let name = path_name(name)?;
    validate_name(&name).map_err(|e| invalid(None, e))?;
    let q = st.0.store.get(name.clone()).await.map_err(|e| refused(&st, e.into()))?;
    let now = st.now();
    let Some(q) = q else {
        // No quota of that name: a key, if a template covers it.
        let key = key_of(&st, &name, now).await?;
        return key.ok_or(ApiError::Store { source: StoreError::NotFound(name), batch: false });
    };
    let id = q.id;
    let counter = st
        .with_stripe(st.stripe_of(id), move |r| r.counter(id, now))
        .await?
        .map(|c| CounterJson { fill: c.fill, rate: c.rate, drop_probability: c.drop_probability });
    Ok(Json(QuotaWithCounter { quota: q.into(), template: None, counter }))
}

/// The template with the longest prefix of `name` and the key's wire id; `None` when no
/// template covers it.
async fn key_template(st: &AppState, name: &str) -> Result<Option<(QuotaUpdate, u64)>, ApiError> {
    let raw = yarl_core::raw_name(name);
    st.with_stripe(0, move |r| {
        let t = r.template_for(&raw)?.clone();
        let secret = r.key_secret()?;
        Some((t, yarl_core::zone::keys::key_id(secret, &raw)))
    })
    .await
}

/// The key `name` under the template with the longest prefix of it, with its counter on
/// this root (`null` when this root counts nothing for it now); `None` when no template
/// covers it.
async fn key_of(
    st: &AppState,
    name: &str,
    now: u64,
) -> Result<Option<Json<QuotaWithCounter>>, ApiError> {
    let Some((template, id)) = key_template(st, name).await? else { return Ok(None) };
    let counter = st
        .with_stripe(st.stripe_of(id), move |r| r.counter(id, now))
        .await?
        .map(|c| CounterJson { fill: c.fill, rate: c.rate, drop_probability: c.drop_probability });
    let quota: QuotaJson = StoredQuota {
        id,
        name: name.to_owned(),
        epoch: template.epoch,
        deleted: false,
        limits: template.limits,
        parent: template.parent.clone(),
        reset_epoch: template.reset_epoch,
    }
    .into();
    Ok(Some(Json(QuotaWithCounter { quota, template: Some(template.name), counter })))
}

#[utoipa::path(
    delete,
    path = "/v1/quotas/{name}",
    operation_id = "delete_quota",
    summary = "Delete a quota",
    params(("name" = QuotaName, Path, description = "The quota's name.")),
    security(("admin_token" = [])),
    tag = "quotas",
    responses(
        (status = 200, description = "The tombstone (`deleted: true`).", body = QuotaJson),
        (status = 400, description = "The path is not UTF-8.", body = ErrorBody),
        (status = 404, description = "No such quota.", body = ErrorBody),
        (status = 409, description = "Other quotas name it as their parent.", body = ErrorBody),
        (status = 422, description = "The name is invalid.", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn delete(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<QuotaJson>, ApiError> {
    let _slot = st.0.guards.admin.enter().await?;
    let result = async {
        let name = path_name(name)?;
        validate_name(&name).map_err(|e| invalid(None, e))?;
        Ok(st.0.store.delete(name).await?)
    }
    .await;
    let written = result.map_err(|e| refused(&st, e))?;
    st.db_ok();
    st.0.metrics.quota_writes.fetch_add(1, Relaxed);
    let tomb = written.quotas.first().cloned();
    st.catch_up(written).await;
    let q = tomb.ok_or_else(|| ApiError::Internal("delete returned no row".into()))?;
    tracing::info!(name = %q.name, id = q.id, epoch = q.epoch, "quota deleted");
    Ok(Json(q.into()))
}

/// `POST /v1/quotas/{name}:reset`: empties the quota's counter on every root and limiter.
/// The action is a suffix of the path segment (as in Google's API style), so a quota
/// literally called `a:reset` is reset with `/v1/quotas/a:reset:reset`.
#[utoipa::path(
    post,
    path = "/v1/quotas/{name}:reset",
    operation_id = "reset_quota",
    summary = "Empty the quota's counter on every root and limiter",
    params(("name" = QuotaName, Path, description = "The quota's name.")),
    security(("admin_token" = [])),
    tag = "quotas",
    responses(
        (status = 200, description = "The quota with its new `reset_epoch`; for a key (a name under a template, with no quota of its own), the key as `GET` shows it.", body = QuotaJson),
        (status = 400, description = "The path is not UTF-8.", body = ErrorBody),
        (status = 404, description = "No such quota, and no template covers the name.", body = ErrorBody),
        (status = 422, description = "The name is invalid.", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn action(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<QuotaJson>, ApiError> {
    let _slot = st.0.guards.admin.enter().await?;
    let result = async {
        let segment = path_name(name)?;
        let Some(name) = segment.strip_suffix(":reset") else {
            return Err(ApiError::NoSuchAction(format!("/v1/quotas/{segment}")));
        };
        validate_name(name).map_err(|e| invalid(None, e))?;
        match st.0.store.reset(name.to_owned()).await {
            Err(StoreError::NotFound(missing)) => {
                // No quota of that name: a key, if a template covers it (a template's own
                // name never is one).
                let key = match yarl_core::is_template(name) {
                    true => None,
                    false => key_template(&st, name).await?,
                };
                let Some(key) = key else {
                    return Err(StoreError::NotFound(missing).into());
                };
                let written = st.0.store.reset_key(name.to_owned(), key.0.limits).await?;
                Ok((written, Some(key)))
            }
            written => Ok((written?, None)),
        }
    }
    .await;
    let (written, key) = result.map_err(|e| refused(&st, e))?;
    st.db_ok();
    st.0.metrics.quota_writes.fetch_add(1, Relaxed);
    let q = written.quotas.first().cloned();
    st.catch_up(written).await;
    let mut q = q.ok_or_else(|| ApiError::Internal("reset returned no row".into()))?;
    if let (true, Some((template, id))) = (q.deleted, key) {
        tracing::info!(name = %q.name, template = %template.name, epoch = q.epoch, "key reset");
        // Answer the key as `GET` shows it, not the tombstone that records its reset.
        q = StoredQuota {
            id,
            deleted: false,
            limits: template.limits,
            parent: template.parent.clone(),
            ..q
        };
    } else {
        tracing::info!(name = %q.name, id = q.id, epoch = q.epoch, "quota reset");
    }
    Ok(Json(q.into()))
}

#[utoipa::path(
    get,
    path = "/v1/quotas",
    operation_id = "list_quotas",
    summary = "Live quotas in name order, a page at a time",
    params(ListParams),
    security(("admin_token" = [])),
    tag = "quotas",
    responses(
        (status = 200, description = "A page.", body = Page),
        (status = 400, description = "A parameter is invalid.", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn list(
    State(st): State<AppState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let _slot = st.0.guards.admin.enter().await?;
    let Query(p) = params.map_err(|r| ApiError::BadRequest(r.body_text()))?;
    if !p.prefix.is_empty() {
        validate_name(&p.prefix).map_err(|e| ApiError::BadRequest(format!("prefix: {e}")))?;
    }
    if let Some(a) = &p.after {
        validate_name(a).map_err(|e| ApiError::BadRequest(format!("after: {e}")))?;
    }
    let limit = p.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be from 1 to {MAX_PAGE}, got {limit}"
        )));
    }
    // One row more than asked tells whether another page exists.
    let mut rows =
        st.0.store.list(p.prefix, p.after, limit + 1).await.map_err(|e| refused(&st, e.into()))?;
    let next = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|q| q.name.clone())
    } else {
        None
    };
    Ok(Json(Page { quotas: rows.into_iter().map(Into::into).collect(), next }))
}

#[utoipa::path(
    post,
    path = "/v1/quotas:batch",
    operation_id = "batch_quotas",
    summary = "Create, replace or delete many quotas in one transaction",
    security(("admin_token" = [])),
    tag = "quotas",
    request_body(content = Vec<BatchItemSchema>, description = "All written or deleted, or none; a parent may be an earlier item."),
    responses(
        (status = 200, description = "All written.", body = BatchResult),
        (status = 400, description = "The body is not a JSON array of items.", body = ErrorBody),
        (status = 404, description = "A delete names no live quota (`index` names it).", body = ErrorBody),
        (status = 408, description = "The body did not arrive within 60 s.", body = ErrorBody),
        (status = 409, description = "An item would close a parent cycle, or a delete leaves a quota whose parent it is (`index` names it).", body = ErrorBody),
        (status = 413, description = "The body is over 256 MiB.", body = ErrorBody),
        (status = 422, description = "An item is invalid, repeats a name, has an unknown parent or too long a parent chain (`index` names it).", body = ErrorBody),
        AdminErrors,
    ),
)]
pub(crate) async fn batch(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<BatchResult>, ApiError> {
    // One batch at a time: a full one holds its 256 MiB body and the parsed quotas.
    let _slot = st.0.guards.batch.enter().await?;
    let result = async {
        // At a pace: the one batch turn is also the batch memory, so a body that stalls
        // gives it up within about a second rather than the whole deadline.
        let body =
            read_body_paced(&headers, body, crate::BATCH_BODY_LIMIT, BATCH_BODY_TIMEOUT).await?;
        // Parsing and validating a million items takes a second of CPU: keep it off the
        // async workers that answer syncs.
        let b = tokio::task::spawn_blocking(move || parse_batch(&body))
            .await
            .map_err(|e| ApiError::Internal(format!("batch parser: {e}")))??;
        let index = b.index;
        let written = st.0.store.write_batch(b.quotas, b.deletes).await.map_err(|e| {
            let source = e.map_index(|i| index.get(i).copied().unwrap_or(i));
            ApiError::Store { source, batch: true }
        })?;
        Ok(written)
    }
    .await;
    let written = result.map_err(|e| refused(&st, e))?;
    st.db_ok();
    let count = written.quotas.len();
    st.0.metrics.quota_writes.fetch_add(count as u64, Relaxed);
    let res = BatchResult {
        count,
        first_epoch: (count > 0).then_some(written.base_epoch + 1),
        last_epoch: (count > 0).then(|| written.last_epoch()),
    };
    st.catch_up(written).await;
    if count > 0 {
        tracing::info!(count, last_epoch = res.last_epoch, "quota batch written");
    }
    Ok(Json(res))
}

/// `max_in_flight` as JSON gave it: a whole number in range, or the error naming it.
fn in_flight(value: Option<f64>) -> Result<Option<u32>, yarl_core::QuotaError> {
    value.map(yarl_core::in_flight_from_number).transpose()
}

/// Longest part of a name an error message quotes, in bytes: a valid name is at most
/// 255 bytes unescaped (765 escaped), and an invalid one can be as long as the body.
const MAX_QUOTED_NAME: usize = 800;

/// `name`, or its first [`MAX_QUOTED_NAME`] bytes and `…`, for an error message: errors of
/// a batch quote the name of the item at fault before it is known to be valid, so a
/// hostile item would otherwise make an answer and a log line as large as the body.
fn clip(name: &str) -> std::borrow::Cow<'_, str> {
    crate::error::clipped(name, MAX_QUOTED_NAME)
}

fn parse_batch(body: &[u8]) -> Result<Batch, ApiError> {
    let items: Vec<BatchItem> = parse_json(body)?;
    let mut b = Batch { quotas: Vec::with_capacity(items.len()), ..Batch::default() };
    let mut delete_index = Vec::new();
    // The store would catch a name given twice too, but with indexes of its own order.
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(items.len());
    for (i, it) in items.into_iter().enumerate() {
        if let Some(&first) = seen.get(&it.name) {
            let source = StoreError::Duplicate { index: i, first, name: clip(&it.name).into() };
            return Err(ApiError::Store { source, batch: true });
        }
        seen.insert(it.name.clone(), i);
        if it.delete {
            let given: Vec<&str> = [
                it.limit.map(|_| "limit"),
                it.per.as_ref().map(|_| "per"),
                it.low_burst.map(|_| "low_burst"),
                it.high_burst.map(|_| "high_burst"),
                it.parent.as_ref().map(|_| "parent"),
                it.dry_run.then_some("dry_run"),
                it.max_in_flight.map(|_| "max_in_flight"),
            ]
            .into_iter()
            .flatten()
            .collect();
            if !given.is_empty() {
                return Err(invalid(
                    Some(i),
                    format!(
                        "quota {:?}: a delete takes only \"name\" and \"delete\", not {}",
                        clip(&it.name),
                        given.join(", ")
                    ),
                ));
            }
            validate_name(&it.name)
                .map_err(|e| invalid(Some(i), format!("quota {:?}: {e}", clip(&it.name))))?;
            b.deletes.push(it.name);
            delete_index.push(i);
            continue;
        }
        // Bursts left out without a window, or no limit without `max_in_flight`: a 422
        // from `validate`, naming the field.
        let max_in_flight = in_flight(it.max_in_flight)
            .map_err(|e| invalid(Some(i), format!("quota {:?}: {e}", clip(&it.name))))?;
        let spec = QuotaSpec {
            limit: it.limit,
            low_burst: it.low_burst,
            high_burst: it.high_burst,
            per: it.per,
            parent: it.parent,
            dry_run: it.dry_run,
            max_in_flight,
        };
        let limits = spec
            .validate(&it.name)
            .map_err(|e| invalid(Some(i), format!("quota {:?}: {e}", clip(&it.name))))?;
        b.quotas.push(NewQuota { name: it.name, limits, parent: spec.parent });
        b.index.push(i);
    }
    b.index.extend(delete_index);
    Ok(b)
}

/// `GET /v1/copy`: this root's counters and sessions at one instant, as JSON
/// (`yarl_core::root::RootCopy`), for a restarted root of the same shard to start from
/// (`yarl-root --copy-from`). Not in the OpenAPI document: roots' own exchange, like
/// `POST /v1/sync`. It names every limiter's whole id, the secret half included, so it
/// takes the admin token.
pub(crate) async fn copy(State(st): State<AppState>) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let _slot = st.0.guards.admin.enter().await?;
    let _copy = st.0.guards.copy.enter().await?;
    let work = st.clone();
    let body = tokio::task::spawn_blocking(move || serde_json::to_vec(&work.copy_out()))
        .await
        .map_err(|e| ApiError::Internal(format!("copy worker: {e}")))?
        .map_err(|e| ApiError::Internal(format!("copy: {e}")))?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response())
}
