//! The background sync thread: one OS thread running a single-threaded tokio runtime, so all
//! roots are called in parallel without a thread per root.

use crate::transport::Transport;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use yarl_core::{SyncEngine, SyncStatus};

/// Decides, between rounds, whether the agent keeps running; told when it stops.
///
/// The nginx module renews the agent lease of the shared zone here, and stops when another
/// worker took the role over or a reload made a newer configuration's worker the agent.
pub trait Supervisor: Send + 'static {
    /// Called once in the agent's thread before the first round (e.g. to lower its
    /// scheduling priority).
    fn started(&mut self) {}

    /// Called before each round; `false` stops the agent.
    fn before_round(&mut self) -> bool {
        true
    }

    /// Called after [`before_round`](Self::before_round): whether this round may write the
    /// limiter (the nginx module enters the zone's write section here); `false` skips the
    /// round, and the agent tries again an interval later.
    fn may_write(&mut self) -> bool {
        true
    }

    /// Called when a round [`may_write`](Self::may_write) allowed has ended (the module
    /// leaves the write section).
    fn round_done(&mut self) {}

    /// Called once when the agent stops, whatever the reason.
    fn stopped(&mut self) {}
}

/// A supervisor that never stops the agent.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSupervisor;

impl Supervisor for NoSupervisor {}

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
        f.debug_struct("SyncThread").field("running", &!self.is_finished()).finish()
    }
}

impl SyncThread {
    /// Starts the thread. The caller decides its signal mask (nginx blocks all signals
    /// around this call so the thread inherits none).
    pub fn spawn(engine: SyncEngine, transport: Arc<dyn Transport>) -> std::io::Result<Self> {
        Self::spawn_supervised(engine, transport, NoSupervisor)
    }

    /// Like [`spawn`](Self::spawn), with a [`Supervisor`] consulted before every round.
    pub fn spawn_supervised(
        mut engine: SyncEngine,
        transport: Arc<dyn Transport>,
        mut supervisor: impl Supervisor,
    ) -> std::io::Result<Self> {
        let now = engine.limiter().clock().now_nanos();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            status: Mutex::new(engine.status(now)),
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let sh = shared.clone();
        let handle = std::thread::Builder::new().name("yarl-sync".into()).spawn(move || {
            let stop = || sh.stop.load(Ordering::Acquire);
            supervisor.started();
            rt.block_on(drive(&mut engine, &*transport, &mut supervisor, &stop, &sh.wake, |s| {
                *sh.status.lock() = s;
            }));
            supervisor.stopped();
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

    /// Whether the thread ended by itself (its supervisor stopped it).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
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

/// Runs the engine's part of a round (taking the deltas, merging an answer, ending the
/// round: tens of ms with 100,000s of changed counters), yielding now and then until
/// `polite_until` (see [`pace`]). On a multi-threaded runtime, the application's,
/// `block_in_place` lets the runtime hand this worker's other tasks to another thread
/// meanwhile, so requests do not wait behind it; on the agent's own single-threaded runtime
/// it runs inline.
fn off_the_runtime<R>(polite_until: Instant, f: impl FnOnce() -> R) -> R {
    let f = || {
        POLITE_UNTIL.set(Some(polite_until));
        let r = f();
        POLITE_UNTIL.set(None);
        r
    };
    #[cfg(feature = "multi-thread")]
    if tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
    {
        return tokio::task::block_in_place(f);
    }
    f()
}

/// Engine work between two yields of [`pace`].
pub const PACE_SLICE: Duration = Duration::from_micros(200);

thread_local! {
    /// Until when this thread's engine work yields; `None` outside it.
    static POLITE_UNTIL: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
    static LAST_YIELD: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The engine's pacer ([`SyncEngine::set_pacer`]): after each [`PACE_SLICE`] of a round's
/// work, lets whatever else is runnable on this CPU run first. In nginx that is the worker
/// whose CPU the agent shares. Under load the worker never sleeps, so it never preempts the
/// agent on a wakeup, and the scheduler only switches at its tick (4 ms at `HZ=250`): each
/// round of the agent held the CPU in 4 ms runs while requests waited, which was most of
/// `yarl_account`'s p99 under random-key load (one worker, 1M quotas: 1.9–4.4 ms, median
/// 2.1, against 1.1–2.1 ms yielding; 1.0–1.5 ms with the agent at `SCHED_IDLE`, which let
/// rounds fall a quarter behind). Only for one interval from the start of a round: a round
/// still running then stops yielding and takes its share (nice +10) at the tick's pace, so
/// a saturated worker cannot starve the sync (yielding, the bench's rounds kept to one a
/// second).
fn pace() {
    let until = POLITE_UNTIL.get();
    if until.is_some() && should_yield(Instant::now(), until, LAST_YIELD.get()) {
        std::thread::yield_now();
        LAST_YIELD.set(Some(Instant::now()));
    }
}

fn should_yield(now: Instant, polite_until: Option<Instant>, last: Option<Instant>) -> bool {
    polite_until.is_some_and(|u| now < u)
        && last.is_none_or(|t| now.saturating_duration_since(t) >= PACE_SLICE)
}

/// Runs rounds once per interval until `stop()` holds or the supervisor declines a round:
/// every root is called in parallel, each call bounded by the timeout; a round that brought
/// quotas and reports more waiting runs again at once. `wake` interrupts the wait between rounds.
/// `publish` receives the status after each round.
///
/// The future is `Send` when `publish` is, so it can run as a task on a multi-threaded
/// runtime (`yarl-tower` runs it on the application's own runtime) as well as on
/// [`SyncThread`]'s.
pub async fn drive(
    engine: &mut SyncEngine,
    transport: &dyn Transport,
    supervisor: &mut dyn Supervisor,
    stop: &(dyn Fn() -> bool + Sync),
    wake: &tokio::sync::Notify,
    mut publish: impl FnMut(SyncStatus),
) {
    let interval = engine.config().interval;
    let timeout = engine.config().timeout;
    let clock = engine.limiter().clock().clone();
    let mut next = tokio::time::Instant::now();
    // Whether the round about to start keeps the interval's schedule (an early one does not
    // move it).
    let mut regular = true;
    engine.set_pacer(pace);
    while !stop() && supervisor.before_round() {
        if !supervisor.may_write() {
            // Another process writes the limiter (see `Supervisor::may_write`): wait an
            // interval, then ask again.
            next = tokio::time::Instant::now() + interval;
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = wake.notified() => {}
            }
            continue;
        }
        let polite_until = Instant::now() + interval;
        let epoch_before = engine.limiter().epoch();
        let calls = off_the_runtime(polite_until, || engine.begin_round(clock.now_nanos()));
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
        // A round can wait for a slow root up to the timeout: keys met meanwhile take what
        // the roots last said of them then, not at its end (until adopted, a key's second
        // unit on this host stands for every live limiter's, and refused a client under its
        // limit: docs/accuracy.md, Zipf keys).
        let mut poll = tokio::time::interval(EARLY_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = poll.tick() => {
                    engine.adopt_keys(clock.now_nanos());
                }
                joined = set.join_next() => match joined {
                    Some(Ok((root, r, lat))) => off_the_runtime(polite_until, || {
                        engine.on_response(root, r, lat, clock.now_nanos())
                    }),
                    // A call task panicked: count it as that call failing (the engine keeps
                    // the batch and retries); the id of the root is lost with the task.
                    Some(Err(_)) => {}
                    None => break,
                },
                _ = wake.notified() => {
                    if stop() {
                        supervisor.round_done();
                        return;
                    }
                }
            }
        }
        let report = off_the_runtime(polite_until, || engine.end_round(clock.now_nanos()));
        supervisor.round_done();
        publish(engine.status(clock.now_nanos()));
        // More quotas waiting: the next page at once, as long as pages bring quotas (a root
        // that says `more` and brings none would have the agent call it without a pause).
        if report.more && engine.limiter().epoch() > epoch_before {
            continue;
        }
        if regular {
            next += interval;
            let now = tokio::time::Instant::now();
            if next < now {
                // Fell behind (a slow round): don't burst to catch up.
                next = now;
            }
        }
        regular = true;
        // Until the next regular round, look for a surge every EARLY_POLL: the engine says
        // when one is worth a round now (and keeps such rounds rare). Keys met for the first
        // time meanwhile take what the roots last said of them.
        loop {
            let now = tokio::time::Instant::now();
            if now >= next {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next.min(now + EARLY_POLL)) => {}
                _ = wake.notified() => break,
            }
            engine.adopt_keys(clock.now_nanos());
            if tokio::time::Instant::now() < next && engine.wants_early_round(clock.now_nanos()) {
                regular = false;
                break;
            }
        }
    }
}

/// How often the agent looks for a surge between rounds
/// ([`SyncEngine::wants_early_round`]: an atomic load each time) and, between rounds and
/// while one waits for its roots, for keys new to this host ([`SyncEngine::adopt_keys`]:
/// an atomic load when no key was inserted).
pub const EARLY_POLL: Duration = Duration::from_millis(10);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::CallFuture;
    use std::sync::atomic::AtomicUsize;
    use yarl_core::proto::{SyncRequest, SyncResponse};
    use yarl_core::{Limiter, RootConfig, RootState, SyncConfig};

    #[test]
    fn the_pacer_yields_once_per_slice_and_only_while_the_round_has_time() {
        let t0 = Instant::now();
        let until = Some(t0 + Duration::from_millis(500));
        assert!(!should_yield(t0, None, None), "outside engine work");
        assert!(should_yield(t0, until, None), "the first chunk");
        assert!(!should_yield(t0 + PACE_SLICE / 2, until, Some(t0)), "within a slice");
        assert!(should_yield(t0 + PACE_SLICE, until, Some(t0)), "a slice later");
        let late = t0 + Duration::from_millis(500);
        assert!(!should_yield(late, until, Some(t0)), "once the round has run an interval: never");
        assert!(!should_yield(late, until, None));
    }

    /// An in-process root behind the transport trait.
    struct Local(Mutex<RootState>, Arc<dyn yarl_core::Clock>);

    impl Transport for Local {
        fn call(&self, _url: &str, req: SyncRequest, _timeout: Duration) -> CallFuture {
            let r: Result<SyncResponse, String> =
                self.0.lock().sync(&req, self.1.now_nanos()).map_err(|e| e.to_string());
            Box::pin(async move { r })
        }
    }

    /// A root that always says more quotas are waiting, and brings none.
    struct AlwaysMore(Local, Arc<AtomicUsize>);

    impl Transport for AlwaysMore {
        fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture {
            self.1.fetch_add(1, Ordering::Relaxed);
            let inner = self.0.call(url, req, timeout);
            Box::pin(async move {
                let mut r = inner.await?;
                r.more = true;
                Ok(r)
            })
        }
    }

    struct Rounds(Arc<AtomicUsize>, usize, Arc<AtomicBool>);

    impl Supervisor for Rounds {
        fn before_round(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::Relaxed) < self.1
        }
        fn stopped(&mut self) {
            self.2.store(true, Ordering::Relaxed);
        }
    }

    /// `drive` must stay `Send` for `tokio::spawn` (yarl-tower's sync task).
    #[allow(dead_code)]
    fn drive_is_send(
        engine: &mut SyncEngine,
        transport: &dyn Transport,
        supervisor: &mut dyn Supervisor,
        wake: &tokio::sync::Notify,
    ) {
        fn send<T: Send>(_: T) {}
        send(drive(engine, transport, supervisor, &|| true, wake, |_| {}));
    }

    #[test]
    fn a_supervisor_stops_the_thread_between_rounds() {
        let limiter = Arc::new(Limiter::builder().capacity(100).build());
        let cfg = SyncConfig { interval: Duration::from_millis(5), ..SyncConfig::default() };
        let engine = SyncEngine::new(limiter.clone(), vec!["http://r".into()], cfg).unwrap();
        let root =
            Local(Mutex::new(RootState::new(RootConfig::default())), limiter.clock().clone());
        let (count, stopped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let t = SyncThread::spawn_supervised(
            engine,
            Arc::new(root),
            Rounds(count.clone(), 3, stopped.clone()),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t.is_finished());
        assert!(stopped.load(Ordering::Relaxed));
        assert_eq!(limiter.zone_status().rounds, 3);
        assert_eq!(t.status().roots[0].successes, 3);
        t.stop();
    }

    #[test]
    fn a_root_that_always_says_more_is_called_once_per_interval() {
        let limiter = Arc::new(Limiter::builder().capacity(100).build());
        let cfg = SyncConfig { interval: Duration::from_millis(50), ..SyncConfig::default() };
        let engine = SyncEngine::new(limiter.clone(), vec!["http://r".into()], cfg).unwrap();
        let root =
            Local(Mutex::new(RootState::new(RootConfig::default())), limiter.clock().clone());
        let calls = Arc::new(AtomicUsize::new(0));
        let stopped = Arc::new(AtomicBool::new(false));
        let t = SyncThread::spawn_supervised(
            engine,
            Arc::new(AlwaysMore(root, calls.clone())),
            Rounds(Arc::new(AtomicUsize::new(0)), usize::MAX, stopped),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        t.stop();
        let n = calls.load(Ordering::Relaxed);
        // 10 intervals, and a round's own time; without the check: thousands.
        assert!((2..=15).contains(&n), "{n} calls in 500 ms");
    }

    /// Root 0 answers at once, root 1 never (the call times out); counts root 1's calls.
    struct SecondHangs(Arc<Mutex<RootState>>, Arc<dyn yarl_core::Clock>, Arc<AtomicUsize>);

    impl Transport for SecondHangs {
        fn call(&self, url: &str, req: SyncRequest, _timeout: Duration) -> CallFuture {
            if url.contains("r1") {
                self.2.fetch_add(1, Ordering::Relaxed);
                return Box::pin(async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Err("never".to_string())
                });
            }
            let r = self.0.lock().sync(&req, self.1.now_nanos()).map_err(|e| e.to_string());
            Box::pin(async move { r })
        }
    }

    /// One round of `engine` against `root`, inline.
    fn sync_with(engine: &mut SyncEngine, root: &Mutex<RootState>, clock: &dyn yarl_core::Clock) {
        for call in engine.begin_round(clock.now_nanos()) {
            let r = root.lock().sync(&call.request, clock.now_nanos()).map_err(|e| e.to_string());
            engine.on_response(call.root, r, Duration::from_millis(1), clock.now_nanos());
        }
        engine.end_round(clock.now_nanos());
    }

    /// A round waits for its slowest root, up to the timeout: a key met meanwhile takes
    /// what the roots last reported of it within a poll, not when the round ends.
    #[test]
    fn keys_are_adopted_while_a_round_waits_for_a_slow_root() {
        let template = yarl_core::QuotaUpdate {
            id: 1,
            name: "api_key_*".into(),
            epoch: 1,
            deleted: false,
            reset_epoch: 0,
            limits: yarl_core::Limits::from_units(0.001, 10.0, 20.0).unwrap(),
            parent: None,
        };
        let mut state = RootState::new(RootConfig::default());
        state.apply_quotas([template], 0);
        state.set_key_secret((11, 12));
        let root = Arc::new(Mutex::new(state));
        // Another host counts the key all along, so every answer reports it.
        let other = Arc::new(Limiter::builder().capacity(100).build());
        let clock = other.clock().clone();
        let mut other_engine =
            SyncEngine::new(other.clone(), vec!["http://r0".into()], SyncConfig::default())
                .unwrap();
        sync_with(&mut other_engine, &root, &*clock);
        let cfg = SyncConfig {
            interval: Duration::from_millis(100),
            timeout: Duration::from_millis(1500),
            ..SyncConfig::default()
        };
        let limiter = Arc::new(Limiter::builder().capacity(100).build());
        let urls = vec!["http://r0".into(), "http://r1".into()];
        let engine = SyncEngine::new(limiter.clone(), urls, cfg).unwrap();
        let slow_calls = Arc::new(AtomicUsize::new(0));
        let t = SyncThread::spawn(
            engine,
            Arc::new(SecondHangs(root.clone(), clock.clone(), slow_calls.clone())),
        )
        .unwrap();
        // Three rounds: two reports of the key, more than an interval apart (a key only
        // just reported is new to the roots and keeps its guess), and the third waiting.
        let deadline = Instant::now() + Duration::from_secs(10);
        while slow_calls.load(Ordering::Relaxed) < 3 && Instant::now() < deadline {
            other.account("api_key_x", 1).unwrap();
            sync_with(&mut other_engine, &root, &*clock);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(slow_calls.load(Ordering::Relaxed) >= 3);
        // Root 0's answer of the third round is in; root 1 holds it for the timeout.
        std::thread::sleep(Duration::from_millis(100));
        let waiting_since = slow_calls.load(Ordering::Relaxed);
        limiter.account("api_key_x", 1).unwrap();
        let deadline = Instant::now() + Duration::from_millis(500);
        while limiter.zone_usage().keys_adopted == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(slow_calls.load(Ordering::Relaxed), waiting_since, "the same round");
        assert_eq!(limiter.zone_usage().keys_adopted, 1);
        let fill = limiter.quota("api_key_x").unwrap().fill;
        assert!(fill > 3.0, "the other host's count and its own: {fill}");
        t.stop();
    }
}
