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

    /// Takes `n` permits if they are free now.
    pub fn try_enter_n(&self, n: u32) -> Result<OwnedSemaphorePermit, ApiError> {
        self.sem.clone().try_acquire_many_owned(n).map_err(|_| ApiError::Busy(self.name))
    }
}

/// The `Content-Length` a request declares, if any.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Reads a body of at most `limit` bytes within `deadline`. A declared length over the
/// limit is refused before a byte is read; a streamed body is cut at the limit.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, ApiError> {
    if declared_length(headers).is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    let read = Limited::new(body, limit).collect();
    match tokio::time::timeout(deadline, read).await {
        Err(_) => Err(ApiError::BodyTimeout(deadline)),
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(ApiError::TooLarge { limit }),
        Ok(Err(e)) => Err(ApiError::Body(e.to_string())),
    }
}

/// KiB of a gate's permits taken at a time while a metered body arrives.
const METER_STEP_KIB: u32 = 64;

/// Reads a body like [`read_body`], taking `gate`'s permits (KiB) as its bytes arrive, in
/// steps of [`METER_STEP_KIB`], rather than for its declared length up front: a request that
/// declares 64 MiB and sends nothing holds nothing while it waits, so stalled requests
/// cannot hold the budget the others need. Returns the body and the permits it holds.
pub(crate) async fn read_body_metered(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
    gate: &Gate,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), ApiError> {
    if declared_length(headers).is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    let read = async {
        let mut body = Limited::new(body, limit);
        // The frames as they came (no copy), joined once at the end.
        let mut frames: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut held_kib = 0u32;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                if e.is::<LengthLimitError>() {
                    ApiError::TooLarge { limit }
                } else {
                    ApiError::Body(e.to_string())
                }
            })?;
            let Ok(data) = frame.into_data() else { continue };
            len += data.len();
            frames.push(data);
            let want = u32::try_from(len.div_ceil(1024))
                .unwrap_or(u32::MAX)
                .next_multiple_of(METER_STEP_KIB);
            if want > held_kib {
                // The first step waits its turn like any request; later ones do not: a body
                // that cannot grow now gives back what it holds at once, rather than
                // holding it while it waits for bodies that may be waiting for it.
                let more = match held {
                    None => gate.enter_n(want - held_kib).await?,
                    Some(_) => gate.try_enter_n(want - held_kib)?,
                };
                match &mut held {
                    Some(h) => h.merge(more),
                    None => held = Some(more),
                }
                held_kib = want;
            }
        }
        let body = match frames.len() {
            0 => Bytes::new(),
            1 => frames.pop().unwrap_or_default(),
            _ => {
                let mut buf = Vec::with_capacity(len);
                for f in frames {
                    buf.extend_from_slice(&f);
                }
                Bytes::from(buf)
            }
        };
        Ok((body, held))
    };
    match tokio::time::timeout(deadline, read).await {
        Err(_) => Err(ApiError::BodyTimeout(deadline)),
        Ok(r) => r,
    }
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
