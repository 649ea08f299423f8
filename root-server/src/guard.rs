//! What every request passes through before a handler does real work: bodies read within a
//! size and a deadline, a per-route concurrency gate, and the count and log of everything
//! refused.

use crate::error::{ApiError, Refusal};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A route group's concurrency limit: up to `permits` requests run at once, others wait up
/// to `wait` for a turn and then get `503` with `Retry-After`.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    name: &'static str,
    sem: Arc<Semaphore>,
    wait: Duration,
}

impl Gate {
    pub fn new(name: &'static str, permits: usize, wait: Duration) -> Self {
        Gate { name, sem: Arc::new(Semaphore::new(permits)), wait }
    }

    /// Waits for `n` permits (at most the gate's size).
    pub async fn enter_n(&self, n: u32) -> Result<OwnedSemaphorePermit, ApiError> {
        match tokio::time::timeout(self.wait, self.sem.clone().acquire_many_owned(n)).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(ApiError::Busy(self.name)),
        }
    }

    pub async fn enter(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.enter_n(1).await
    }
}

/// The `Content-Length` a request declares, if any.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Grace before a body must keep pace: how long its first bytes may take.
const PACE_GRACE: Duration = Duration::from_secs(1);

/// Reads a body of at most `limit` bytes within `deadline` (a declared length over the
/// limit is refused before a byte is read; a streamed body is cut at the limit), and at a
/// pace: after [`PACE_GRACE`], the bytes
/// received must keep up with those of a body arriving evenly until `deadline` (its
/// declared length, or `limit` when it declares none), or the request ends with `408`.
/// A request that declares a body and sends nothing (or trickles it) thus holds what was
/// reserved for it for about a second, not for the whole deadline, while an honest body,
/// sent at once, is never near the pace.
pub(crate) async fn read_body_paced(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, ApiError> {
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    let expected = declared.unwrap_or(limit as u64).max(1) as f64;
    let started = tokio::time::Instant::now();
    let span = deadline.saturating_sub(PACE_GRACE).as_secs_f64();
    let mut body = Limited::new(body, limit);
    // The frames as they came (no copy), joined once at the end.
    let mut frames: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    loop {
        // When the bytes so far fall behind the pace.
        let due = started + PACE_GRACE + Duration::from_secs_f64(len as f64 / expected * span);
        let frame = match tokio::time::timeout_at(due.min(started + deadline), body.frame()).await {
            Err(_) => return Err(ApiError::BodyTimeout(deadline)),
            Ok(None) => break,
            Ok(Some(f)) => f.map_err(|e| {
                if e.is::<LengthLimitError>() {
                    ApiError::TooLarge { limit }
                } else {
                    ApiError::Body(e.to_string())
                }
            })?,
        };
        if let Ok(data) = frame.into_data() {
            len += data.len();
            frames.push(data);
        }
    }
    Ok(match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap_or_default(),
        _ => {
            let mut buf = Vec::with_capacity(len);
            for f in frames {
                buf.extend_from_slice(&f);
            }
            Bytes::from(buf)
        }
    })
}

/// The label of a request's route: a fixed set, so it can be a metrics label.
pub(crate) fn route_of(method: &Method, path: &str) -> &'static str {
    match path {
        "/v1/sync" => "sync",
        "/v1/quotas:batch" => "batch",
        "/v1/quotas" => "list",
        "/healthz" => "healthz",
        "/metrics" => "metrics",
        p if p.starts_with("/v1/quotas/") => match *method {
            Method::PUT => "put",
            Method::DELETE => "delete",
            _ => "get",
        },
        _ => "other",
    }
}

/// Counts every refused request by route, reason and status, and logs it: `warn` for 4xx
/// and deliberate 503s, `error` for any other 5xx (a bug or a broken database), at most
/// [`LOG_BURST`] lines per second so a flood of bad requests cannot flood the log.
pub(crate) async fn observe(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let route = route_of(req.method(), req.uri().path());
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let resp = next.run(req).await;
    let status = resp.status();
    if status.is_client_error() || status.is_server_error() {
        let refusal = resp.extensions().get::<Refusal>();
        let reason = refusal.map_or("other", |r| r.reason);
        st.0.metrics.refused(route, reason, status.as_u16());
        if let Some(suppressed) = LOG.admit() {
            let message = refusal.map_or("", |r| r.message.as_str());
            let peer = peer.map(|p| p.to_string()).unwrap_or_default();
            if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
                tracing::error!(route, reason, status = status.as_u16(), %peer, suppressed, "{message}");
            } else {
                tracing::warn!(route, reason, status = status.as_u16(), %peer, suppressed, "refused: {message}");
            }
        }
    }
    resp
}

/// Refusal log lines allowed per second.
const LOG_BURST: u32 = 10;

static LOG: LogLimit = LogLimit::new();

/// A per-second budget of log lines; lines over it are counted and reported with the next
/// one that gets through.
struct LogLimit {
    state: Mutex<Option<(Instant, u32)>>,
    suppressed: AtomicU64,
}

impl LogLimit {
    const fn new() -> Self {
        LogLimit { state: Mutex::new(None), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines suppressed since the last one logged)` if this line may be logged.
    fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut st = self.state.lock();
        let (start, n) = st.get_or_insert((now, 0));
        if now.duration_since(*start) >= Duration::from_secs(1) {
            *start = now;
            *n = 0;
        }
        if *n >= LOG_BURST {
            self.suppressed.fetch_add(1, Relaxed);
            return None;
        }
        *n += 1;
        Some(self.suppressed.swap(0, Relaxed))
    }
}
