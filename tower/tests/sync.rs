//! The sync task: started with the limiter, against an in-process root; stopped gracefully
//! (a last round flushes what was counted) or by dropping the last handle.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yarl_agent::{CallFuture, Transport};
use yarl_core::proto::{SyncRequest, SyncResponse};
use yarl_core::{
    Clock, Limiter, Limits, ManualClock, Outcome, QuotaUpdate, RootConfig, RootState, SyncConfig,
    SyncEngine,
};
use yarl_tower::{Error, Yarl};

/// A root in this process behind the transport trait, counting the calls it gets.
struct Local {
    root: Mutex<RootState>,
    clock: ManualClock,
    calls: AtomicUsize,
}

impl Local {
    fn with(quotas: &[(&str, f64, f64, f64)], clock: &ManualClock) -> Arc<Local> {
        let mut root = RootState::new(RootConfig::default());
        root.apply_quotas(
            quotas.iter().enumerate().map(|(i, &(name, limit, low, high))| QuotaUpdate {
                reset_epoch: 0,
                id: i as u64 + 1,
                name: name.into(),
                epoch: i as u64 + 1,
                deleted: false,
                limits: Limits::from_units(limit, low, high).unwrap(),
                parent: None,
            }),
            clock.now_nanos(),
        );
        Arc::new(Local { root: Mutex::new(root), clock: clock.clone(), calls: AtomicUsize::new(0) })
    }

    fn fill(&self, id: u64) -> f64 {
        let now = self.clock.now_nanos();
        self.root.lock().unwrap().counter(id, now).map_or(0.0, |c| c.fill)
    }
}

impl Transport for Local {
    fn call(&self, _url: &str, req: SyncRequest, _timeout: Duration) -> CallFuture {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let r: Result<SyncResponse, String> =
            self.root.lock().unwrap().sync(&req, self.clock.now_nanos()).map_err(|e| e.to_string());
        Box::pin(async move { r })
    }
}

/// A root that never answers.
struct Silent;

impl Transport for Silent {
    fn call(&self, _url: &str, _req: SyncRequest, _timeout: Duration) -> CallFuture {
        Box::pin(std::future::pending())
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_what_was_counted_and_releases_the_engine() {
    let clock = ManualClock::at(1_000_000_000);
    let root = Local::with(&[("q", 1.0, 100.0, 100.0)], &clock);
    let yarl = Yarl::builder()
        .roots(["http://root-a:7700/"])
        .transport(root.clone())
        .clock(Arc::new(clock.clone()))
        // The first round runs at once, the next one only in an hour.
        .interval(Duration::from_secs(3600))
        .start()
        .unwrap();
    assert!(yarl.is_syncing());
    let limiter = yarl.limiter().clone();
    wait_until("the quota arrived", || limiter.contains("q")).await;
    for _ in 0..7 {
        assert_eq!(limiter.account("q", 1).unwrap().outcome, Outcome::Passed);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(root.fill(1), 0.0, "no round since");
    // However long the interval, shutdown sends the 7 units before it returns.
    let status = yarl.shutdown().await.unwrap();
    assert_eq!(root.fill(1), 7.0, "the last round carried every count");
    assert_eq!(status.roots[0].url, "http://root-a:7700");
    assert_eq!(status.roots[0].ok, Some(true));
    assert!(!yarl.is_syncing());
    let calls = root.calls.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(root.calls.load(Ordering::Relaxed), calls, "no round after shutdown");
    // The engine is gone: the limiter can be synced by someone else now.
    SyncEngine::new(limiter.clone(), vec![], SyncConfig::default()).unwrap();
    // A second shutdown returns at once; the limiter keeps deciding on what it knows.
    assert!(yarl.shutdown().await.is_some());
    assert_eq!(limiter.check("q").outcome, Outcome::Passed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_stops_the_task() {
    let clock = ManualClock::at(1_000_000_000);
    let root = Local::with(&[("q", 1.0, 100.0, 100.0)], &clock);
    let yarl = Yarl::builder()
        .roots(["http://root-a"])
        .transport(root.clone())
        .clock(Arc::new(clock.clone()))
        .interval(Duration::from_millis(10))
        .start()
        .unwrap();
    let limiter = yarl.limiter().clone();
    let layer = yarl.layer(|_: &http::request::Parts, _: &mut yarl_tower::Quotas| {});
    wait_until("rounds ran", || root.calls.load(Ordering::Relaxed) >= 2).await;
    drop(yarl);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        SyncEngine::new(limiter.clone(), vec![], SyncConfig::default()).is_err(),
        "a layer keeps it"
    );
    drop(layer);
    wait_until("the engine was dropped", || {
        SyncEngine::new(limiter.clone(), vec![], SyncConfig::default()).is_ok()
    })
    .await;
    let calls = root.calls.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(root.calls.load(Ordering::Relaxed), calls);
}

#[tokio::test]
async fn a_root_that_never_answers_does_not_hold_shutdown() {
    let yarl = Yarl::builder()
        .roots(["http://root-a", "http://root-b"])
        .transport(Arc::new(Silent))
        .interval(Duration::from_millis(50))
        .timeout(Duration::from_millis(100))
        .start()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let start = Instant::now();
    let status = yarl.shutdown().await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(1500), "took {:?}", start.elapsed());
    assert!(status.roots.iter().all(|r| r.ok != Some(true)));
    assert!(!yarl.is_syncing());
}

#[tokio::test]
async fn a_cancelled_shutdown_leaves_the_next_one_to_wait_for_the_end() {
    let yarl = Yarl::builder()
        .roots(["http://root-a"])
        .transport(Arc::new(Silent))
        .interval(Duration::from_millis(50))
        .timeout(Duration::from_millis(100))
        .start()
        .unwrap();
    let limiter = yarl.limiter().clone();
    tokio::time::sleep(Duration::from_millis(30)).await;
    // The caller gives up on the first call (its own timeout) while the last round runs.
    let first = tokio::time::timeout(Duration::from_millis(10), yarl.shutdown()).await;
    assert!(first.is_err(), "the first call was cut short");
    assert!(yarl.is_syncing(), "the task still runs its last round");
    let start = Instant::now();
    assert!(yarl.shutdown().await.is_some());
    assert!(start.elapsed() > Duration::from_millis(50), "waited: {:?}", start.elapsed());
    assert!(!yarl.is_syncing());
    // The engine is released: another may sync the limiter now.
    SyncEngine::new(limiter, vec![], SyncConfig::default()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_roots_it_limits_on_its_own_counts_and_they_drain() {
    let clock = ManualClock::at(1_000_000_000);
    let limiter = Arc::new(Limiter::builder().clock(Arc::new(clock.clone())).build());
    limiter.apply_quotas(&[QuotaUpdate {
        reset_epoch: 0,
        id: 1,
        name: "q".into(),
        epoch: 1,
        deleted: false,
        limits: Limits::from_units(10.0, 10.0, 10.0).unwrap(),
        parent: None,
    }]);
    let yarl = Yarl::builder()
        .limiter(limiter.clone())
        .interval(Duration::from_millis(10))
        .start()
        .unwrap();
    assert!(yarl.is_syncing());
    assert_eq!(limiter.account("q", 11).unwrap().outcome, Outcome::Passed);
    assert_eq!(limiter.account("q", 1).unwrap().outcome, Outcome::Rejected);
    // A round folds the 11 units into the part that drains; 1 s drains 10 of them.
    let rounds = limiter.zone_status().rounds;
    wait_until("a round ran", || limiter.zone_status().rounds >= rounds + 2).await;
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.account("q", 1).unwrap().outcome, Outcome::Passed);
    assert!(yarl.shutdown().await.unwrap().roots.is_empty());
}

#[test]
fn start_refuses_what_cannot_work() {
    let err = |b: yarl_tower::YarlBuilder| b.start().unwrap_err().to_string();
    // Outside a runtime.
    assert_eq!(
        err(Yarl::builder()),
        "the sync task needs a tokio runtime: start the limiter from within one"
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    assert_eq!(
        err(Yarl::builder().roots(["127.0.0.1:7700"])),
        "root URL \"127.0.0.1:7700\": it must start with \"http://\" or \"https://\""
    );
    assert_eq!(
        err(Yarl::builder().roots(["http://a:7700", "http://a:7700/"])),
        "root URL \"http://a:7700/\" is listed twice"
    );
    let many: Vec<String> = (0..65).map(|i| format!("http://r{i}")).collect();
    assert_eq!(err(Yarl::builder().roots(many)), "65 roots given, at most 64 are supported");
    assert!(matches!(
        Yarl::builder().roots(["http://a"]).token("two words").start(),
        Err(Error::BadToken)
    ));
    assert!(matches!(Yarl::builder().token("").start(), Err(Error::BadToken)));
    for b in [
        Yarl::builder().roots(["http://a"]).interval(Duration::ZERO),
        // Taken, the task panicked adding them to the clock.
        Yarl::builder().roots(["http://a"]).interval(Duration::MAX),
        Yarl::builder().timeout(Duration::MAX),
    ] {
        assert_eq!(err(b), "sync interval and timeout must be positive and at most an hour");
    }
    assert!(err(Yarl::builder().roots(["https://a"]).ca_file("/nonexistent/ca.pem"))
        .starts_with("cannot read the CA file /nonexistent/ca.pem"));
    // One engine per limiter.
    let limiter = Arc::new(Limiter::builder().capacity(10).build());
    let _first = Yarl::builder().limiter(limiter.clone()).start().unwrap();
    assert_eq!(err(Yarl::builder().limiter(limiter)), "this limiter already has a sync engine");
}
