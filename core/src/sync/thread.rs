//! The background sync thread: one OS thread running a single-threaded tokio runtime, so all
//! roots are called in parallel without a thread per root.

use super::{SyncEngine, SyncStatus};
use crate::proto::{SyncRequest, SyncResponse};
use parking_lot::Mutex;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Boxed future of one sync call.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<SyncResponse, String>> + Send>>;

/// How a sync request reaches a root.
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` to the root at `url`; resolves within `timeout` or fails.
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture;
}

/// JSON over HTTP: `POST {url}/v1/sync`, optional bearer token.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    token: Option<Arc<str>>,
}

impl HttpTransport {
    /// A transport sending `Authorization: Bearer <token>` when a token is given.
    pub fn new(token: Option<String>) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        Ok(HttpTransport { client, token: token.map(Into::into) })
    }
}

impl Transport for HttpTransport {
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture {
        let endpoint = format!("{}/v1/sync", url.trim_end_matches('/'));
        let mut rb = self.client.post(endpoint).timeout(timeout).json(&req);
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        Box::pin(async move {
            let resp = rb.send().await.map_err(|e| describe(&e))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().await.unwrap_or_default();
                let body: String = body.chars().take(200).collect();
                return Err(format!("HTTP {}: {}", status.as_u16(), body.trim()));
            }
            let body = resp.bytes().await.map_err(|e| describe(&e))?;
            serde_json::from_slice::<SyncResponse>(&body).map_err(|e| format!("bad answer: {e}"))
        })
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection failed".into()
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            s.push_str(": ");
            s.push_str(&inner.to_string());
            src = inner.source();
        }
        s
    }
}

struct Shared {
    stop: AtomicBool,
    wake: tokio::sync::Notify,
    status: Mutex<SyncStatus>,
}

/// A running sync thread. [`SyncThread::stop`] (or drop) stops and joins it.
pub struct SyncThread {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SyncThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncThread").field("running", &self.handle.is_some()).finish()
    }
}

impl SyncThread {
    /// Starts the thread. The caller decides its signal mask (nginx blocks all signals
    /// around this call so the thread inherits none).
    pub fn spawn(mut engine: SyncEngine, transport: Arc<dyn Transport>) -> std::io::Result<Self> {
        let now = engine.limiter().clock().now_nanos();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            status: Mutex::new(engine.status(now)),
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let sh = shared.clone();
        let handle = std::thread::Builder::new().name("yarl-sync".into()).spawn(move || {
            rt.block_on(run(&mut engine, &*transport, &sh));
            // Shut the runtime down here, inside the thread, without waiting for blocking
            // tasks: a DNS lookup stuck in getaddrinfo must not hold nginx's worker exit.
            rt.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(SyncThread { shared, handle: Some(handle) })
    }

    /// The state after the last round.
    pub fn status(&self) -> SyncStatus {
        self.shared.status.lock().clone()
    }

    /// Stops the thread and waits for it (at most about one call timeout).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn run(engine: &mut SyncEngine, transport: &dyn Transport, shared: &Shared) {
    let interval = engine.config().interval;
    let timeout = engine.config().timeout;
    let clock = engine.limiter().clock().clone();
    let mut next = tokio::time::Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        let calls = engine.begin_round(clock.now_nanos());
        let mut set = tokio::task::JoinSet::new();
        for call in calls {
            let fut = transport.call(&call.url, call.request, timeout);
            let root = call.root;
            set.spawn(async move {
                let start = Instant::now();
                let r = match tokio::time::timeout(timeout, fut).await {
                    Ok(r) => r,
                    Err(_) => Err("timed out".to_string()),
                };
                (root, r, start.elapsed())
            });
        }
        loop {
            tokio::select! {
                joined = set.join_next() => match joined {
                    Some(Ok((root, r, lat))) => engine.on_response(root, r, lat, clock.now_nanos()),
                    Some(Err(e)) => tracing_free_log(&e.to_string()),
                    None => break,
                },
                _ = shared.wake.notified() => {
                    if shared.stop.load(Ordering::Acquire) { return; }
                }
            }
        }
        let report = engine.end_round(clock.now_nanos());
        *shared.status.lock() = engine.status(clock.now_nanos());
        if report.more {
            continue;
        }
        next += interval;
        let now = tokio::time::Instant::now();
        if next < now {
            // Fell behind (a slow round): don't burst to catch up.
            next = now;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

/// A call task panicked; there is nobody to tell but stderr (the nginx module logs roots'
/// state through `yarl_stats`).
fn tracing_free_log(msg: &str) {
    eprintln!("yarl-sync: sync call task failed: {msg}");
}
