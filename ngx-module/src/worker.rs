//! Per-worker state: the limiter the access handler decides with, and the sync thread that
//! feeds it.
//!
//! nginx workers are single-threaded processes, so these are process-wide statics, set once in
//! `init_process` (after the fork: threads never exist in the master, they would not survive
//! it) and torn down in `exit_process`. The sync thread shares nothing with nginx but the
//! `Arc<Limiter>`: it never calls an nginx API.

use crate::conf::MainConf;
use crate::report::RequestCounters;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use yarl_core::sync::{HttpTransport, SyncThread};
use yarl_core::{Limiter, SyncConfig, SyncEngine, SyncStatus};

struct Worker {
    limiter: Arc<Limiter>,
    interval: Duration,
    timeout: Duration,
}

static WORKER: OnceLock<Worker> = OnceLock::new();
static THREAD: Mutex<Option<SyncThread>> = Mutex::new(None);

/// Counters behind `yarl_stats`' `requests` (process-local like everything here).
pub struct Counters {
    checked: AtomicU64,
    passed: AtomicU64,
    unlimited: AtomicU64,
    rejected: AtomicU64,
    rejected_dry_run: AtomicU64,
}

/// The handler's counters.
pub static COUNTERS: Counters = Counters {
    checked: AtomicU64::new(0),
    passed: AtomicU64::new(0),
    unlimited: AtomicU64::new(0),
    rejected: AtomicU64::new(0),
    rejected_dry_run: AtomicU64::new(0),
};

/// One outcome of the access handler, for [`COUNTERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// All matched quotas passed.
    Passed,
    /// No rule matched a quota.
    Unlimited,
    /// Rejected.
    Rejected,
    /// Rejected, passed by dry run.
    RejectedDryRun,
}

impl Counters {
    /// Counts one decided request.
    pub fn count(&self, what: Counted) {
        self.checked.fetch_add(1, Relaxed);
        match what {
            Counted::Passed => &self.passed,
            Counted::Unlimited => &self.unlimited,
            Counted::Rejected => &self.rejected,
            Counted::RejectedDryRun => &self.rejected_dry_run,
        }
        .fetch_add(1, Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> RequestCounters {
        RequestCounters {
            checked: self.checked.load(Relaxed),
            passed: self.passed.load(Relaxed),
            unlimited: self.unlimited.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            rejected_dry_run: self.rejected_dry_run.load(Relaxed),
        }
    }
}

/// The limiter of this worker, once [`start`] ran.
pub fn limiter() -> Option<&'static Arc<Limiter>> {
    WORKER.get().map(|w| &w.limiter)
}

/// Interval and timeout in force.
pub fn settings() -> Option<(Duration, Duration)> {
    WORKER.get().map(|w| (w.interval, w.timeout))
}

/// The sync thread's last snapshot, when a thread runs.
pub fn status() -> Option<SyncStatus> {
    let guard = THREAD.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().map(SyncThread::status)
}

/// Builds this worker's limiter and starts its sync thread. An error leaves the worker
/// without a sync thread (quotas never arrive, every request passes): the caller logs it.
pub fn start(mc: &MainConf) -> Result<(), String> {
    let interval = mc.interval();
    let timeout = mc.timeout();
    let limiter = Arc::new(Limiter::builder().horizon(interval).build());
    if WORKER.set(Worker { limiter: limiter.clone(), interval, timeout }).is_err() {
        // Single-process mode re-reads the configuration without a new process: keep the
        // limiter and thread that already run.
        return Ok(());
    }
    let roots = mc.roots.clone().unwrap_or_default();
    let config = SyncConfig { interval, timeout, ..SyncConfig::default() };
    let engine = SyncEngine::new(limiter, roots, config).map_err(|e| e.to_string())?;
    let transport = Arc::new(HttpTransport::new(mc.token.clone())?);
    let thread = with_signals_blocked(|| SyncThread::spawn(engine, transport))
        .map_err(|e| format!("cannot start the sync thread: {e}"))?;
    *THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
    Ok(())
}

/// Stops and joins the sync thread (bounded by about one sync timeout).
pub fn stop() {
    let thread = THREAD.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(t) = thread {
        t.stop();
    }
}

/// Runs `f` with every asynchronous signal blocked in the calling thread, so a thread started
/// by `f` inherits a mask that leaves SIGQUIT, SIGHUP, SIGTERM... to the worker's event loop
/// (what nginx's own thread pools do, ngx_thread_pool.c).
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset initialize it.
    let mut all: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: valid pointers to owned sigsets; the synchronous fault signals stay unblocked
    // because blocking them would turn a crash into undefined behaviour.
    let blocked = unsafe {
        libc::sigfillset(&mut all);
        for s in [libc::SIGILL, libc::SIGFPE, libc::SIGSEGV, libc::SIGBUS] {
            libc::sigdelset(&mut all, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0
    };
    let out = f();
    if blocked {
        // SAFETY: restores the mask saved above in the same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    }
    out
}
