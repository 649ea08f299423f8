//! Model-based test of the limiter against exact leaky buckets: a quota that was quiet for a
//! while must not hand its idle time to the next burst.
//!
//! One limiter (alone, or syncing with one root) sees bursts of requests after idle gaps from
//! a millisecond to hours, with random weights, limits and hard-cutoff bursts, and sync rounds
//! at random times (every interval or sooner while it counts, as its agent runs them). Two
//! exact buckets (`units.rs`) watch it:
//!
//! * **the ideal bucket** decides the same requests itself. At the end of every burst the
//!   limiter has admitted in all at most [`OVER`] request more than it (a fill exactly at
//!   `low_burst` compares as a float on one side and an integer on the other), and per burst
//!   the two agree within [`tolerance`];
//! * **its own bucket** counts exactly what the limiter admitted: the limiter never admits a
//!   request while that bucket is above `low_burst` (plus rounding), whatever the gaps.
//!   This is the check that fails when idle time is credited to later requests.

use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{SyncRequest, SyncResponse};
use yarl_core::units::{LeakyBucket, MILLI, NANOS_PER_SEC};
use yarl_core::{
    Clock, Limiter, Limits, ManualClock, Outcome, QuotaUpdate, RootConfig, RootState, SyncConfig,
    SyncEngine,
};

const MS: u64 = 1_000_000;
const INTERVAL: Duration = Duration::from_secs(1);

/// Requests the limiter may admit in all beyond the ideal bucket.
const OVER: u64 = 1;

/// Milli-units its own bucket may be above `low_burst` when the limiter admits: its estimate
/// is a float, and the times it keeps are whole milliseconds (rounded later, which only
/// raises the estimate).
const SLACK: u64 = 1;

/// Requests a burst may differ by from the ideal bucket's. Alone, the limiter's view of its
/// own requests is exact. With a root, what a round takes reaches the root's bucket when the
/// root gets it, not when it was counted (up to one interval later, so it has drained less
/// there), and for one interval after a sync the default estimator assumes that the rest of
/// the cluster keeps adding up to the limit (there is no rest here): each holds back at most
/// one interval of the limit, which a later burst may then admit.
fn tolerance(with_root: bool, limit_milli: u64, weight: u64) -> u64 {
    if with_root {
        OVER + (2 * limit_milli * INTERVAL.as_secs()).div_ceil(weight * MILLI)
    } else {
        OVER
    }
}

#[derive(Debug, Clone)]
struct Burst {
    /// Quiet time before the burst, ms.
    gap_ms: u64,
    /// Requests in the burst.
    requests: u64,
    /// Time between two requests of the burst, ms.
    spacing_ms: u64,
    /// Where in the quiet part of the gap rounds fall (fractions of it).
    rounds: Vec<f64>,
    /// The sync agent runs no round from the burst's start for this long, ms (its worker
    /// stalled): the first round after brings the counts of the whole stall, saying what of
    /// them drained.
    stall_ms: u64,
}

fn burst() -> impl Strategy<Value = Burst> {
    (
        // 1 ms to about 3 hours, log-uniform.
        (0.0f64..7.0).prop_map(|e| 10f64.powf(e) as u64),
        1u64..60,
        0u64..15,
        prop::collection::vec(0.0f64..1.0, 0..4),
        prop_oneof![3 => Just(0u64), 1 => 0u64..6_000],
    )
        .prop_map(|(gap_ms, requests, spacing_ms, rounds, stall_ms)| Burst {
            gap_ms,
            requests,
            spacing_ms,
            rounds,
            stall_ms,
        })
}

struct Node {
    clock: ManualClock,
    limiter: Arc<Limiter>,
    engine: SyncEngine,
    root: Option<RootState>,
}

impl Node {
    fn new(with_root: bool, limits: Limits) -> Node {
        let clock = ManualClock::at(NANOS_PER_SEC);
        let limiter = Arc::new(Limiter::builder().clock(Arc::new(clock.clone())).build());
        let quota = QuotaUpdate {
            id: 1,
            name: "q".into(),
            epoch: 1,
            deleted: false,
            reset_epoch: 0,
            limits,
            parent: None,
        };
        let urls = if with_root { vec!["http://root".to_string()] } else { Vec::new() };
        let config = SyncConfig { interval: INTERVAL, ..SyncConfig::default() };
        let engine = SyncEngine::new(limiter.clone(), urls, config).unwrap();
        let root = with_root.then(|| {
            let mut r = RootState::new(RootConfig::default());
            r.apply_quotas([quota.clone()], 0);
            r
        });
        if root.is_none() {
            limiter.apply_quotas(&[quota]);
        }
        let mut n = Node { clock, limiter, engine, root };
        n.round();
        n
    }

    fn now(&self) -> u64 {
        self.clock.now_nanos()
    }

    fn advance_to(&self, t: u64) {
        let now = self.now();
        if t > now {
            self.clock.advance(Duration::from_nanos(t - now));
        }
    }

    fn round(&mut self) {
        let now = self.now();
        loop {
            for call in self.engine.begin_round(now) {
                let root = self.root.as_mut().expect("calls only with a root");
                let wire = serde_json::to_vec(&call.request).unwrap();
                let req: SyncRequest = serde_json::from_slice(&wire).unwrap();
                let resp = root.sync(&req, now).unwrap();
                let wire = serde_json::to_vec(&resp).unwrap();
                let resp: SyncResponse = serde_json::from_slice(&wire).unwrap();
                self.engine.on_response(call.root, Ok(resp), Duration::from_millis(1), now);
            }
            if !self.engine.end_round(now).more {
                break;
            }
        }
    }
}

/// When the sync agent runs: every interval or sooner (at random), as long as the limiter
/// counted something in the last few intervals; once it is quiet, rounds change nothing, so
/// only a few, at random times, stand for the rest of a long gap.
struct Rounds {
    rng: fastrand::Rng,
    next: u64,
    last_activity: u64,
    /// No round before this time (a stalled agent).
    stalled_until: u64,
}

impl Rounds {
    fn step(&mut self) -> u64 {
        let i = INTERVAL.as_nanos() as u64;
        i / 10 + self.rng.u64(0..=i - i / 10)
    }

    /// Runs the rounds due up to `t` (the clock ends at `t`).
    fn until(&mut self, n: &mut Node, t: u64, quiet: &[f64]) {
        // A stalled agent resumes its rounds where the stall ends.
        let quiet_from =
            self.last_activity.max(self.stalled_until) + 3 * INTERVAL.as_nanos() as u64;
        while self.next <= t.min(quiet_from) {
            if self.next < self.stalled_until {
                self.next = self.stalled_until;
                continue;
            }
            n.advance_to(self.next);
            n.round();
            self.next += self.step();
        }
        if self.next <= t {
            let mut at: Vec<u64> =
                quiet.iter().map(|f| self.next + (f * (t - self.next) as f64) as u64).collect();
            at.sort_unstable();
            for t in at {
                n.advance_to(t);
                n.round();
            }
            self.next = t + self.step();
        }
        n.advance_to(t);
    }
}

/// Runs the bursts through the limiter and the ideal bucket; per burst (admitted by the
/// limiter, admitted by the ideal bucket), or the first request the limiter admitted above
/// `low_burst` by its own bucket.
fn run(
    with_root: bool,
    limits: Limits,
    weight: u64,
    bursts: &[Burst],
    seed: u64,
) -> Result<Vec<(u64, u64)>, String> {
    let mut n = Node::new(with_root, limits);
    let mut rounds =
        Rounds { rng: fastrand::Rng::with_seed(seed), next: 0, last_activity: 0, stalled_until: 0 };
    rounds.next = n.now() + rounds.step();
    let mut exact = LeakyBucket { fill: 0, at: n.now(), carry: 0 };
    let mut own = exact;
    let w = weight * MILLI;
    let mut out = Vec::new();
    for b in bursts {
        let start = n.now() + b.gap_ms * MS;
        rounds.until(&mut n, start, &b.rounds);
        rounds.stalled_until = rounds.stalled_until.max(start + b.stall_ms * MS);
        let (mut got, mut want) = (0, 0);
        for k in 0..b.requests {
            rounds.until(&mut n, start + k * b.spacing_ms * MS, &[]);
            let now = n.now();
            rounds.last_activity = now;
            exact.advance(now, limits.limit());
            if exact.fill <= limits.low_burst() {
                exact.fill = exact.fill.saturating_add(w);
                want += 1;
            }
            own.advance(now, limits.limit());
            if n.limiter.account("q", weight).unwrap().outcome == Outcome::Passed {
                got += 1;
                // What the limiter admitted, in an exact bucket of its own: it must not
                // have admitted on credit the bucket never had.
                if own.fill > limits.low_burst() + SLACK {
                    return Err(format!(
                        "burst {}, request {k}: admitted at a fill of {} milli-units (low_burst {})",
                        out.len(),
                        own.fill,
                        limits.low_burst()
                    ));
                }
                own.fill = own.fill.saturating_add(w);
            }
        }
        out.push((got, want));
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_quiet_quota_gets_no_credit_for_its_idle_time(
        with_root in any::<bool>(),
        // 0.5 to 500 units/s.
        limit in (-0.3f64..2.7).prop_map(|e| 10f64.powf(e)),
        weight in 1u64..5,
        burst_units in 1u64..60,
        bursts in prop::collection::vec(burst(), 1..12),
        seed in any::<u64>(),
    ) {
        let low = (burst_units * weight) as f64;
        let limits = Limits::from_units(limit, low, low).unwrap();
        let tol = tolerance(with_root, limits.limit().milli(), weight);
        let (mut got_all, mut want_all) = (0, 0);
        let runs = run(with_root, limits, weight, &bursts, seed).map_err(TestCaseError::fail)?;
        for (i, (got, want)) in runs.into_iter().enumerate() {
            (got_all, want_all) = (got_all + got, want_all + want);
            prop_assert!(
                got_all <= want_all + OVER,
                "by burst {i}: the limiter admitted {got_all}, the ideal bucket {want_all}"
            );
            prop_assert!(
                got.abs_diff(want) <= tol,
                "burst {i}: the limiter admitted {got}, the ideal bucket {want} (tolerance {tol})"
            );
        }
    }
}

/// Bursts of 100 requests after pauses on a 5/s quota with a hard cutoff at 5, as an nginx
/// user sees them (`t/yarl_idle.t` does the same through nginx).
#[test]
fn bursts_after_pauses_match_the_exact_bucket() {
    let limits = Limits::from_units(5.0, 5.0, 5.0).unwrap();
    let pauses = [0u64, 10_000, 0, 3_000, 10_000];
    for with_root in [false, true] {
        let bursts: Vec<Burst> = pauses
            .iter()
            .map(|&gap_ms| Burst {
                gap_ms,
                requests: 100,
                spacing_ms: 0,
                rounds: vec![0.5],
                stall_ms: 0,
            })
            .collect();
        let got = run(with_root, limits, 1, &bursts, 7).unwrap();
        for (i, &(got, want)) in got.iter().enumerate() {
            assert!(
                got <= want + OVER,
                "root {with_root}, burst {i}: {got} admitted, ideal {want}"
            );
        }
    }
}
