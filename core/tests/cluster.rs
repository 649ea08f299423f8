//! An in-process cluster: 20 limiters accounting against 2 roots through the real state
//! machines (`Limiter`, `SyncEngine`, `RootState`), with a fake clock, a simulated 1 s sync
//! (each limiter at its own phase within the second) and every message passed through JSON.

use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{SyncRequest, SyncResponse};
use yarl_core::{
    Clock, Limiter, Limits, ManualClock, QuotaUpdate, RootConfig, RootState, SeededRandom,
    SyncConfig, SyncEngine,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const LIMIT: f64 = 1000.0;
const LIMITERS: usize = 20;
const SECONDS: u64 = 30;
const TICK: u64 = 5 * MS;

struct Run {
    admitted: Vec<u64>,
    rejected: u64,
}

fn simulate(load: f64, drop_root_at: Option<u64>, seed: u64) -> Run {
    let clock = ManualClock::at(S);
    let quota = QuotaUpdate {
        id: 1,
        name: "api".into(),
        epoch: 1,
        deleted: false,
        reset_epoch: 0,
        // The recommended bursts (docs/accuracy.md): 1.5 and 3 seconds of the limit at a 1 s
        // sync interval.
        limits: Limits::from_units(LIMIT, 1.5 * LIMIT, 3.0 * LIMIT).unwrap(),
        parent: None,
    };
    let mut roots: Vec<RootState> = (0..2)
        .map(|_| {
            let mut r = RootState::new(RootConfig::default());
            r.apply_quotas([quota.clone()], 0);
            r
        })
        .collect();
    let mut nodes: Vec<(Arc<Limiter>, SyncEngine)> = (0..LIMITERS)
        .map(|i| {
            let l = Arc::new(
                Limiter::builder()
                    .clock(Arc::new(clock.clone()))
                    .random(SeededRandom::new(seed * 1000 + i as u64))
                    .build(),
            );
            let urls = vec!["http://root-a".into(), "http://root-b".into()];
            let e = SyncEngine::new(l.clone(), urls, SyncConfig::default()).unwrap();
            (l, e)
        })
        .collect();
    // Every limiter learns the quota before traffic starts.
    for (_, e) in &mut nodes {
        sync_round(e, &mut roots, false, clock.now_nanos());
    }

    let start = clock.now_nanos();
    let per_tick = load * LIMIT / LIMITERS as f64 * TICK as f64 / S as f64;
    let mut owed = [0.0f64; LIMITERS];
    let mut run = Run { admitted: vec![0; SECONDS as usize], rejected: 0 };
    let mut t = 0;
    while t < SECONDS * S {
        clock.set(start + t);
        let now = clock.now_nanos();
        let root_down = drop_root_at.is_some_and(|d| t >= d * S);
        for (i, (l, e)) in nodes.iter_mut().enumerate() {
            // Limiter i syncs once per second at phase i·50 ms.
            if t % S == i as u64 * 50 * MS {
                sync_round(e, &mut roots, root_down, now);
            }
            owed[i] += per_tick;
            while owed[i] >= 1.0 {
                owed[i] -= 1.0;
                if l.account("api", 1).unwrap().allowed() {
                    run.admitted[(t / S) as usize] += 1;
                } else {
                    run.rejected += 1;
                }
            }
        }
        if t % (5 * S) == 0 {
            for r in &mut roots {
                r.sweep(now);
            }
        }
        t += TICK;
    }
    run
}

fn sync_round(e: &mut SyncEngine, roots: &mut [RootState], root_b_down: bool, now: u64) {
    loop {
        for call in e.begin_round(now) {
            let result = if call.root == 1 && root_b_down {
                Err("connection refused".to_string())
            } else {
                let wire = serde_json::to_vec(&call.request).unwrap();
                let req: SyncRequest = serde_json::from_slice(&wire).unwrap();
                let resp = roots[call.root].sync(&req, now).unwrap();
                let wire = serde_json::to_vec(&resp).unwrap();
                Ok(serde_json::from_slice::<SyncResponse>(&wire).unwrap())
            };
            e.on_response(call.root, result, Duration::from_millis(1), now);
        }
        if !e.end_round(now).more {
            break;
        }
    }
}

/// Mean admitted per second (as a multiple of the limit) and its coefficient of variation.
fn stats(seconds: &[u64]) -> (f64, f64) {
    let n = seconds.len() as f64;
    let mean = seconds.iter().sum::<u64>() as f64 / n;
    let var = seconds.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean / LIMIT, var.sqrt() / mean)
}

/// Whole run, and steady state (from second 5: the first second is blind by design, every
/// limiter admits until its first sync after traffic starts).
fn summary(name: &str, run: &Run) -> (f64, f64, f64) {
    let (all, cv_all) = stats(&run.admitted);
    let (steady, cv) = stats(&run.admitted[5..]);
    println!(
        "{name}: admitted {all:.3} x limit over 30 s (CV {cv_all:.3}); from 5 s on {steady:.3} x \
         limit, CV {cv:.3}; rejected {}; per second {:?}",
        run.rejected, run.admitted
    );
    (all, steady, cv)
}

#[test]
fn overload_3x_is_held_within_10_percent() {
    let run = simulate(3.0, None, 1);
    let (ratio, steady, cv) = summary("3x overload", &run);
    assert!((ratio - 1.0).abs() <= 0.10, "admitted {ratio} x limit");
    assert!((steady - 1.0).abs() <= 0.05 && cv < 0.10, "steady {steady} x limit, CV {cv}");
}

#[test]
fn load_under_the_limit_is_never_rejected() {
    let run = simulate(0.9, None, 2);
    let (ratio, ..) = summary("0.9x load", &run);
    assert_eq!(run.rejected, 0);
    assert!((ratio - 0.9).abs() < 0.01, "{ratio}");
}

#[test]
fn losing_one_root_halfway_keeps_the_limit() {
    let run = simulate(3.0, Some(SECONDS / 2), 3);
    let (ratio, ..) = summary("3x overload, root b down at 15 s", &run);
    assert!((ratio - 1.0).abs() <= 0.10, "admitted {ratio} x limit");
    // The second half alone, with one root, also holds.
    let second: u64 = run.admitted[(SECONDS / 2) as usize..].iter().sum();
    let r2 = second as f64 / (SECONDS / 2) as f64 / LIMIT;
    println!("  second half alone: {r2:.3} x limit");
    assert!((r2 - 1.0).abs() <= 0.10, "{r2}");
}
