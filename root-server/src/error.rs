//! The one error type of the HTTP API. Every variant documents its status; every response
//! body is `{"error": "…"}` naming what is wrong (batch errors add the item's `index`).
//! Database details reach the client only as "unavailable" plus the driver's message,
//! which names no credentials (URLs are never part of it).

use crate::db::StoreError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use yarl_core::proto::SyncError;

/// The body of every error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    /// What is wrong, for a person to read.
    pub error: String,
    /// In `POST /v1/quotas:batch`: the index of the item at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 400: the body is not the JSON the route takes.
    #[error("bad JSON: {0}")]
    BadJson(String),
    /// 400: a bad path or query parameter.
    #[error("{0}")]
    BadRequest(String),
    /// 413: the body is larger than the route accepts.
    #[error("request body too large: this route accepts at most {limit} bytes")]
    TooLarge {
        /// The route's limit in bytes.
        limit: usize,
    },
    /// 400: the body could not be read.
    #[error("could not read the request body: {0}")]
    Body(String),
    /// 408: the body did not arrive in time.
    #[error("request body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// 400: the body is not a protocol v2 message (the message names the field).
    #[error("{0}")]
    BadV2(yarl_core::proto::v2::DecodeError),
    /// 415: the sync route does not speak this content type.
    #[error(
        "unsupported content type {0:?}: send application/x-yarl-sync+v2 (protocol v2) or \
         application/json (protocol v1)"
    )]
    UnsupportedMediaType(String),
    /// 503 with `Retry-After`: the route is at its concurrency limit and the request waited
    /// its turn for too long.
    #[error("busy: too many concurrent {0} requests; retry later")]
    Busy(&'static str),
    /// 401: the route needs a bearer token and none was sent.
    #[error("missing bearer token: send \"Authorization: Bearer <token>\"")]
    MissingToken,
    /// 401: the bearer token is not the configured one.
    #[error("wrong bearer token")]
    WrongToken,
    /// 422: the quota is invalid (the message names the field); `index` is set in batches.
    #[error("{}{message}", .index.map(|i| format!("item {i}: ")).unwrap_or_default())]
    Invalid {
        /// Index of the offending batch item.
        index: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// The database refused the write or could not be reached; the status depends on the
    /// kind: 404 not found, 409 cycle or children, 422 unknown parent / duplicate / depth,
    /// 503 unavailable, 500 invalid database contents.
    #[error("{}{source}", if *.batch { .source.item_index().map(|i| format!("item {i}: ")).unwrap_or_default() } else { String::new() })]
    Store {
        /// The cause.
        source: StoreError,
        /// Whether the request was a batch (messages then name the item index).
        batch: bool,
    },
    /// 400/413/429: the sync request was refused.
    #[error("{0}")]
    Sync(SyncError),
    /// 500: a bug; the message says where.
    #[error("internal error: {0}")]
    Internal(String),
    /// 404: no such route.
    #[error("no route for {0}")]
    NoRoute(String),
    /// 405: the route exists but not with this method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 405: `POST /v1/quotas/{name}` without a known action: a quota takes GET, PUT and
    /// DELETE, and POST only with an action suffix.
    #[error(
        "POST {0}: the only action is :reset (POST /v1/quotas/NAME:reset); PUT creates or \
         replaces a quota"
    )]
    NoSuchAction(String),
}

/// What `/v1/quotas/{name}` takes when the name has no action suffix: the router also
/// routes POST there, for `:reset`, so its own `Allow` would offer POST to every quota.
pub(crate) const QUOTA_METHODS: &str = "GET,HEAD,PUT,DELETE";

/// Attached to every error response: why it was refused, for metrics and the log.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

impl From<StoreError> for ApiError {
    fn from(source: StoreError) -> Self {
        ApiError::Store { source, batch: false }
    }
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadJson(_)
            | ApiError::BadV2(_)
            | ApiError::BadRequest(_)
            | ApiError::Body(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::MissingToken | ApiError::WrongToken => StatusCode::UNAUTHORIZED,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Store { source, .. } => match source {
                StoreError::NotFound(_) | StoreError::DeleteNotFound { .. } => {
                    StatusCode::NOT_FOUND
                }
                StoreError::Cycle { .. } | StoreError::HasChildren { .. } => StatusCode::CONFLICT,
                StoreError::UnknownParent { .. }
                | StoreError::ChainTooDeep { .. }
                | StoreError::DescendantTooDeep { .. }
                | StoreError::Duplicate { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            ApiError::Sync(e) => match e {
                SyncError::TooLarge(..) | SyncError::TooManyBatches(_) => {
                    StatusCode::PAYLOAD_TOO_LARGE
                }
                SyncError::TooManyLimiters(_) => StatusCode::TOO_MANY_REQUESTS,
                SyncError::SeqTooFarAhead { .. } => StatusCode::CONFLICT,
                _ => StatusCode::BAD_REQUEST,
            },
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NoRoute(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed | ApiError::NoSuchAction(_) => {
                StatusCode::METHOD_NOT_ALLOWED
            }
        }
    }

    /// A short label for metrics and logs: bounded, so it can be a Prometheus label.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::BadJson(_) => "bad_json",
            ApiError::BadV2(_) => "bad_v2",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::TooLarge { .. } => "too_large",
            ApiError::Body(_) => "bad_body",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::Busy(_) => "busy",
            ApiError::UnsupportedMediaType(_) => "content_type",
            ApiError::MissingToken => "missing_token",
            ApiError::WrongToken => "wrong_token",
            ApiError::Invalid { .. } => "invalid",
            ApiError::Store { source, .. } => match source {
                StoreError::NotFound(_) | StoreError::DeleteNotFound { .. } => "not_found",
                StoreError::Cycle { .. } => "cycle",
                StoreError::HasChildren { .. } => "has_children",
                StoreError::UnknownParent { .. } => "unknown_parent",
                StoreError::ChainTooDeep { .. } | StoreError::DescendantTooDeep { .. } => {
                    "chain_too_deep"
                }
                StoreError::Duplicate { .. } => "duplicate",
                StoreError::Unavailable(_) => "db_unavailable",
                _ => "db_invalid",
            },
            ApiError::Sync(e) => match e {
                SyncError::UnsupportedVersion(_) => "unsupported_version",
                SyncError::BadLimiterId => "bad_limiter_id",
                SyncError::TooManyLimiters(_) => "too_many_limiters",
                SyncError::TooLarge(..) => "too_many_entries",
                SyncError::SeqTooFarAhead { .. } => "seq_too_far_ahead",
                SyncError::BadDrained { .. } => "bad_drained",
                SyncError::TooManyBatches(_) => "too_many_batches",
                _ => "sync_refused",
            },
            ApiError::Internal(_) => "internal",
            ApiError::NoRoute(_) => "no_route",
            ApiError::MethodNotAllowed | ApiError::NoSuchAction(_) => "method_not_allowed",
        }
    }

    fn index(&self) -> Option<usize> {
        match self {
            ApiError::Invalid { index, .. } => *index,
            ApiError::Store { source, batch: true } => source.item_index(),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody { error: self.to_string(), index: self.index() };
        let mut resp = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::NoSuchAction(_) = self {
            // RFC 9110 §15.5.6: a 405 lists the methods the resource takes.
            resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static(QUOTA_METHODS));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // Read by the refusal counter (`crate::guard::observe`), which logs the message.
        resp.extensions_mut().insert(Refusal { reason: self.reason(), message: self.to_string() });
        resp
    }
}

/// Parses a JSON body; an error names where it is (`limit: invalid type: string "x",
/// expected f64`, `[3].dry_run: …`), not only its line and column.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            bad_json(inner.to_string())
        } else {
            bad_json(format!("{path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| bad_json(e.to_string()))?;
    Ok(value)
}

/// Longest JSON error message answered and logged, in bytes.
const MAX_JSON_ERROR: usize = 1024;

/// A [`ApiError::BadJson`] of at most [`MAX_JSON_ERROR`] bytes: serde quotes whole strings
/// of the body (`invalid type: string "…"`) and the path names its keys, so a hostile body
/// could otherwise make an answer and a log line as large as itself.
pub(crate) fn bad_json(message: String) -> ApiError {
    ApiError::BadJson(clipped(&message, MAX_JSON_ERROR).into_owned())
}

/// `text`, or its first `max` bytes (at a character boundary) and `…`: for what an error
/// quotes of a request.
pub(crate) fn clipped(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}
