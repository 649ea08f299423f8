//! The shared server state: the core's [`RootState`] in stripes, each behind a lock of its
//! own, the quota store, and the background tasks that keep the two in step.
//!
//! # Stripes
//!
//! Applying a sync is serial work on one state (most of a busy root's CPU), so a root with
//! one lock uses one core for it however many it has. `--stripes N` splits the counters
//! into `N` states by a hash of their id ([`RootState::striped`]); a sync visits them in
//! order, one lock at a time, so while one sync works on stripe 1 the next works on stripe
//! 0. Never two stripe locks at once: no order to get wrong. A sync also holds the `cut`
//! lock shared across its visit, which a copy of the state (`GET /v1/copy`) takes alone,
//! before any stripe lock. Quotas go to the lead (stripe 0) last, so a limiter never
//! learns a quota before the stripe that counts it knows it.
//!
//! # How quotas get from the database into memory
//!
//! A poller reads rows with an epoch above `cursor` (the highest epoch applied) every poll
//! interval and applies them in epoch order. A write through *this* root also applies its
//! rows at once, but only when it is the very next write (`base_epoch == cursor`); otherwise
//! it polls first. Skipping that rule would let this root hand limiters epoch 8 before it
//! saw another root's epoch 7, and limiters, which ask for `epoch > 8` from then on, would
//! never receive 7 from this root.

use crate::db::{QuotaStore, StoreError, Written};
use crate::error::ApiError;
use crate::guard::Gate;
use crate::metrics::{Metrics, Snapshot};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use yarl_core::root::{CopyTaken, RootCopy, SyncAnswer, MAX_STRIPES};
use yarl_core::{Clock, Epoch, MonotonicClock, QuotaUpdate, RootConfig, RootState};

/// Rows per poll query, and updates applied per lock acquisition: bounds how long a sync
/// waits behind a bulk apply.
const APPLY_CHUNK: usize = 10_000;

/// Steps of one sweep pass (see `spawn_background`).
const SWEEP_STEPS: u32 = 50;
/// Counters one sweep step looks at, at most: 1,000,000 counters in 50 steps.
const SWEEP_STEP: usize = 20_000;

/// Server settings beyond the listening address and database URL.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often the database is polled for changes.
    pub poll_interval: Duration,
    /// How often drained counters and idle limiters are dropped.
    pub sweep_interval: Duration,
    /// Bearer token of the admin routes.
    pub admin_token: Option<String>,
    /// Bearer token of `POST /v1/sync`.
    pub sync_token: Option<String>,
    /// The core's limits.
    pub root: RootConfig,
    /// Sync requests decoded and applied at once (each on a blocking thread); see
    /// [`default_sync_concurrency`].
    pub sync_concurrency: usize,
    /// States the counters are split into, each behind its own lock (1 to 64; see the
    /// module docs).
    pub stripes: u32,
    /// KiB of sync bodies (and what decoding them allocates) held at once.
    pub sync_memory_kib: u32,
    /// Admin requests (other than batches) handled at once.
    pub admin_concurrency: usize,
    /// How long a request waits for its turn before `503`.
    pub queue_wait: Duration,
    /// The same for a sync: shorter than a limiter's timeout (the agent's default is
    /// 500 ms), so that a root with more syncs than it can serve refuses what it could not
    /// answer in time, at once, instead of working on requests whose limiters have given up
    /// (and which they send again, with the next batch, an interval later): under overload
    /// it keeps answering what it can in time rather than nothing.
    pub sync_queue_wait: Duration,
}

/// KiB of admin bodies (`PUT`, at most 1 MiB each) read at once: bodies are read before a
/// request takes its admin turn, so that a client that declares a body and stalls holds
/// memory (for about a second, see `guard::read_body_paced`), never a turn; 32 full bodies,
/// or thousands of ordinary ones.
pub const ADMIN_MEMORY_KIB: usize = 32 * 1024;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            poll_interval: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(5),
            admin_token: None,
            sync_token: None,
            root: RootConfig::default(),
            sync_concurrency: default_sync_concurrency(default_stripes()),
            stripes: default_stripes(),
            // Room for one full 64 MiB sync (body and decoded entries, 160 MiB) beside any
            // number of ordinary ones.
            sync_memory_kib: 256 * 1024,
            admin_concurrency: 32,
            queue_wait: Duration::from_secs(2),
            sync_queue_wait: Duration::from_millis(250),
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One stripe per core up to 4: each sync visits every stripe, and past a few the fixed
/// cost of a visit (the session's bookkeeping) outgrows what the split saves; a root with
/// more cores serves more with a shard.
pub fn default_stripes() -> u32 {
    cores().clamp(1, 4) as u32
}

/// Syncs in flight for a root of `stripes` stripes: one per core, plus one per stripe, at
/// least 2. Each stripe applies one sync at a time; a sync waiting for one stripe while
/// another works on the next is what keeps them all busy (at 300 limiters by interest with
/// 2 stripes on 2 cores, p99 15-18 ms with 4 in flight against 25-37 ms with 2), and with
/// one stripe more threads than cores only queue on its lock (and a holder preempted by
/// them stalls every sync).
pub fn default_sync_concurrency(stripes: u32) -> usize {
    let stripes = if stripes > 1 { stripes as usize } else { 0 };
    (cores() + stripes).max(2)
}

/// The concurrency gates of the route groups.
#[derive(Debug)]
pub(crate) struct Guards {
    pub sync: Gate,
    pub sync_memory: Gate,
    pub admin: Gate,
    /// KiB of admin bodies being read at once ([`ADMIN_MEMORY_KIB`]).
    pub admin_memory: Gate,
    pub batch: Gate,
    /// `GET /v1/copy`: one at a time, since each holds every sync for its duration.
    pub copy: Gate,
}

pub(crate) struct Inner {
    /// The stripes, the lead first.
    pub root: Vec<Mutex<RootState>>,
    pub guards: Guards,
    /// The root's epoch, readable without the lock (`/healthz` must answer while a large
    /// sync holds it).
    pub epoch: AtomicU64,
    pub store: Arc<dyn QuotaStore>,
    pub clock: MonotonicClock,
    pub settings: Settings,
    pub metrics: Metrics,
    /// Highest epoch applied; held across a poll so polls and write catch-ups never
    /// interleave.
    cursor: tokio::sync::Mutex<Epoch>,
    /// Held shared by every sync across its stripes, and alone by a copy of the state
    /// (`copy_out`): a copy sees each sync whole or not at all.
    cut: parking_lot::RwLock<()>,
    /// Clock time of the last logged database error (rate limit: one per poll interval).
    last_db_log: AtomicU64,
    /// When the database was last logged as behind this root's epoch (ns; 0: never).
    last_behind_log: AtomicU64,
}

/// The root state, locked; records its wait and hold times when dropped.
pub(crate) struct RootGuard<'a> {
    guard: MutexGuard<'a, RootState>,
    asked: Instant,
    locked: Instant,
    metrics: &'a Metrics,
}

impl std::ops::Deref for RootGuard<'_> {
    type Target = RootState;
    fn deref(&self) -> &RootState {
        &self.guard
    }
}

impl std::ops::DerefMut for RootGuard<'_> {
    fn deref_mut(&mut self) -> &mut RootState {
        &mut self.guard
    }
}

impl Drop for RootGuard<'_> {
    fn drop(&mut self) {
        self.metrics.lock_used(self.locked - self.asked, self.locked.elapsed());
    }
}

/// Cheap to clone; handed to every handler.
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("store", &self.0.store.kind()).finish_non_exhaustive()
    }
}

impl AppState {
    /// A root with empty memory over `store`; call [`AppState::load`] before serving.
    pub fn new(store: Arc<dyn QuotaStore>, settings: Settings) -> Self {
        let wait = settings.queue_wait;
        let guards = Guards {
            sync: Gate::new("sync", settings.sync_concurrency.max(1), settings.sync_queue_wait),
            sync_memory: Gate::new(
                "sync",
                settings.sync_memory_kib.max(1) as usize,
                settings.sync_queue_wait,
            ),
            admin: Gate::new("admin", settings.admin_concurrency.max(1), wait),
            admin_memory: Gate::new("admin", ADMIN_MEMORY_KIB, wait),
            batch: Gate::new("batch", 1, wait.max(Duration::from_secs(10))),
            copy: Gate::new("copy", 1, wait),
        };
        AppState(Arc::new(Inner {
            root: RootState::striped(settings.root.clone(), settings.stripes.clamp(1, MAX_STRIPES))
                .into_iter()
                .map(Mutex::new)
                .collect(),
            guards,
            epoch: AtomicU64::new(0),
            store,
            clock: MonotonicClock::new(),
            settings,
            metrics: Metrics::default(),
            cursor: tokio::sync::Mutex::new(0),
            cut: parking_lot::RwLock::new(()),
            last_db_log: AtomicU64::new(0),
            last_behind_log: AtomicU64::new(0),
        }))
    }

    /// Reads every quota from the database into memory; returns how many rows were read.
    pub async fn load(&self) -> Result<usize, StoreError> {
        let secret = self.0.store.key_secret().await?;
        for stripe in &self.0.root {
            stripe.lock().set_key_secret(secret);
        }
        let mut cursor = self.0.cursor.lock().await;
        self.poll_locked(&mut cursor).await
    }

    /// Reads the changes since the last poll; returns how many rows were applied.
    pub async fn poll(&self) -> Result<usize, StoreError> {
        let mut cursor = self.0.cursor.lock().await;
        self.poll_locked(&mut cursor).await
    }

    /// The admin token this root requires (and presents to the roots it copies from).
    pub fn admin_token(&self) -> Option<String> {
        self.0.settings.admin_token.clone()
    }

    /// The highest epoch applied to memory.
    pub fn epoch(&self) -> Epoch {
        self.0.epoch.load(Relaxed)
    }

    /// Locks stripe `i` of the root state (0, the lead, holds the quotas), blocking: only on
    /// a blocking thread. The time waited and held go to the metrics (the held time is the
    /// root's serial work, what bounds its capacity).
    pub(crate) fn lock_stripe(&self, i: usize) -> RootGuard<'_> {
        let asked = Instant::now();
        let guard = self.0.root[i].lock();
        RootGuard { guard, asked, locked: Instant::now(), metrics: &self.0.metrics }
    }

    /// The stripe that holds the counter of quota `id`.
    pub(crate) fn stripe_of(&self, id: u64) -> usize {
        yarl_core::root::stripe_of(id, self.0.root.len() as u32) as usize
    }

    /// Applies one sync at every stripe in turn (see the module docs) and joins the answers.
    pub(crate) fn sync(
        &self,
        req: &yarl_core::proto::SyncRequest,
        peer: Option<std::net::IpAddr>,
        now: u64,
    ) -> Result<SyncAnswer, yarl_core::proto::SyncError> {
        let asked = Instant::now();
        let _cut = self.0.cut.read();
        // Waits only while a copy of the state is taken (`copy_out`): shown with the waits
        // for the stripes' locks, since it holds every sync the same way.
        self.0.metrics.lock_used(asked.elapsed(), Duration::ZERO);
        let mut version = 0;
        let mut parts = Vec::with_capacity(self.0.root.len());
        for i in 0..self.0.root.len() {
            let mut stripe = self.lock_stripe(i);
            if i == 0 {
                // Before this sync changes anything anywhere: see `SyncAnswer::join`.
                version = stripe.version();
            }
            // A refusal comes from the lead, before anything is applied: every stripe holds
            // the same sessions. Were a later stripe to refuse, the batches it applied stay
            // acknowledged there and are skipped when the limiter sends them again.
            parts.push(stripe.sync_from(req, peer, now)?);
        }
        Ok(SyncAnswer::join(parts, version).expect("a root has at least one stripe"))
    }

    /// The counters and sessions of every stripe at one instant, with no sync half
    /// applied (see `yarl_core::root::RootCopy`), for a restarted root of the shard:
    /// blocking, only on a blocking thread. Syncs wait meanwhile: for the syncs in flight
    /// to end, then for the copy (90 ms for a million counters).
    pub(crate) fn copy_out(&self) -> RootCopy {
        let _cut = self.0.cut.write();
        let now = self.now();
        let parts = (0..self.0.root.len()).map(|i| self.lock_stripe(i).copy_out(now)).collect();
        RootCopy::join(parts)
    }

    /// Marks the root as about to take syncs, before it listens: hints read from answers
    /// older than this add to what it sums (see `yarl_core::RootState::start`).
    pub async fn start(&self) -> Result<(), ApiError> {
        let now = self.now();
        self.with_stripes(move |r| r.start(now)).await?;
        Ok(())
    }

    /// Takes another root's copy as this root's counters and sessions, before it serves a
    /// sync (see `yarl_core::root::RootCopy`).
    /// `age`: at most how long ago the copied root took it (the time since it was asked).
    pub async fn copy_in(&self, copy: RootCopy, age: Duration) -> Result<CopyTaken, ApiError> {
        let copy = Arc::new(copy);
        let now = self.now();
        let age = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
        let taken = self
            .with_stripes(move |r| r.copy_in(&copy, age, now))
            .await?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ApiError::Internal(format!("the copy was not taken: {e}")))?;
        let mut all = CopyTaken::default();
        for t in &taken {
            all.counters += t.counters;
            all.skipped += t.skipped;
        }
        // Every stripe holds every session.
        all.sessions = taken.first().map_or(0, |t| t.sessions);
        Ok(all)
    }

    /// Runs `f` on stripe `i` of the root state on a blocking thread: the lock may be held
    /// by a large sync for a while, and an async worker must never wait for it.
    pub(crate) async fn with_stripe<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce(&mut RootState) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let st = self.clone();
        tokio::task::spawn_blocking(move || f(&mut st.lock_stripe(i)))
            .await
            .map_err(|e| ApiError::Internal(format!("root worker: {e}")))
    }

    /// Runs `f` on every stripe, the lead last, each under its lock in turn, on a blocking
    /// thread; their results in stripe order.
    async fn with_stripes<T: Send + 'static>(
        &self,
        f: impl Fn(&mut RootState) -> T + Send + 'static,
    ) -> Result<Vec<T>, ApiError> {
        let st = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut out: Vec<T> =
                (0..st.0.root.len()).rev().map(|i| f(&mut st.lock_stripe(i))).collect();
            out.reverse();
            out
        })
        .await
        .map_err(|e| ApiError::Internal(format!("root worker: {e}")))
    }

    /// Starts the poller and the sweeper; they stop when the returned value is dropped.
    pub fn spawn_background(&self) -> Background {
        let st = self.clone();
        let poller = tokio::spawn(async move {
            let mut tick = tokio::time::interval(st.0.settings.poll_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match st.poll().await {
                    Ok(_) => st.db_ok(),
                    Err(e) => st.db_failed(&e),
                }
            }
        });
        let st = self.clone();
        let sweeper = tokio::spawn(async move {
            // A pass over every counter once per sweep interval, in 50 steps of at most
            // SWEEP_STEP counters: syncs wait for one step (a millisecond or two), never for
            // a whole pass.
            let mut tick = tokio::time::interval(st.0.settings.sweep_interval / SWEEP_STEPS);
            loop {
                tick.tick().await;
                let now = st.now();
                let _ = st.with_stripes(move |r| r.sweep_step(now, SWEEP_STEP)).await;
            }
        });
        Background { handles: vec![poller, sweeper] }
    }

    pub(crate) fn now(&self) -> u64 {
        self.0.clock.now_nanos()
    }

    async fn poll_locked(&self, cursor: &mut Epoch) -> Result<usize, StoreError> {
        let mut total = 0;
        loop {
            let rows = self.0.store.changes_since(*cursor, APPLY_CHUNK as u32).await?;
            let n = rows.len();
            if let Some(last) = rows.last() {
                *cursor = last.epoch;
            }
            self.apply(rows.into_iter().map(|q| q.into_update())).await;
            total += n;
            if n < APPLY_CHUNK {
                break;
            }
        }
        if total == 0 {
            self.check_db_epoch(*cursor).await?;
        } else {
            // Rows up to the cursor were there: the database is at least that far.
            self.0.metrics.db_epoch.fetch_max(*cursor, Relaxed);
        }
        self.0.metrics.polls.fetch_add(1, Relaxed);
        Ok(total)
    }

    /// A poll that found nothing new also reads the database's epoch: one behind what this
    /// root applied (`cursor`) means the database was recreated or restored, and changes made
    /// since stay unseen until the roots, then nginx, restart (docs/operations.md). Logged
    /// once a minute while it lasts.
    async fn check_db_epoch(&self, cursor: Epoch) -> Result<(), StoreError> {
        let db = self.0.store.db_epoch().await?;
        self.0.metrics.db_epoch.store(db, Relaxed);
        if db >= cursor {
            return Ok(());
        }
        // Latched: once writes take the database past this root's epoch again, the
        // changes made below it are still never polled.
        self.0.metrics.db_went_back.store(true, Relaxed);
        let now = self.now().max(1);
        let last = self.0.last_behind_log.load(Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 60_000_000_000)
            && self.0.last_behind_log.compare_exchange(last, now, Relaxed, Relaxed).is_ok()
        {
            tracing::error!(
                db_epoch = db,
                root_epoch = cursor,
                "the quota database's epoch went back (recreated or restored?): changes made \
                 since are not seen; restart every root, then every nginx"
            );
        }
        Ok(())
    }

    async fn apply(&self, updates: impl Iterator<Item = QuotaUpdate>) {
        let mut updates = updates.peekable();
        while updates.peek().is_some() {
            let chunk: Vec<Arc<QuotaUpdate>> =
                updates.by_ref().take(APPLY_CHUNK).map(Arc::new).collect();
            let now = self.now();
            // The lead last (`with_stripes`): see the module docs.
            let epochs = self
                .with_stripes(move |r| {
                    r.apply_quota_arcs(chunk.iter().cloned(), now);
                    r.epoch()
                })
                .await;
            if let Some(&e) = epochs.as_ref().ok().and_then(|e| e.first()) {
                self.0.epoch.fetch_max(e, Relaxed);
            }
        }
    }

    /// Brings memory up to a write this root just committed (see the module docs).
    pub(crate) async fn catch_up(&self, w: Written) {
        let mut cursor = self.0.cursor.lock().await;
        let last = w.last_epoch();
        if *cursor >= last {
            return;
        }
        if *cursor == w.base_epoch {
            self.apply(w.quotas.into_iter().map(|q| q.into_update())).await;
            *cursor = last;
            self.0.metrics.db_epoch.fetch_max(last, Relaxed);
            return;
        }
        drop(w);
        if let Err(e) = self.poll_locked(&mut cursor).await {
            // The write is committed; the poller will bring it in once the database answers.
            self.db_failed(&e);
        }
    }

    pub(crate) fn db_ok(&self) {
        if self.0.metrics.db_down.swap(false, Relaxed) {
            tracing::info!(db = self.0.store.kind(), "quota database reachable again");
        }
    }

    /// Counts a database failure and logs it at most once per poll interval, however many
    /// requests fail.
    pub(crate) fn db_failed(&self, e: &StoreError) {
        if !matches!(e, StoreError::Unavailable(_) | StoreError::Invalid(_)) {
            return;
        }
        let m = &self.0.metrics;
        m.db_errors.fetch_add(1, Relaxed);
        m.db_down.store(true, Relaxed);
        let now = self.now().max(1);
        let every = u64::try_from(self.0.settings.poll_interval.as_nanos()).unwrap_or(u64::MAX);
        let last = self.0.last_db_log.load(Relaxed);
        if (last == 0 || now.saturating_sub(last) >= every)
            && self.0.last_db_log.compare_exchange(last, now, Relaxed, Relaxed).is_ok()
        {
            tracing::warn!(
                db = self.0.store.kind(),
                "quota database unavailable, serving limiters from memory: {e}"
            );
        }
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot, ApiError> {
        let now = self.now();
        let parts = self
            .with_stripes(move |r| {
                (
                    r.stats(),
                    r.limiter_count(),
                    r.quota_count(),
                    r.counter_count(),
                    r.parked_count(),
                    r.epoch(),
                    r.key_count(),
                    r.template_keys(),
                    r.in_flight_stats(now),
                )
            })
            .await?;
        let (stats, limiters, quotas, _, _, epoch, _, _, _) = parts[0].clone();
        let mut snap = Snapshot {
            stats,
            limiters,
            quotas,
            counters: 0,
            parked: 0,
            keys: 0,
            templates: Vec::new(),
            in_flight: Vec::new(),
            epoch,
            stripes: parts.len(),
        };
        let mut templates: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
        for (i, p) in parts.into_iter().enumerate() {
            if i > 0 {
                snap.stats.add_stripe(&p.0);
            }
            snap.counters += p.3;
            snap.parked += p.4;
            snap.keys += p.6;
            for (name, held, refused) in p.7 {
                let t = templates.entry(name).or_default();
                t.0 += held;
                t.1 += refused;
            }
            snap.in_flight.extend(p.8.into_iter().map(|(_, name, s)| (name, s)));
        }
        snap.templates = templates.into_iter().map(|(n, (h, r))| (n, h, r)).collect();
        Ok(snap)
    }
}

/// The running background tasks; dropping it stops them.
#[derive(Debug)]
pub struct Background {
    handles: Vec<JoinHandle<()>>,
}

impl Drop for Background {
    fn drop(&mut self) {
        for h in &self.handles {
            h.abort();
        }
    }
}
