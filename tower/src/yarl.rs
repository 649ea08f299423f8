//! The limiter and its background sync, started and stopped with the service.
//!
//! A [`Yarl`] owns one [`Limiter`] (every quota and counter in memory) and, when it has
//! roots, one tokio task on the application's runtime that runs the agent's round loop
//! ([`yarl_agent::drive`]) once per interval. Decisions never wait for that task: the
//! layer only reads and adds to the limiter's counters.
//!
//! # Shutdown
//!
//! [`Yarl::shutdown`] asks the task for one last round that *begins after the request*, so
//! what was accounted up to then reaches the roots (the other limiters see it at their next
//! sync), then waits for the task to end, at most about two call timeouts. Dropping the
//! last handle without calling it tells the task to stop, without that last round; it ends
//! at its next wake (within 10 ms, or when a round in progress ends), so the limiter takes
//! a new sync task only then: await `shutdown` to hand it on at once. A `shutdown`
//! cancelled on the way (under a timeout of the caller's) leaves the last round running;
//! a later call waits for it again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use yarl_agent::{parse_root_url, HttpOptions, HttpTransport, Supervisor, Transport};
use yarl_core::sync::EngineError;
use yarl_core::{
    Clock, Limiter, SyncConfig, SyncEngine, SyncStatus, DEFAULT_CAPACITY, DEFAULT_KEYS,
};

/// Most roots one limiter syncs with (the slots of its memory block).
pub const MAX_ROOTS: usize = yarl_core::zone::MAX_ROOTS;

/// Why a [`Yarl`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A root URL the HTTP client cannot use.
    #[error("root URL {url:?}: {why}")]
    BadRoot {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// More roots than a limiter can sync with.
    #[error("{0} roots given, at most {MAX_ROOTS} are supported")]
    TooManyRoots(usize),
    /// The same root twice: its counters would be merged with themselves.
    #[error("root URL {0:?} is listed twice")]
    DuplicateRoot(String),
    /// The sync token cannot be sent in an `Authorization` header.
    #[error("the sync token must be 1 to 4096 visible ASCII characters without blanks")]
    BadToken,
    /// The HTTP(S) transport could not be built (an unreadable or invalid CA file, …).
    #[error(transparent)]
    Transport(#[from] yarl_agent::TransportError),
    /// The sync engine refused the configuration (a zero interval or timeout), or the
    /// limiter given with [`YarlBuilder::limiter`] already has a sync engine.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A rejection status outside 400–599 ([`YarlLayer::try_status`](crate::YarlLayer::try_status)).
    #[error("rejection status {0} is not in 400-599")]
    BadStatus(u16),
    /// [`YarlBuilder::start`] was called outside a tokio runtime.
    #[error("the sync task needs a tokio runtime: start the limiter from within one")]
    NoRuntime,
}

/// Builder of a [`Yarl`]; see [`Yarl::builder`].
pub struct YarlBuilder {
    roots: Vec<String>,
    token: Option<String>,
    ca_file: Option<PathBuf>,
    sync: SyncConfig,
    capacity: u32,
    keys: u32,
    clock: Option<Arc<dyn Clock>>,
    limiter: Option<Arc<Limiter>>,
    transport: Option<Arc<dyn Transport>>,
}

impl std::fmt::Debug for YarlBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("YarlBuilder")
            .field("roots", &self.roots)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("ca_file", &self.ca_file)
            .field("sync", &self.sync)
            .field("capacity", &self.capacity)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl YarlBuilder {
    /// Root servers to sync with (the module's `yarl_roots`): `http://host:port` or
    /// `https://host:port`. Without roots the limiter only limits on what it counts itself
    /// and holds only the quotas given to [`Limiter::apply_quotas`] (the task still runs a
    /// round per interval: that is when its own counts start draining).
    pub fn roots<I, U>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.roots = urls.into_iter().map(Into::into).collect();
        self
    }

    /// Bearer token sent to the roots (`yarl_sync_token`; the root's `--sync-token-file`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// PEM file of the CA certificates that verify `https://` roots, instead of the system's
    /// trust store (`yarl_sync_ca`).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// How often to sync (default 1 s, `yarl_sync_interval`). The limiter's extrapolation
    /// horizon follows it.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.sync.interval = interval;
        self
    }

    /// Timeout of one sync call to one root (default 500 ms, `yarl_sync_timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.sync.timeout = timeout;
        self
    }

    /// Every sync setting at once (backoff and retries included).
    pub fn sync_config(mut self, config: SyncConfig) -> Self {
        self.sync = config;
        self
    }

    /// How many quotas the limiter holds (default [`DEFAULT_CAPACITY`], about a million; the
    /// memory is reserved, and backed only as quotas arrive). Quotas beyond it stay
    /// unlimited.
    pub fn capacity(mut self, quotas: u32) -> Self {
        self.capacity = quotas;
        self
    }

    /// How many keys (names under templates, such as `api_key_*`: a bucket per client) the
    /// limiter holds at once (default [`DEFAULT_KEYS`], about a million, 129 bytes each);
    /// a new key takes the place of a drained one when it must, never that of a client
    /// being limited while a key closer to drained is there.
    pub fn keys(mut self, keys: u32) -> Self {
        self.keys = keys;
        self
    }

    /// The limiter's time source (default: the monotonic clock); tests pass a
    /// [`yarl_core::ManualClock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Uses this limiter instead of building one (its own clock, estimator, capacity and
    /// keys; then [`capacity`](Self::capacity), [`keys`](Self::keys) and
    /// [`clock`](Self::clock) are ignored).
    pub fn limiter(mut self, limiter: Arc<Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// How sync requests reach the roots (default: [`HttpTransport`] with the token and CA
    /// file above); tests pass an in-process root.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Builds the limiter and starts its sync task on the current tokio runtime. Call it
    /// from within the runtime that serves the application.
    pub fn start(self) -> Result<Yarl, Error> {
        let limiter = match self.limiter {
            Some(l) => l,
            None => {
                let mut b = Limiter::builder()
                    .capacity(self.capacity)
                    .keys(self.keys)
                    .horizon(self.sync.interval);
                if let Some(c) = self.clock {
                    b = b.clock(c);
                }
                Arc::new(b.build())
            }
        };
        if self.roots.len() > MAX_ROOTS {
            return Err(Error::TooManyRoots(self.roots.len()));
        }
        let mut roots: Vec<String> = Vec::with_capacity(self.roots.len());
        for url in &self.roots {
            let u = parse_root_url(url).map_err(|why| Error::BadRoot { url: url.clone(), why })?;
            if roots.contains(&u) {
                return Err(Error::DuplicateRoot(url.clone()));
            }
            roots.push(u);
        }
        if let Some(t) = &self.token {
            if t.is_empty() || t.len() > 4096 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::BadToken);
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let transport: Arc<dyn Transport> = match self.transport {
            Some(t) => t,
            None => {
                let opts =
                    HttpOptions { token: self.token, ca_file: self.ca_file, ..Default::default() };
                Arc::new(HttpTransport::new(&opts)?)
            }
        };
        let timeout = self.sync.timeout;
        let engine = SyncEngine::new(limiter.clone(), roots, self.sync)?;
        let shared = Arc::new(Shared {
            state: AtomicU8::new(RUNNING),
            final_begun: AtomicBool::new(false),
            final_done: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            status: Mutex::new(engine.status(limiter.clock().now_nanos())),
        });
        let task = runtime.spawn(run(engine, transport, shared.clone()));
        let sync = SyncTask { shared, task: Mutex::new(Some(task)), timeout };
        Ok(Yarl { inner: Arc::new(Inner { limiter, sync: Some(sync) }) })
    }
}

/// A limiter and its background sync with the roots; cheap to clone (all clones share
/// them). See the [crate docs](crate) for an example.
#[derive(Clone)]
pub struct Yarl {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Yarl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Yarl")
            .field("limiter", &self.inner.limiter)
            .field("syncing", &self.is_syncing())
            .finish()
    }
}

impl Yarl {
    /// A builder with the module's defaults: no roots, 1 s interval, 500 ms timeout.
    pub fn builder() -> YarlBuilder {
        YarlBuilder {
            roots: Vec::new(),
            token: None,
            ca_file: None,
            sync: SyncConfig::default(),
            capacity: DEFAULT_CAPACITY,
            keys: DEFAULT_KEYS,
            clock: None,
            limiter: None,
            transport: None,
        }
    }

    /// A handle on `limiter` without a sync task: for tests of rules, or an application that
    /// drives the limiter's sync itself (`yarl_agent::SyncThread`). Quotas come from
    /// [`Limiter::apply_quotas`] or that sync; without any sync round, what the limiter
    /// counts never drains (a round folds it into the drained part of each counter).
    pub fn unsynced(limiter: Arc<Limiter>) -> Yarl {
        Yarl { inner: Arc::new(Inner { limiter, sync: None }) }
    }

    /// The limiter: [`Limiter::check`], [`Limiter::account`], [`Limiter::charge`] and its
    /// views ([`Limiter::quota`], [`Limiter::zone_status`]) for what a layer does not cover.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.inner.limiter
    }

    /// A layer deciding on the quotas `rule` names for each request; see
    /// [`YarlLayer`](crate::YarlLayer).
    pub fn layer<R: crate::Rule>(&self, rule: R) -> crate::YarlLayer<R> {
        crate::YarlLayer::new(self.clone(), rule)
    }

    /// Whether the sync task runs (false for [`unsynced`](Self::unsynced) handles, after
    /// [`shutdown`](Self::shutdown), or if the task ended by itself).
    pub fn is_syncing(&self) -> bool {
        self.inner.sync.as_ref().is_some_and(|s| {
            s.task
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(|t| !t.is_finished())
        })
    }

    /// The sync state after the last round (roots, their last result, epoch, quotas); `None`
    /// for [`unsynced`](Self::unsynced) handles.
    pub fn sync_status(&self) -> Option<SyncStatus> {
        self.inner.sync.as_ref().map(|s| s.shared.status())
    }

    /// Stops the sync task gracefully: one last round sends what was accounted until now,
    /// then the task ends. Waits at most about two sync timeouts (a round in progress, then
    /// the last one) before giving up on the round and aborting the task. Returns the final
    /// sync state (`None` for [`unsynced`](Self::unsynced) handles). Every clone shares the task: the first call stops
    /// it, later calls return once it has stopped (at once if it has). The limiter itself keeps deciding afterwards, on what
    /// it knows.
    pub async fn shutdown(&self) -> Option<SyncStatus> {
        let sync = self.inner.sync.as_ref()?;
        let sh = &sync.shared;
        let _ = sh.state.compare_exchange(RUNNING, FLUSH, Ordering::AcqRel, Ordering::Acquire);
        sh.wake.notify_one();
        // The task's handle stays where every call sees it, and each call waits for the
        // task itself: a call cancelled on the way (under a timeout of the caller's) leaves
        // a later one to wait for the end, where a handle taken out of the handle's place
        // went with the cancelled call and later calls returned at once.
        let limit = sync.timeout.saturating_mul(2).saturating_add(Duration::from_millis(500));
        if !sync.ended_within(limit).await {
            sh.state.store(STOP, Ordering::Release);
            if let Some(task) = sync.task.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
                task.abort();
            }
            // Aborted, it ends at its next poll.
            sync.ended_within(Duration::MAX).await;
        }
        Some(sh.status())
    }
}

struct Inner {
    limiter: Arc<Limiter>,
    sync: Option<SyncTask>,
}

struct SyncTask {
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    timeout: Duration,
}

impl SyncTask {
    /// Whether the task ended (or never ran) within `limit`, looking every 5 ms.
    async fn ended_within(&self, limit: Duration) -> bool {
        let ended = || {
            let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
            task.as_ref().is_none_or(|t| t.is_finished())
        };
        let start = tokio::time::Instant::now();
        while !ended() {
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }
}

impl Drop for SyncTask {
    /// The last handle is gone: stop the task without the final round (nobody waits for it).
    fn drop(&mut self) {
        self.shared.state.store(STOP, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

const RUNNING: u8 = 0;
/// One more round, begun after the request, then stop.
const FLUSH: u8 = 1;
const STOP: u8 = 2;

struct Shared {
    state: AtomicU8,
    /// A round began after the flush was asked for.
    final_begun: AtomicBool,
    /// That round ended.
    final_done: AtomicBool,
    wake: tokio::sync::Notify,
    status: Mutex<SyncStatus>,
}

impl Shared {
    fn status(&self) -> SyncStatus {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn stopping(&self) -> bool {
        match self.state.load(Ordering::Acquire) {
            RUNNING => false,
            FLUSH => self.final_done.load(Ordering::Acquire),
            _ => true,
        }
    }
}

/// Marks the round that begins after a flush request as the final one.
struct Finisher(Arc<Shared>);

impl Supervisor for Finisher {
    fn before_round(&mut self) -> bool {
        match self.0.state.load(Ordering::Acquire) {
            RUNNING => true,
            FLUSH => {
                self.0.final_begun.store(true, Ordering::Release);
                true
            }
            _ => false,
        }
    }
}

async fn run(mut engine: SyncEngine, transport: Arc<dyn Transport>, shared: Arc<Shared>) {
    let mut supervisor = Finisher(shared.clone());
    let stop = || shared.stopping();
    yarl_agent::drive(&mut engine, &*transport, &mut supervisor, &stop, &shared.wake, |s| {
        *shared.status.lock().unwrap_or_else(PoisonError::into_inner) = s;
        if shared.state.load(Ordering::Acquire) == FLUSH {
            if shared.final_begun.load(Ordering::Acquire) {
                shared.final_done.store(true, Ordering::Release);
            }
            // Skip the wait for the next interval: the final round starts, or the loop ends.
            shared.wake.notify_one();
        }
    })
    .await;
}
