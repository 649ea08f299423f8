//! Per-worker state: the handle on the zone's limiter that the access handler decides with,
//! and, in exactly one worker at a time, the sync agent.
//!
//! Every worker attaches to the zone in `init_process` and arms a timer. On each tick
//! ([`tick`], in the worker's event loop) a worker without the agent tries the zone's agent
//! lease: it is free, stale (not renewed for two intervals plus a timeout), or held by a
//! worker that no longer exists ([`alive`]: the master respawned a killed worker). The
//! winner starts the sync thread, with every signal blocked, and the thread renews the lease
//! before each round ([`LeaseKeeper`]). It hands over (stops, releases the lease) when the
//! zone's generation moves on: the master bumps it when a reload reuses the zone, so the
//! first worker of the new configuration takes over within about one interval and an old
//! worker still finishing requests never syncs with old settings for long. A stopped
//! thread is joined on the next tick; `exit_process` stops and joins it before the worker
//! exits. The thread never calls an nginx API: it only touches the zone through atomics.

use crate::conf::MainConf;
use crate::report::RequestCounters;
use core::ptr::addr_of_mut;
use ngx::ffi::{
    ngx_add_timer, ngx_cycle_t, ngx_del_timer, ngx_event_t, ngx_exiting, ngx_log_t, ngx_msec_t,
    ngx_process, ngx_quit, ngx_terminate, ngx_worker, NGX_LOG_ALERT, NGX_LOG_NOTICE, NGX_LOG_WARN,
    NGX_PROCESS_WORKER,
};
use ngx::ngx_log_error;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use yarl_agent::{HttpOptions, HttpTransport, Supervisor, SyncThread, Transport};
use yarl_core::sync::RootStatus;
use yarl_core::{Clock, Limiter, SyncConfig, SyncEngine};

/// The system's monotonic clock, the same in every process (the zone stores times).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_nanos(&self) -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC exists on
        // every platform nginx supports here.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
    }
}

/// What this worker knows.
pub struct Worker {
    /// The handle on the zone's limiter.
    pub limiter: Arc<Limiter>,
    /// `yarl_sync_interval`.
    pub interval: Duration,
    /// `yarl_sync_timeout`.
    pub timeout: Duration,
    /// `yarl_sync_early`.
    pub early: bool,
    /// `yarl_sync_answers touched`.
    pub interest: bool,
    /// `yarl_roots`.
    pub roots: Vec<String>,
    /// `yarl_roots ... shard=INDEX/COUNT` lines: the roots of each shard.
    pub shards: Option<Vec<Vec<String>>>,
    token: Option<String>,
    ca: Option<std::path::PathBuf>,
    pid: u32,
    /// The zone generation of this worker's configuration.
    generation: u64,
    /// This worker's lane of the zone's request counters.
    lane: usize,
    /// Where the agent thread may run when this worker is pinned ([`agent_cpus`]).
    agent_cpus: Option<libc::cpu_set_t>,
}

static WORKER: OnceLock<Worker> = OnceLock::new();
static AGENT: Mutex<Option<SyncThread>> = Mutex::new(None);
/// Clock time before which this worker does not try to become the agent again (after its
/// agent stopped).
static RETRY_AT: AtomicU64 = AtomicU64::new(0);
/// Clock time of the last "zone full" alert.
static LAST_ALERT: AtomicU64 = AtomicU64::new(0);

/// Indices of the request counters among the zone's embedder counters.
mod aux {
    pub const CHECKED: usize = 0;
    pub const PASSED: usize = 1;
    pub const UNLIMITED: usize = 2;
    pub const REJECTED: usize = 3;
    pub const REJECTED_DRY_RUN: usize = 4;
}

/// One outcome of the access handler, counted host-wide in the zone.
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

/// Counts one decided request, in this worker's lane of the zone's counters.
pub fn count(what: Counted) {
    let Some(w) = WORKER.get() else { return };
    let add = |i| {
        if let Some(c) = w.limiter.aux_counter(w.lane, i) {
            c.fetch_add(1, Relaxed);
        }
    };
    add(aux::CHECKED);
    add(match what {
        Counted::Passed => aux::PASSED,
        Counted::Unlimited => aux::UNLIMITED,
        Counted::Rejected => aux::REJECTED,
        Counted::RejectedDryRun => aux::REJECTED_DRY_RUN,
    });
}

/// The host's request counters.
pub fn counters() -> RequestCounters {
    let Some(l) = limiter() else { return RequestCounters::default() };
    let get = |i| l.aux_sum(i);
    RequestCounters {
        checked: get(aux::CHECKED),
        passed: get(aux::PASSED),
        unlimited: get(aux::UNLIMITED),
        rejected: get(aux::REJECTED),
        rejected_dry_run: get(aux::REJECTED_DRY_RUN),
    }
}

/// This worker's state, once [`start`] ran.
pub fn worker() -> Option<&'static Worker> {
    WORKER.get()
}

/// The limiter handle of this worker.
pub fn limiter() -> Option<&'static Arc<Limiter>> {
    WORKER.get().map(|w| &w.limiter)
}

/// Whether a worker runs the sync agent: the lease holder exists and renewed it within two
/// intervals and a timeout.
pub fn agent_alive() -> bool {
    let Some(w) = WORKER.get() else { return false };
    let lease = w.limiter.agent_lease();
    let now = w.limiter.clock().now_nanos();
    lease.holder().is_some_and(|pid| {
        alive(pid) && u128::from(lease.age_ms(now)) < (w.interval * 2 + w.timeout).as_millis()
    })
}

/// The configured roots, each with what the sync agent last recorded for it.
pub fn root_statuses() -> Vec<RootStatus> {
    let Some(w) = WORKER.get() else { return Vec::new() };
    w.roots
        .iter()
        .map(|url| {
            w.limiter
                .root_status(url)
                .unwrap_or_else(|| RootStatus { url: url.clone(), ..RootStatus::default() })
        })
        .collect()
}

/// Whether the process `pid` exists and is a worker of this nginx (a child of our master):
/// a dead worker's pid taken by another process since must not keep its ledger row, and
/// the slots it held, forever.
pub fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(p, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // Where /proc cannot be read (another user's process under `hidepid`), existence is
    // all there is to go on.
    match std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| crate::parse::ppid_of_stat(&s))
    {
        // SAFETY: getppid has no preconditions.
        Some(ppid) => i64::from(ppid) == i64::from(unsafe { libc::getppid() }),
        None => true,
    }
}

/// Attaches this worker to the zone and arms its tick. An error leaves the worker without
/// a limiter (every request passes): the caller logs it.
pub fn start(mc: &MainConf, cycle: *mut ngx_cycle_t) -> Result<(), String> {
    if WORKER.get().is_some() {
        // Single-process mode re-reads the configuration in the same process: keep going.
        return Ok(());
    }
    let block = crate::zone::of(mc).ok_or("the shared memory zone is missing")?;
    let interval = mc.interval();
    let limiter = Limiter::builder()
        .clock(Arc::new(SystemClock))
        .horizon(interval)
        // Every worker's checks name their counters to the agent, whichever worker runs it.
        .watch_checks(mc.interest())
        .open(block)
        .map_err(|e| e.to_string())?;
    let generation = limiter.generation();
    let w = Worker {
        limiter: Arc::new(limiter),
        interval,
        timeout: mc.timeout(),
        early: mc.early(),
        interest: mc.interest(),
        roots: mc.roots.clone().unwrap_or_default(),
        shards: mc.root_map.shards(),
        token: mc.token.clone(),
        ca: mc.ca.clone(),
        pid: std::process::id(),
        generation,
        // SAFETY: ngx_worker is set by the master before forking and read-only here.
        lane: unsafe { ngx_worker } % yarl_core::zone::AUX_LANES,
        // SAFETY: ngx_process is set by the master before forking and read-only here.
        agent_cpus: agent_cpus(unsafe { ngx_process } as u32 == NGX_PROCESS_WORKER),
    };
    let pid = w.pid;
    let _ = WORKER.set(w);
    // SAFETY: the cycle and its log live as long as this worker.
    let log = unsafe { (*cycle).log };
    if let Some(w) = WORKER.get() {
        if !w.limiter.join_ledger(pid, alive) {
            ngx_log_error!(
                NGX_LOG_WARN,
                log,
                "yarl: no free ledger row in zone \"yarl\" ({} processes hold one): the \
                 concurrency slots of this worker are lost if it is killed",
                yarl_core::zone::LEDGER_ROWS
            );
        }
    }
    arm(log);
    tick_now(log);
    Ok(())
}

/// Stops and joins the agent thread, if this worker runs it (bounded by about one sync
/// timeout), and removes the tick.
pub fn stop() -> bool {
    // SAFETY: the worker's own event; only its event loop (this thread) touches it.
    unsafe {
        let ev = addr_of_mut!(TICK);
        if (*ev).timer_set() != 0 {
            ngx_del_timer(ev);
        }
    }
    let thread = AGENT.lock().unwrap_or_else(|e| e.into_inner()).take();
    let had = thread.is_some();
    if let Some(t) = thread {
        t.stop();
    }
    // The worker's requests are over (or cut, on a fast shutdown): what they still hold
    // goes back, and the row to the next worker.
    if let Some(w) = WORKER.get() {
        w.limiter.leave_ledger();
    }
    had
}

/// Keeps the lease while this worker's configuration is current.
struct LeaseKeeper {
    limiter: Arc<Limiter>,
    pid: u32,
    generation: u64,
    cpus: Option<libc::cpu_set_t>,
    /// Inside the zone's write section (between `may_write` and `round_done`).
    writing: bool,
}

/// The master's CPUs, when `worker_cpu_affinity` pinned this worker to fewer: the agent
/// thread then runs wherever nginx may run, like nginx's cache manager, rather than on the
/// one core whose requests it would delay (a round is tens of thousands of counters; on the
/// pinned core it was 1 % of the worker's CPU under random-key load, and the requests behind
/// it waited). `None` outside a worker (in single-process mode the parent is not nginx) or
/// when the worker is not pinned.
fn agent_cpus(in_worker: bool) -> Option<libc::cpu_set_t> {
    if !in_worker {
        return None;
    }
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most `size` bytes into
    // sets we own. getppid is a worker's master (a worker exits when its master dies).
    unsafe {
        let mut master: libc::cpu_set_t = core::mem::zeroed();
        let mut own: libc::cpu_set_t = core::mem::zeroed();
        if libc::sched_getaffinity(libc::getppid(), size, &mut master) != 0
            || libc::sched_getaffinity(0, size, &mut own) != 0
        {
            return None;
        }
        (libc::CPU_COUNT(&master) > libc::CPU_COUNT(&own)).then_some(master)
    }
}

/// How much nicer than the worker the agent thread runs: the requests it serves come first,
/// and a round (encoding, merging tens of thousands of counters) takes the CPU they leave.
const AGENT_NICE: libc::c_int = 10;

impl Supervisor for LeaseKeeper {
    fn started(&mut self) {
        if let Some(set) = &self.cpus {
            // SAFETY: pid 0 is the calling thread only; the set was filled by the kernel. A
            // failure (a cpuset shrunk since) leaves the thread where it is.
            unsafe { libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), set) };
        }
        // SAFETY: plain syscalls on this thread's own id; on Linux the nice value of a
        // thread id applies to that thread only. A failure leaves the priority as it is.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() == 0 {
                libc::setpriority(libc::PRIO_PROCESS, tid, (now + AGENT_NICE).min(19));
            }
        }
    }

    fn before_round(&mut self) -> bool {
        let now = self.limiter.clock().now_nanos();
        self.limiter.generation() == self.generation
            && self.limiter.agent_lease().renew(self.pid, now)
    }

    /// Enters the zone's write section, and holds the lease inside it: an agent stopped
    /// past its lease, going on, is waited out by the new one and finds the lease gone.
    fn may_write(&mut self) -> bool {
        let now = self.limiter.clock().now_nanos();
        let section = self.limiter.write_section();
        if !section.enter(self.pid, now, alive) {
            return false;
        }
        if self.limiter.agent_lease().holder() != Some(self.pid) {
            section.leave(self.pid);
            return false;
        }
        self.writing = true;
        true
    }

    fn round_done(&mut self) {
        if std::mem::take(&mut self.writing) {
            self.limiter.write_section().leave(self.pid);
        }
    }

    fn stopped(&mut self) {
        self.round_done();
        self.limiter.agent_lease().release(self.pid);
    }
}

/// Time after which an unrenewed lease is free: two intervals and one call timeout.
fn stale_ns(w: &Worker) -> u64 {
    u64::try_from((w.interval * 2 + w.timeout).as_nanos()).unwrap_or(u64::MAX)
}

/// One tick: give back the concurrency slots of workers that died; join a stopped agent;
/// become the agent if the lease is free; alert about a full zone (agent only).
fn tick(log: *mut ngx_log_t) {
    let Some(w) = WORKER.get() else { return };
    // Every worker reaps (an `alive` check per live row: a signal 0 and a read of
    // /proc/PID/stat): the slots come back within half an interval of the death, whichever
    // worker died, the agent's included.
    let given = w.limiter.reap_ledger(w.pid, alive);
    if given > 0 {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "yarl: gave back {} concurrency slots held by a worker that died",
            given
        );
    }
    let now = w.limiter.clock().now_nanos();
    let mut agent = AGENT.lock().unwrap_or_else(|e| e.into_inner());
    if agent.as_ref().is_some_and(SyncThread::is_finished) {
        if let Some(t) = agent.take() {
            t.stop();
        }
        let wait = u64::try_from(w.interval.as_nanos()).unwrap_or(u64::MAX).saturating_mul(4);
        RETRY_AT.store(now.saturating_add(wait), Relaxed);
        ngx_log_error!(NGX_LOG_NOTICE, log, "yarl: sync agent stopped in this worker");
    }
    // SAFETY: nginx's process-wide flags, written by its signal handlers and read by its own
    // event loop, which is where we are.
    let exiting = unsafe { ngx_exiting != 0 || ngx_quit != 0 || ngx_terminate != 0 };
    if agent.is_none()
        && !exiting
        && now >= RETRY_AT.load(Relaxed)
        && w.limiter.generation() == w.generation
        && w.limiter.agent_lease().try_acquire(w.pid, now, stale_ns(w), alive)
    {
        match start_agent(w) {
            Ok(t) => {
                *agent = Some(t);
                ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "yarl: sync agent started in this worker ({} roots, limiter {})",
                    w.roots.len(),
                    w.limiter.limiter_id()
                );
            }
            Err(e) => {
                w.limiter.agent_lease().release(w.pid);
                RETRY_AT.store(now.saturating_add(10_000_000_000), Relaxed);
                ngx_log_error!(NGX_LOG_ALERT, log, "yarl: {}; quotas will not be synced", e);
            }
        }
    }
    if agent.as_ref().is_some_and(|t| !t.is_finished()) {
        alert_if_full(w, log, now);
    }
}

/// The zone-full alert, at most once per interval, from the agent's worker.
fn alert_if_full(w: &Worker, log: *mut ngx_log_t, now: u64) {
    let u = w.limiter.zone_usage();
    if u.missing == 0 {
        return;
    }
    let every = u64::try_from(w.interval.as_nanos()).unwrap_or(u64::MAX);
    let last = LAST_ALERT.load(Relaxed);
    if last != 0 && now.saturating_sub(last) < every {
        return;
    }
    LAST_ALERT.store(now.max(1), Relaxed);
    ngx_log_error!(
        NGX_LOG_ALERT,
        log,
        "yarl: zone \"yarl\" is full: {} quotas are missing and not limited \
         ({} held, {} bytes); increase yarl_zone",
        u.missing,
        u.quotas,
        u.bytes
    );
}

fn start_agent(w: &Worker) -> Result<SyncThread, String> {
    let config = SyncConfig {
        interval: w.interval,
        timeout: w.timeout,
        early: w.early,
        interest: w.interest,
        ..SyncConfig::default()
    };
    let engine = match &w.shards {
        Some(shards) => SyncEngine::sharded(w.limiter.clone(), shards.clone(), config),
        None => SyncEngine::new(w.limiter.clone(), w.roots.clone(), config),
    }
    .map_err(|e| e.to_string())?;
    let opts =
        HttpOptions { token: w.token.clone(), ca_file: w.ca.clone(), ..HttpOptions::default() };
    let transport: Arc<dyn Transport> =
        Arc::new(HttpTransport::new(&opts).map_err(|e| e.to_string())?);
    let keeper = LeaseKeeper {
        limiter: w.limiter.clone(),
        pid: w.pid,
        generation: w.generation,
        cpus: w.agent_cpus,
        writing: false,
    };
    with_signals_blocked(|| SyncThread::spawn_supervised(engine, transport, keeper))
        .map_err(|e| format!("cannot start the sync thread: {e}"))
}

/// The tick's timer event (only this worker's event loop touches it).
// SAFETY: ngx_event_t is plain C data (integers, bit fields, raw pointers and optional
// function pointers), for which all zeros is a valid value: an idle event with no handler
// and no timer, the state nginx's own modules start theirs in (ngx_memzero). `arm` fills it.
static mut TICK: ngx_event_t = unsafe { core::mem::zeroed() };
/// What `ngx_event_ident` reads through the event's data pointer in debug logs.
static TICK_IDENT: [usize; 4] = [0, 0, 0, 0x5941_524c]; // "YARL"

fn period(w: &Worker) -> ngx_msec_t {
    // Half an interval, so a free lease is taken within about one interval of its release.
    (w.interval.as_millis() / 2).clamp(10, 1000) as ngx_msec_t
}

fn arm(log: *mut ngx_log_t) {
    // SAFETY: TICK is only used from this worker's event loop; a zeroed ngx_event_t is its
    // initial state (nginx's own modules ngx_memzero theirs). Cancelable: it does not keep a
    // gracefully exiting worker alive.
    unsafe {
        let ev = addr_of_mut!(TICK);
        (*ev).handler = Some(on_tick);
        (*ev).log = log;
        (*ev).data = core::ptr::addr_of!(TICK_IDENT).cast_mut().cast();
        (*ev).set_cancelable(1);
    }
}

fn tick_now(log: *mut ngx_log_t) {
    if catch_unwind(AssertUnwindSafe(|| tick(log))).is_err() {
        ngx_log_error!(NGX_LOG_ALERT, log, "yarl: internal error in the worker tick");
    }
    rearm();
}

fn rearm() {
    let Some(w) = WORKER.get() else { return };
    // SAFETY: as in `arm`; re-adding a fired timer is how nginx modules repeat one.
    unsafe {
        if ngx_exiting != 0 || ngx_quit != 0 || ngx_terminate != 0 {
            return;
        }
        let ev = addr_of_mut!(TICK);
        (*ev).set_timedout(0);
        ngx_add_timer(ev, period(w));
    }
}

unsafe extern "C" fn on_tick(ev: *mut ngx_event_t) {
    // SAFETY: nginx passes our event; its log was set in `arm`.
    let log = unsafe { (*ev).log };
    tick_now(log);
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
