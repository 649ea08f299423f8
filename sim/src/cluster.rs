//! The discrete-event simulation: real `Limiter`s, `SyncEngine`s and `RootState`s, one
//! virtual clock, a network that delays, jitters and loses sync calls.

use crate::load::{Arrivals, KeyArrival, KeyArrivals, KeySpace, Load, Retry, Weights};
use crate::reference::{FixedWindow, IdealBucket, SlidingWindow, TokenBucket};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{SyncRequest, SyncResponse};
use yarl_core::{
    Clock, Estimator, Limiter, Limits, ManualClock, QuotaUpdate, RootConfig, RootState,
    SeededRandom, SyncConfig, SyncEngine,
};

const NS: f64 = 1e9;
/// Virtual time starts here, so negative clock skews stay positive.
const EPOCH_NS: u64 = 1_000 * 1_000_000_000;
const QUOTA: &str = "q";

/// The network between limiters and roots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Network {
    /// One-way-and-back latency of a sync call before jitter.
    pub delay: Duration,
    /// Uniform extra latency in `[0, jitter]`, per call.
    pub jitter: Duration,
    /// Probability that a call fails (half of them lose the request, so the root never
    /// sees it, half lose the answer, so the root counted it but the limiter times out).
    pub loss: f64,
    /// Per-call timeout of the limiter.
    pub timeout: Duration,
    /// Every host's and root's clock is off the true time by a uniform offset in
    /// `[-max_skew, max_skew]`.
    pub max_skew: Duration,
}

impl Default for Network {
    /// A datacenter: 2 ms + up to 3 ms jitter, 1% lost calls, ±20 ms clock skew.
    fn default() -> Self {
        Network {
            delay: Duration::from_millis(2),
            jitter: Duration::from_millis(3),
            loss: 0.01,
            timeout: Duration::from_millis(500),
            max_skew: Duration::from_millis(20),
        }
    }
}

/// One simulated cluster and its traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Limiters (hosts).
    pub hosts: usize,
    /// Root servers.
    pub roots: usize,
    /// The quota's limit, units per second (with `quota`, its limit over its window).
    pub limit: f64,
    /// A quota of its own numbers, typically a window's (`QuotaSpec` with `per`), instead
    /// of `limit` per second with the strategy's bursts: YARL and the ideal bucket take it
    /// whole, the fixed window counts its limit per window of its length. Loads stay
    /// multiples of `limit`, which must be its rate per second.
    pub quota: Option<Limits>,
    /// What clients do with a refused request (only without `keys`).
    pub retry: Retry,
    /// Sync interval.
    pub interval: Duration,
    /// Simulated seconds.
    pub seconds: u64,
    /// Offered traffic on the one quota (ignored with `keys`).
    pub load: Load,
    /// Instead of one quota, one per key, each with `limit`, and their traffic.
    pub keys: Option<KeySpace>,
    /// Request weights.
    pub weights: Weights,
    /// Network and clocks.
    pub net: Network,
    /// Seed of everything random in the run.
    pub seed: u64,
}

/// The yarl-core configuration under test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarlConfig {
    /// `low_burst`, in seconds of the limit (0.5 = half a second's worth).
    pub low_s: f64,
    /// `high_burst`, in seconds of the limit.
    pub high_s: f64,
    /// Extrapolation between syncs.
    pub estimator: Estimator,
    /// Attempted-demand suppression.
    pub demand: bool,
    /// The local guard.
    pub guard: bool,
    /// Early rounds: a host syncs as soon as its own traffic on the quota runs well ahead
    /// of its last round's (`SyncEngine::wants_early_round`, polled every [`POLL_NS`]).
    pub early: bool,
    /// Roots tell limiters how many limiters are live, and a counter no root has reported
    /// to a limiter yet stands for all of them; off, every answer goes without that count,
    /// as from roots that predate it (each limiter then counts only itself for such
    /// counters).
    pub peers: bool,
    /// A host's agent gives a key it meets for the first time what the roots last reported
    /// of it (`SyncEngine::adopt_keys`, polled every [`POLL_NS`]); off, such a key waits for
    /// the host's own round.
    pub adopt: bool,
}

/// How often a host's sync agent checks for an early round (the nginx agent's tick).
pub const POLL_NS: u64 = 10_000_000;

/// How long after a request a host's polls keep running, in intervals. Polling every host
/// every 10 ms through a two-day run would cost hundreds of millions of events, and here
/// only a request path can make `wants_early_round` true (no concurrency quotas, no root
/// restarts): its flag stays set until a poll finds budget, which comes back within
/// `EARLY_REFILL` (4) intervals, and the next gap between rounds is within one more.
/// Past that, a poll would find nothing, so skipping it changes no decision.
const POLL_ARMED_INTERVALS: u64 = 6;

/// What decides each request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// The real yarl-core, configured so.
    Yarl(YarlConfig),
    /// Reference: each host alone, a token bucket of `limit / hosts` per second holding
    /// `burst_s` seconds of it (nginx `limit_req` on every host).
    TokenBucket {
        /// Bucket size in seconds of the per-host rate.
        burst_s: f64,
    },
    /// Reference: one exact central counter per calendar second (a Redis `INCR` per request).
    FixedWindow,
    /// Reference: the sliding-window approximation over 1 s (the previous window's count
    /// weighted by its remaining overlap), central and exact.
    SlidingWindow,
    /// Reference: one exact central leaky bucket with yarl's bursts and drop zone (what yarl
    /// would decide with perfect, instant knowledge of the cluster).
    IdealBucket {
        /// `low_burst`, seconds of the limit.
        low_s: f64,
        /// `high_burst`, seconds of the limit.
        high_s: f64,
    },
}

/// Everything measured in one run, per whole second of true time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunResult {
    /// Offered weight per second.
    pub offered: Vec<f64>,
    /// Admitted weight per second.
    pub admitted: Vec<f64>,
    /// Rejected weight per second.
    pub rejected: Vec<f64>,
    /// True time (s) of every rejection, in order.
    pub rejection_times: Vec<f64>,
    /// The quota's limit, units per second.
    pub limit: f64,
    /// Sync requests each root handled, per whole second of true time.
    pub root_messages: Vec<f64>,
    /// Early rounds over all hosts.
    pub early_rounds: u64,
    /// With keys: (admitted, offered) weight of each burst, by its number.
    pub bursts: Vec<(f64, f64)>,
    /// With keys: every refused request, as (key, true time, fill), in order. The fill is
    /// that of an exact bucket of the key fed what this strategy admitted of it, before the
    /// request: at or below `low_burst` the strategy refused what an exact bucket in its
    /// place, with its own history, would have admitted.
    pub key_refusals: Vec<(usize, f64, f64)>,
    /// With keys and the ideal bucket: every request that found its key's bucket not empty,
    /// as (key, true time, fill before the decision); a request not listed found it empty.
    /// The same traffic reaches every strategy, so another strategy's refusals can be looked
    /// up here: at or below `low_burst` the exact bucket admits.
    pub ideal_fills: Vec<(usize, f64, f64)>,
}

/// A host's clock: the shared virtual time plus this host's skew.
struct SkewClock {
    base: ManualClock,
    offset: i64,
}

impl Clock for SkewClock {
    fn now_nanos(&self) -> u64 {
        self.base.now_nanos().saturating_add_signed(self.offset)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival,
    Round(usize),
    /// Host `h`'s agent looks for a surge between rounds (`SyncEngine::wants_early_round`,
    /// once per [`POLL_NS`], as `agent/src/thread.rs` does).
    Poll(usize),
    /// Host `h`'s agent polls for keys new to it (`SyncEngine::adopt_keys`).
    Adopt(usize),
    AtRoot(usize),
    Answer(usize),
    Sweep,
    /// A refused request sent again, to host `.0`, of weight `.1`.
    Retry(usize, u64),
}

/// A sync call on its way.
struct Call {
    host: usize,
    root: usize,
    request: SyncRequest,
    sent_at: u64,
    /// False when the answer will be lost or come after the timeout.
    answered: bool,
    /// Its `AtRoot` event is still queued.
    at_root_pending: bool,
    result: Option<Result<SyncResponse, String>>,
}

struct Host {
    limiter: Arc<Limiter>,
    engine: SyncEngine,
    offset: i64,
    /// Calls of the round in flight still unanswered.
    outstanding: usize,
    in_flight: bool,
    /// An [`Event::Adopt`] is queued.
    adopt_queued: bool,
    /// When the next regular round is due: the agent stops polling for a surge there.
    next_round: u64,
    /// The regular round came due while a round was in flight: the agent begins it as
    /// soon as that one ends (it does not wait another interval).
    round_due: bool,
    /// When the last round ended: the agent's polls fall every [`POLL_NS`] from there.
    poll_base: u64,
    /// An [`Event::Poll`] is queued.
    poll_queued: bool,
    /// Until when polls can find a surge (see [`POLL_ARMED_INTERVALS`]).
    poll_until: u64,
}

struct Yarl {
    hosts: Vec<Host>,
    roots: Vec<(RootState, i64)>,
    /// Calls on their way, by id; an answered call's slot is reused (a day-long run makes
    /// millions of calls).
    calls: Vec<Option<Call>>,
    /// Ids free for the next calls.
    free: Vec<usize>,
    /// The sync interval, ns.
    interval: u64,
    early: bool,
    peers: bool,
    adopt: bool,
}

enum Decider {
    Yarl(Box<Yarl>),
    Buckets(Vec<TokenBucket>),
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
    Ideal(IdealBucket),
    /// One ideal bucket per key.
    IdealKeys(Vec<IdealBucket>),
}

/// Where requests come from: the one quota's load, or a key space.
enum Source<'a> {
    Shared(Arrivals<'a>),
    Keys(KeyArrivals),
}

impl Source<'_> {
    /// The next request; `t` is infinite when there is none.
    fn next(&mut self, rng: &mut fastrand::Rng) -> KeyArrival {
        match self {
            Source::Shared(a) => {
                let (t, host) = a.next(rng);
                KeyArrival { t, host, key: 0, burst: 0 }
            }
            Source::Keys(k) => k.next(rng),
        }
    }
}

struct Queue {
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, at: u64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, e)));
    }
}

/// The prefix of the key space's template: key `i` is named `k{i}`.
const KEY_PREFIX: &str = "k";

/// The name of key `i` in a key space.
fn key_name(i: usize) -> String {
    format!("{KEY_PREFIX}{i}")
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn skew(rng: &mut fastrand::Rng, max: Duration) -> i64 {
    let m = i64::try_from(ns(max)).unwrap_or(i64::MAX / 2);
    if m == 0 {
        0
    } else {
        rng.i64(-m..=m)
    }
}

/// Runs `scenario` with `strategy`. Deterministic: the same inputs give the same result.
pub fn run(scenario: &Scenario, strategy: &Strategy) -> RunResult {
    // yarl-core draws limiter and root ids from fastrand's thread-local generator; seed it so
    // reruns are bit-identical.
    fastrand::seed(scenario.seed);
    let mut rng = fastrand::Rng::with_seed(scenario.seed);
    let clock = ManualClock::at(EPOCH_NS);
    let secs = scenario.seconds as usize;
    let mut out = RunResult {
        offered: vec![0.0; secs],
        admitted: vec![0.0; secs],
        rejected: vec![0.0; secs],
        rejection_times: Vec::new(),
        limit: scenario.limit,
        root_messages: vec![0.0; secs],
        early_rounds: 0,
        bursts: Vec::new(),
        key_refusals: Vec::new(),
        ideal_fills: Vec::new(),
    };
    let interval = ns(scenario.interval);
    let mut q = Queue { heap: BinaryHeap::new(), seq: 0 };
    if let Some(l) = scenario.quota {
        let per_s = l.limit_units() / l.window_secs() as f64;
        assert!((per_s - scenario.limit).abs() <= 1e-9 * per_s, "limit is the quota's rate");
    }
    let mut decider = match *strategy {
        Strategy::Yarl(cfg) => {
            Decider::Yarl(Box::new(build_yarl(scenario, &cfg, &clock, &mut rng, &mut q)))
        }
        Strategy::TokenBucket { burst_s } => {
            let rate = scenario.limit / scenario.hosts as f64;
            // At least one request's worth, or a bucket could never pass anything.
            let cap = (rate * burst_s).max(scenario.weights.mean());
            Decider::Buckets(vec![TokenBucket::new(rate, cap); scenario.hosts])
        }
        Strategy::FixedWindow => Decider::Fixed(match scenario.quota {
            Some(l) => FixedWindow::from_limits(&l),
            None => FixedWindow::new(scenario.limit, 1.0),
        }),
        Strategy::SlidingWindow => Decider::Sliding(SlidingWindow::new(scenario.limit, 1.0)),
        Strategy::IdealBucket { low_s, high_s } => {
            let bucket = |k: usize| match scenario.quota {
                Some(l) => IdealBucket::from_limits(&l, scenario.seed ^ k as u64),
                None => IdealBucket::new(
                    scenario.limit,
                    low_s * scenario.limit,
                    high_s * scenario.limit,
                    scenario.seed ^ k as u64,
                ),
            };
            match scenario.keys {
                None => Decider::Ideal(bucket(0)),
                Some(k) => Decider::IdealKeys((0..k.keys).map(bucket).collect()),
            }
        }
    };
    assert!(
        scenario.keys.is_none() || matches!(decider, Decider::Yarl(_) | Decider::IdealKeys(_)),
        "key spaces are simulated for YARL and the ideal bucket only"
    );
    assert!(
        scenario.keys.is_none() || scenario.retry == Retry::Never,
        "retries are simulated for the one quota only"
    );
    // Retries draw from their own generator, so every strategy sees the same fresh requests
    // whatever it refuses.
    let mut retry_rng = fastrand::Rng::with_seed(scenario.seed ^ 0x7e72_1e5a_9a1f);
    if matches!(decider, Decider::Yarl(_)) {
        q.push(EPOCH_NS + 5 * 1_000_000_000, Event::Sweep);
    }
    let mut traffic_rng = fastrand::Rng::with_seed(scenario.seed ^ 0x5eed_0f7a_ff1c);
    let mut arrivals = match scenario.keys {
        None => Source::Shared(Arrivals::new(
            &scenario.load,
            scenario.limit,
            scenario.weights,
            scenario.hosts,
        )),
        Some(k) => Source::Keys(KeyArrivals::new(
            k,
            scenario.limit,
            scenario.weights,
            scenario.hosts,
            &mut traffic_rng,
        )),
    };
    let names: Vec<String> = match scenario.keys {
        None => vec![QUOTA.to_string()],
        Some(k) => (0..k.keys).map(key_name).collect(),
    };
    let mut next = arrivals.next(&mut traffic_rng);
    if next.t.is_finite() {
        q.push(EPOCH_NS + (next.t * NS) as u64, Event::Arrival);
    }
    let end = EPOCH_NS + scenario.seconds * 1_000_000_000;
    // Exact buckets that follow what the strategy admitted of each key (their bursts play
    // no part: they only add and drain).
    let mut followers: Vec<IdealBucket> = match scenario.keys {
        Some(k) => (0..k.keys).map(|_| IdealBucket::new(scenario.limit, 0.0, 0.0, 0)).collect(),
        None => Vec::new(),
    };

    while let Some(Reverse((at, _, ev))) = q.heap.pop() {
        if at >= end {
            break;
        }
        clock.set(at);
        let true_s = (at - EPOCH_NS) as f64 / NS;
        match ev {
            Event::Arrival | Event::Retry(..) => {
                let (host, key, burst, w) = match ev {
                    Event::Retry(h, w) => (h, 0, 0, w),
                    _ => {
                        (next.host, next.key, next.burst, scenario.weights.sample(&mut traffic_rng))
                    }
                };
                let sec = true_s as usize;
                out.offered[sec] += w as f64;
                let ok = match &mut decider {
                    Decider::Yarl(y) => {
                        y.hosts[host].limiter.account(&names[key], w).expect("weight").allowed()
                    }
                    Decider::Buckets(b) => b[host].take(true_s, w as f64),
                    Decider::Fixed(f) => f.take(true_s, w as f64),
                    Decider::Sliding(s) => s.take(true_s, w as f64),
                    Decider::Ideal(b) => b.take(true_s, w as f64),
                    Decider::IdealKeys(b) => {
                        let fill = b[key].fill_at(true_s);
                        if fill > 0.0 {
                            out.ideal_fills.push((key, true_s, fill));
                        }
                        b[key].take(true_s, w as f64)
                    }
                };
                if scenario.keys.is_some_and(|k| true_s >= k.from_s) {
                    if out.bursts.len() <= burst {
                        out.bursts.resize(burst + 1, (0.0, 0.0));
                    }
                    out.bursts[burst].1 += w as f64;
                    if ok {
                        out.bursts[burst].0 += w as f64;
                    }
                }
                if let Decider::Yarl(y) = &mut decider {
                    let h = &mut y.hosts[host];
                    if y.adopt && !h.adopt_queued {
                        // The agent's next poll looks for keys this request may have made.
                        h.adopt_queued = true;
                        q.push(at + POLL_NS - at % POLL_NS, Event::Adopt(host));
                    }
                    if y.early {
                        y.arm(host, at, &mut q);
                    }
                }
                if let Some(f) = followers.get_mut(key).filter(|_| ok) {
                    f.add(true_s, w as f64);
                }
                if ok {
                    out.admitted[sec] += w as f64;
                } else {
                    out.rejected[sec] += w as f64;
                    out.rejection_times.push(true_s);
                    if scenario.keys.is_some() {
                        out.key_refusals.push((key, true_s, followers[key].fill_at(true_s)));
                    }
                    if let Some(again) = scenario.retry.after(true_s, &mut retry_rng) {
                        // The balancer sends it to any host.
                        let to = retry_rng.usize(..scenario.hosts);
                        q.push(EPOCH_NS + (again * NS) as u64, Event::Retry(to, w));
                    }
                }
                if ev == Event::Arrival {
                    next = arrivals.next(&mut traffic_rng);
                    if next.t.is_finite() {
                        q.push(EPOCH_NS + (next.t * NS) as u64, Event::Arrival);
                    }
                }
            }
            Event::Round(h) => {
                let Decider::Yarl(y) = &mut decider else { continue };
                // The agent awaits every call of a round before it looks at the time: a
                // regular round due meanwhile begins when that one ends, and the schedule
                // goes on from when it was due.
                if y.hosts[h].in_flight {
                    y.hosts[h].round_due = true;
                    continue;
                }
                y.hosts[h].next_round = at + interval;
                q.push(at + interval, Event::Round(h));
                y.begin(h, at, &scenario.net, &mut rng, &mut q);
            }
            Event::Poll(h) => {
                let Decider::Yarl(y) = &mut decider else { continue };
                let host = &mut y.hosts[h];
                host.poll_queued = false;
                // The agent polls only between rounds, and not at the moment the regular
                // round is due (`now < next` comes before `wants_early_round`).
                if host.in_flight || at >= host.next_round {
                    continue;
                }
                let now = at.saturating_add_signed(host.offset);
                if host.engine.wants_early_round(now) {
                    out.early_rounds += 1;
                    y.begin(h, at, &scenario.net, &mut rng, &mut q);
                } else {
                    y.poll_again(h, at + POLL_NS, &mut q);
                }
            }
            Event::Adopt(h) => {
                let Decider::Yarl(y) = &mut decider else { continue };
                let host = &mut y.hosts[h];
                host.adopt_queued = false;
                // The agent polls between rounds and while a round waits for its roots.
                host.engine.adopt_keys(at.saturating_add_signed(host.offset));
            }
            Event::AtRoot(c) => {
                let Decider::Yarl(y) = &mut decider else { continue };
                if let Some(m) = out.root_messages.get_mut(true_s as usize) {
                    *m += 1.0;
                }
                y.at_root(c, at);
            }
            Event::Answer(c) => {
                let Decider::Yarl(y) = &mut decider else { continue };
                y.answer(c, at, &scenario.net, &mut rng, &mut q);
            }
            Event::Sweep => {
                let Decider::Yarl(y) = &mut decider else { continue };
                for (r, off) in &mut y.roots {
                    r.sweep(at.saturating_add_signed(*off));
                }
                q.push(at + 5 * 1_000_000_000, Event::Sweep);
            }
        }
    }
    out
}

fn build_yarl(
    s: &Scenario,
    cfg: &YarlConfig,
    clock: &ManualClock,
    rng: &mut fastrand::Rng,
    q: &mut Queue,
) -> Yarl {
    let limits = s.quota.unwrap_or_else(|| {
        Limits::from_units(s.limit, cfg.low_s * s.limit, cfg.high_s * s.limit)
            .expect("valid limits")
    });
    let quota = |id: u64, name: String| QuotaUpdate {
        id,
        name,
        epoch: id,
        deleted: false,
        reset_epoch: 0,
        limits,
        parent: None,
    };
    // A key space is one template: each key a bucket of its own, made on first sight in
    // the limiters and the roots, as an operator would configure a limit per client.
    let quotas: Vec<QuotaUpdate> = match s.keys {
        None => vec![quota(1, QUOTA.into())],
        Some(_) => vec![quota(1, format!("{KEY_PREFIX}*"))],
    };
    let key_capacity = s.keys.map_or(0, |k| (k.keys * 2) as u32);
    let roots: Vec<(RootState, i64)> = (0..s.roots)
        .map(|_| {
            let mut r = RootState::new(RootConfig::default());
            r.apply_quotas(quotas.iter().cloned(), 0);
            // Every root of a cluster reads one secret from its database.
            r.set_key_secret((s.seed, s.seed.rotate_left(17)));
            (r, skew(rng, s.net.max_skew))
        })
        .collect();
    let urls: Vec<String> = (0..s.roots).map(|i| format!("http://root-{i}")).collect();
    let config =
        SyncConfig { interval: s.interval, timeout: s.net.timeout, ..SyncConfig::default() };
    let mut hosts: Vec<Host> = (0..s.hosts)
        .map(|i| {
            let offset = skew(rng, s.net.max_skew);
            let limiter = Arc::new(
                Limiter::builder()
                    .clock(Arc::new(SkewClock { base: clock.clone(), offset }))
                    .random(SeededRandom::new(s.seed.wrapping_mul(1_000_003) ^ i as u64))
                    .estimator(cfg.estimator)
                    .horizon(s.interval)
                    .demand(cfg.demand)
                    .local_guard(cfg.guard)
                    // The smallest block that holds the quotas and keys, so 300 hosts stay
                    // cheap.
                    .capacity((quotas.len() as u32).max(yarl_core::zone::MIN_QUOTAS))
                    .keys(key_capacity)
                    .build(),
            );
            // Every limiter knows the quota before traffic starts (it would after its first
            // sync anyway; this keeps the first second about counting, not about discovery).
            limiter.apply_quotas(&quotas);
            let engine = SyncEngine::new(limiter.clone(), urls.clone(), config.clone())
                .expect("fresh limiter, positive interval");
            Host {
                limiter,
                engine,
                offset,
                outstanding: 0,
                in_flight: false,
                adopt_queued: false,
                next_round: 0,
                round_due: false,
                poll_base: EPOCH_NS,
                poll_queued: false,
                poll_until: 0,
            }
        })
        .collect();
    // Limiters sync at independent phases within the interval, as real hosts do.
    for (h, host) in hosts.iter_mut().enumerate() {
        host.next_round = EPOCH_NS + rng.u64(0..ns(s.interval).max(1));
        q.push(host.next_round, Event::Round(h));
    }
    Yarl {
        hosts,
        roots,
        calls: Vec::new(),
        free: Vec::new(),
        interval: ns(s.interval),
        early: cfg.early,
        peers: cfg.peers,
        adopt: cfg.adopt,
    }
}

impl Yarl {
    /// A request on host `h` at `at` may have asked for an early round: the host's polls
    /// run for a while (see [`POLL_ARMED_INTERVALS`]).
    fn arm(&mut self, h: usize, at: u64, q: &mut Queue) {
        let host = &mut self.hosts[h];
        host.poll_until = at + POLL_ARMED_INTERVALS * self.interval;
        if host.in_flight || host.poll_queued {
            return;
        }
        let since = at.saturating_sub(host.poll_base);
        let next = host.poll_base + since.div_ceil(POLL_NS) * POLL_NS;
        self.poll_again(h, next, q);
    }

    /// Queues host `h`'s poll at `t` if it falls before the regular round and polls are
    /// armed.
    fn poll_again(&mut self, h: usize, t: u64, q: &mut Queue) {
        let host = &mut self.hosts[h];
        if self.early && !host.poll_queued && t < host.next_round && t <= host.poll_until {
            host.poll_queued = true;
            q.push(t, Event::Poll(h));
        }
    }

    /// Host `h`'s round ended at `at`: a regular round that came due meanwhile begins now,
    /// otherwise its agent polls from here until the next.
    fn round_ended(
        &mut self,
        h: usize,
        at: u64,
        net: &Network,
        rng: &mut fastrand::Rng,
        q: &mut Queue,
    ) {
        let host = &mut self.hosts[h];
        host.poll_base = at;
        if std::mem::take(&mut host.round_due) {
            // `next += interval` from when it was due; fallen behind, at once.
            let next = (host.next_round + self.interval).max(at);
            host.next_round = next;
            q.push(next, Event::Round(h));
            self.begin(h, at, net, rng, q);
        } else {
            self.poll_again(h, at + POLL_NS, q);
        }
    }

    fn begin(&mut self, h: usize, at: u64, net: &Network, rng: &mut fastrand::Rng, q: &mut Queue) {
        let host = &mut self.hosts[h];
        let now = at.saturating_add_signed(host.offset);
        let calls = host.engine.begin_round(now);
        if calls.is_empty() {
            host.engine.end_round(now);
            self.round_ended(h, at, net, rng, q);
            return;
        }
        host.in_flight = true;
        host.outstanding = calls.len();
        let timeout = ns(net.timeout);
        for call in calls {
            let id = self.free.pop().unwrap_or_else(|| {
                self.calls.push(None);
                self.calls.len() - 1
            });
            let rtt = ns(net.delay) + rng.u64(0..=ns(net.jitter));
            let lost = rng.f64() < net.loss;
            let request_lost = lost && rng.bool();
            let answered = !lost && rtt < timeout;
            if !request_lost {
                q.push(at + rtt / 2, Event::AtRoot(id));
            }
            q.push(at + if answered { rtt } else { timeout }, Event::Answer(id));
            self.calls[id] = Some(Call {
                host: h,
                root: call.root,
                request: call.request,
                sent_at: at,
                answered,
                at_root_pending: !request_lost,
                result: None,
            });
        }
    }

    fn at_root(&mut self, c: usize, at: u64) {
        let Some(call) = self.calls[c].as_mut() else { return };
        call.at_root_pending = false;
        let (root, off) = &mut self.roots[call.root];
        let mut r =
            root.sync(&call.request, at.saturating_add_signed(*off)).map_err(|e| e.to_string());
        if !self.peers {
            if let Ok(resp) = &mut r {
                resp.limiters = None;
            }
        }
        if call.answered {
            call.result = Some(r);
        }
    }

    fn answer(&mut self, c: usize, at: u64, net: &Network, rng: &mut fastrand::Rng, q: &mut Queue) {
        let Some(call) = self.calls[c].take() else { return };
        // A call whose request is still on its way to the root (never with a timeout above
        // the round trip) keeps its slot, so that event finds nothing in it.
        if !call.at_root_pending {
            self.free.push(c);
        }
        let host = &mut self.hosts[call.host];
        let now = at.saturating_add_signed(host.offset);
        let result = match call.result {
            Some(r) if call.answered => r,
            _ => Err("timed out".to_string()),
        };
        host.engine.on_response(call.root, result, Duration::from_nanos(at - call.sent_at), now);
        host.outstanding -= 1;
        if host.outstanding == 0 {
            host.in_flight = false;
            if host.engine.end_round(now).more {
                self.begin(call.host, at, net, rng, q);
            } else {
                self.round_ended(call.host, at, net, rng, q);
            }
        }
    }
}
