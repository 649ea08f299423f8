//! The scenarios and strategies of the accuracy report, and the table row of one strategy.

use crate::cluster::{run, Network, RunResult, Scenario, Strategy, YarlConfig};
use crate::load::{KeyHosts, KeyPattern, KeySpace, Load, Phase, Retry, Spread, Weights};
use std::time::Duration;
use yarl_core::{Estimator, Limits, QuotaSpec};

/// The report's fixed seed.
pub const SEED: u64 = 20_240_917;
/// The quota's limit in the 50-host scenarios, units per second.
pub const LIMIT: f64 = 1000.0;
/// When steps and stops happen, seconds.
pub const STEP_S: usize = 10;
/// When the echo scenario's overload stops, seconds.
pub const STOP_S: usize = 15;
/// Where steady-state measurements start: the first interval is blind by design (every
/// limiter admits until its first sync after traffic starts).
pub const WARMUP_S: usize = 5;

/// Where steady state starts at a given sync interval: [`WARMUP_S`], or five intervals when
/// that is longer. A cluster that starts under overload is blind for up to two intervals and
/// then pays back what it admitted meanwhile (the bucket remembers it), so at a 2 s interval
/// the start lasts about 9 s and a mean from 5 s measures the payback, not steady state
/// (the report prints both).
pub fn warmup_s(interval: Duration) -> usize {
    WARMUP_S.max((interval.as_secs_f64() * 5.0).ceil() as usize)
}

/// The configuration yarl-core ships as its default, as this report chose it.
pub fn chosen_default() -> YarlConfig {
    YarlConfig {
        low_s: 1.5,
        high_s: 3.0,
        estimator: Estimator::StaticOrMeasured { correction_ratio: 1.0 },
        demand: true,
        guard: false,
        early: true,
        peers: true,
        adopt: true,
    }
}

/// A 50-host, 2-root, 1 s-sync scenario with the default network.
pub fn base(load: Load, seconds: u64) -> Scenario {
    Scenario {
        hosts: 50,
        roots: 2,
        limit: LIMIT,
        interval: Duration::from_secs(1),
        seconds,
        load,
        quota: None,
        retry: Retry::Never,
        keys: None,
        weights: Weights::One,
        net: Network::default(),
        seed: SEED,
    }
}

/// 3x the limit, spread evenly, 30 s.
pub fn steady_3x() -> Scenario {
    base(Load::steady(3.0, Spread::Uniform), 30)
}

/// 0.9x the limit, spread evenly, 30 s.
pub fn under_09x() -> Scenario {
    base(Load::steady(0.9, Spread::Uniform), 30)
}

/// 0.9x the limit, all of it on one host.
pub fn under_09x_one_host() -> Scenario {
    base(Load::steady(0.9, Spread::Hot { share: 1.0 }), 30)
}

/// 0.5x, then 10x at [`STEP_S`], spread evenly.
pub fn step_10x() -> Scenario {
    base(Load::step(0.5, STEP_S as f64, 10.0, Spread::Uniform), 25)
}

/// The steps' load after [`STEP_S`], × the limit.
pub const STEP_TO: f64 = 10.0;
/// The hot step's share on its one host.
pub const HOT_SHARE: f64 = 0.95;

/// 0.5x, then 10x at [`STEP_S`] with 95% of it on one hot host.
pub fn step_10x_hot() -> Scenario {
    base(Load::step(0.5, STEP_S as f64, STEP_TO, Spread::Hot { share: HOT_SHARE }), 25)
}

/// 0.5x, with 10x for 0.5 s from [`STEP_S`] + 0.25 s: shorter than one sync interval.
pub fn short_spike() -> Scenario {
    base(Load::spike(0.5, STEP_S as f64 + 0.25, 0.5, 10.0), 20)
}

/// The article's case: 300 hosts, 100 req/s against a limit of 50, a different third of the
/// hosts active every second.
pub fn sparse() -> Scenario {
    let mut s = base(Load::steady(2.0, Spread::Sparse { fraction: 1.0 / 3.0 }), 60);
    s.hosts = 300;
    s.limit = 50.0;
    s
}

/// 3x until [`STOP_S`], then 0.8x: how long rejections go on.
pub fn echo() -> Scenario {
    base(Load::step(3.0, STOP_S as f64, 0.8, Spread::Uniform), 30)
}

/// 3x with weights 1..=9 (the limit in units).
pub fn weighted_3x() -> Scenario {
    let mut s = steady_3x();
    s.weights = Weights::Uniform { lo: 1, hi: 9 };
    s
}

/// Keys of the quiet-keys scenario, and the limit of each.
pub const QUIET_KEYS: usize = 1000;
/// The limit of each key in the key scenarios, units per second.
pub const KEY_LIMIT: f64 = 10.0;

/// A quota per client, each quiet for 1 to 10 minutes, then bursting at 10× its limit for 2
/// to 5 s: [`QUIET_KEYS`] keys of [`KEY_LIMIT`] over 50 hosts, 30 simulated minutes.
pub fn quiet_keys(hosts: KeyHosts) -> Scenario {
    let mut s = base(Load::steady(0.0, Spread::Uniform), 1800);
    s.limit = KEY_LIMIT;
    s.keys = Some(KeySpace {
        keys: QUIET_KEYS,
        pattern: KeyPattern::QuietThenBurst {
            idle_s: (60.0, 600.0),
            burst_s: (2.0, 5.0),
            peak: 10.0,
        },
        hosts,
        from_s: 0.0,
    });
    s
}

/// Keys of the Zipf scenario.
pub const ZIPF_KEYS: usize = 10_000;

/// A quota per client under Zipf's law: [`ZIPF_KEYS`] keys of [`KEY_LIMIT`] over 50 hosts,
/// key `k` sending `100 / (k + 1)` times its limit all the time (a few hot keys far over
/// their limit, thousands of cold ones under it), 60 s, counted from [`WARMUP_S`].
pub fn zipf_keys() -> Scenario {
    let mut s = base(Load::steady(0.0, Spread::Uniform), 60);
    s.limit = KEY_LIMIT;
    s.keys = Some(KeySpace {
        keys: ZIPF_KEYS,
        pattern: KeyPattern::Zipf { top: 100.0, exponent: 1.0, start_s: 2.0 },
        hosts: KeyHosts::Random,
        from_s: WARMUP_S as f64,
    });
    s
}

/// The Zipf scenario's keys, YARL against one exact central bucket per key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZipfRow {
    /// Keys offered at least twice their limit.
    pub hot: usize,
    /// What they were admitted, as a multiple of the limit: mean, lowest, highest.
    pub hot_mean: f64,
    pub hot_min: f64,
    pub hot_max: f64,
    /// The ideal buckets' mean for the same keys.
    pub ideal_hot_mean: f64,
    /// Keys offered at most 0.9 × their limit.
    pub cold: usize,
    /// Requests of theirs YARL refused.
    pub cold_rejected: f64,
    /// Requests of theirs the ideal bucket refused: a key under its limit on average still
    /// sends clumps (Poisson) that can carry an exact bucket past `low_burst`.
    pub ideal_cold_rejected: f64,
    /// YARL's refusals of cold keys that the exact bucket, fed the same requests, was certain
    /// to admit (its fill at or below `low_burst`): the false rejections.
    pub cold_false: usize,
    /// The most the exact bucket's fill stood below `low_burst` at one of them, in seconds
    /// of the key's limit.
    pub cold_false_gap_s: f64,
    /// Of those, the ones an exact bucket fed what YARL itself admitted was also certain to
    /// admit: the others are YARL paying back requests it admitted earlier that the exact
    /// bucket had refused (between `low_burst` and `high_burst` either may refuse, by chance).
    pub cold_false_own: usize,
    /// Keys offered between 0.9 and 2 times their limit: over it or near it, and slow enough
    /// that the demand signal often does not count (`decision::demand_excess_share`).
    pub mid: usize,
    /// What YARL admitted of them over what the exact buckets admitted: all together, and
    /// the lowest and highest key.
    pub mid_ratio: f64,
    pub mid_min: f64,
    pub mid_max: f64,
}

/// Runs the Zipf scenario with `yarl` and with the ideal bucket.
pub fn evaluate_zipf(s: &Scenario, yarl: &Strategy) -> ZipfRow {
    let d = chosen_default();
    let got = run(s, yarl);
    let ideal = run(s, &Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s });
    let Some(k) = s.keys else { return ZipfRow::default() };
    let secs = s.seconds as f64 - k.from_s;
    let hot: Vec<usize> = (0..k.keys).filter(|&i| k.pattern_rate(i) >= 2.0).collect();
    let cold: Vec<usize> = (0..k.keys).filter(|&i| k.pattern_rate(i) <= 0.9).collect();
    let mid: Vec<usize> = (0..k.keys)
        .filter(|&i| {
            let r = k.pattern_rate(i);
            r > 0.9 && r < 2.0
        })
        .collect();
    let admitted = |r: &RunResult, i: usize| r.bursts.get(i).map_or(0.0, |b| b.0) / secs / s.limit;
    let hot_rates: Vec<f64> = hot.iter().map(|&i| admitted(&got, i)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let ideal_rates: Vec<f64> = hot.iter().map(|&i| admitted(&ideal, i)).collect();
    let refused = |r: &RunResult, i: usize| r.bursts.get(i).map_or(0.0, |b| b.1 - b.0);
    let low = d.low_s * s.limit;
    let fills: std::collections::HashMap<(usize, u64), f64> =
        ideal.ideal_fills.iter().map(|&(key, t, f)| ((key, t.to_bits()), f)).collect();
    // How far below `low_burst` the exact bucket stood at each of YARL's refusals of a cold
    // key that it was certain to admit, within the counted time as for every other column
    // (before it, every key is new to every host at once).
    let false_gaps: Vec<(f64, f64)> = got
        .key_refusals
        .iter()
        .filter(|&&(key, t, _)| k.pattern_rate(key) <= 0.9 && t >= k.from_s)
        .map(|&(key, t, own)| (low - fills.get(&(key, t.to_bits())).copied().unwrap_or(0.0), own))
        .filter(|&(gap, _)| gap >= 0.0)
        .collect();
    let own_false = false_gaps.iter().filter(|&&(_, own)| own <= low).count();
    let false_gaps: Vec<f64> = false_gaps.into_iter().map(|(gap, _)| gap).collect();
    // A key the exact bucket admitted nothing of has no ratio (none does in this scenario).
    let mid_ratios: Vec<f64> = mid
        .iter()
        .filter(|&&i| admitted(&ideal, i) > 0.0)
        .map(|&i| admitted(&got, i) / admitted(&ideal, i))
        .collect();
    ZipfRow {
        hot: hot.len(),
        hot_mean: mean(&hot_rates),
        hot_min: hot_rates.iter().copied().fold(f64::INFINITY, f64::min),
        hot_max: hot_rates.iter().copied().fold(0.0, f64::max),
        ideal_hot_mean: mean(&ideal_rates),
        cold: cold.len(),
        cold_rejected: cold.iter().map(|&i| refused(&got, i)).sum(),
        ideal_cold_rejected: cold.iter().map(|&i| refused(&ideal, i)).sum(),
        cold_false: false_gaps.len(),
        cold_false_gap_s: false_gaps.iter().copied().fold(0.0, f64::max) / s.limit,
        cold_false_own: own_false,
        mid: mid.len(),
        mid_ratio: mid.iter().map(|&i| admitted(&got, i)).sum::<f64>()
            / mid.iter().map(|&i| admitted(&ideal, i)).sum::<f64>().max(f64::MIN_POSITIVE),
        mid_min: mid_ratios.iter().copied().reduce(f64::min).unwrap_or(0.0),
        mid_max: mid_ratios.iter().copied().fold(0.0, f64::max),
    }
}

/// A key scenario's bursts, YARL against one exact central bucket per key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyRow {
    /// Bursts compared.
    pub bursts: usize,
    /// Everything YARL admitted / everything the ideal buckets admitted.
    pub ratio: f64,
    /// Per burst, YARL's admitted minus the ideal bucket's, in seconds of the key's limit:
    /// median, 99th percentile and largest.
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Bursts where YARL admitted fewer than the ideal bucket by more than one request.
    pub under: usize,
}

/// Runs a key scenario with `yarl` and with the ideal bucket of the same bursts.
pub fn evaluate_keys(s: &Scenario, yarl: &Strategy) -> KeyRow {
    let d = chosen_default();
    let got = run(s, yarl);
    let ideal = run(s, &Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s });
    assert_eq!(got.bursts.len(), ideal.bursts.len(), "the same traffic");
    // Bursts are numbered when scheduled, and the results hold every number below the
    // highest seen: one whose key sent nothing inside the counted span (not begun by its
    // end, or over before its start) sits there as (0, 0), and taken for a tie it would
    // swell the count and pull the percentiles toward 0.
    let pairs: Vec<(f64, f64)> = got
        .bursts
        .iter()
        .zip(&ideal.bursts)
        .filter(|(g, i)| g.1 > 0.0 || i.1 > 0.0)
        .map(|(g, i)| (g.0, i.0))
        .collect();
    let mut diff: Vec<f64> = pairs.iter().map(|(g, i)| (g - i) / s.limit).collect();
    diff.sort_by(f64::total_cmp);
    let pct = |p: f64| match diff.len() {
        0 => f64::NAN,
        n => diff[((n - 1) as f64 * p).round() as usize],
    };
    KeyRow {
        bursts: diff.len(),
        ratio: pairs.iter().map(|p| p.0).sum::<f64>() / pairs.iter().map(|p| p.1).sum::<f64>(),
        p50: pct(0.5),
        p99: pct(0.99),
        max: pct(1.0),
        under: pairs.iter().filter(|(g, i)| g + 1.0 < *i).count(),
    }
}

/// The strategies compared, with their names in the report.
pub fn strategies() -> Vec<(String, Strategy)> {
    let d = chosen_default();
    let y = |c: YarlConfig| Strategy::Yarl(c);
    let zone = |r: f64| YarlConfig {
        estimator: Estimator::Static { correction_ratio: r },
        demand: false,
        early: false,
        ..d
    };
    let stat = Estimator::Static { correction_ratio: 1.0 };
    vec![
        (
            "hard cutoff (low=high=1.5 s)".into(),
            y(YarlConfig { low_s: 1.5, high_s: 1.5, ..zone(1.0) }),
        ),
        ("zone, static r=0.5".into(), y(zone(0.5))),
        ("zone, static r=1.0".into(), y(zone(1.0))),
        ("zone, static r=1.5".into(), y(zone(1.5))),
        ("zone, measured".into(), y(YarlConfig { estimator: Estimator::Measured, ..zone(1.0) })),
        (
            "zone + demand, measured".into(),
            y(YarlConfig { estimator: Estimator::Measured, early: false, ..d }),
        ),
        (
            "zone + demand, r=1.0 (the default before early sync)".into(),
            y(YarlConfig { estimator: stat, early: false, ..d }),
        ),
        ("zone + demand, r=1.0, early sync".into(), y(YarlConfig { estimator: stat, ..d })),
        ("zone + demand, static-or-measured".into(), y(YarlConfig { early: false, ..d })),
        ("**zone + demand, static-or-measured, early sync (default)**".into(), y(d)),
        (
            "zone + demand, r=1.0, bursts 0.5/2 s".into(),
            y(YarlConfig { low_s: 0.5, high_s: 2.0, ..d }),
        ),
        ("zone + demand + local guard, r=1.0".into(), y(YarlConfig { guard: true, ..d })),
        ("ref: token bucket limit/N per host".into(), Strategy::TokenBucket { burst_s: 1.5 }),
        ("ref: fixed window, central".into(), Strategy::FixedWindow),
        ("ref: sliding window, central".into(), Strategy::SlidingWindow),
        (
            "ref: ideal leaky bucket 1.5/3 s, central".into(),
            Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s },
        ),
    ]
}

/// A day, seconds.
pub const DAY_S: u64 = 86_400;
/// Days the daily-quota scenario runs, from 00:00 of the first.
pub const DAILY_DAYS: u64 = 2;
/// The daily quota's limit, requests per day.
pub const DAILY_LIMIT: f64 = 1000.0;
/// The quiet clients' trickle, as a multiple of the daily rate (spread evenly over the day).
pub const DAILY_TRICKLE: f64 = 0.2;
/// Requests of the burst that starts at [`DAILY_BURST_AT_S`] each day.
pub const DAILY_BURST: f64 = 3000.0;
/// When the burst starts each day, seconds after midnight (09:00).
pub const DAILY_BURST_AT_S: f64 = 9.0 * 3600.0;
/// How long the burst lasts, s.
pub const DAILY_BURST_LEN_S: f64 = 600.0;
/// A refused client of a leaky bucket (or a fixed window, in its control row) comes back
/// this long after each refusal.
pub const DAILY_RETRY_S: f64 = 3600.0;
/// A refused client of a fixed window comes back when the window resets at midnight,
/// within this many seconds of it.
pub const MIDNIGHT_SPREAD_S: f64 = 60.0;

/// The daily quota: [`DAILY_LIMIT`] per day, bursts left to `QuotaSpec`'s defaults for a
/// window (`high_burst` = limit, `low_burst` = limit - 1).
pub fn daily_limits() -> Limits {
    QuotaSpec {
        limit: Some(DAILY_LIMIT),
        per: Some("1d".into()),
        low_burst: None,
        high_burst: None,
        parent: None,
        dry_run: false,
        max_in_flight: None,
    }
    .validate("daily")
    .expect("a valid quota")
}

/// The daily quota over 50 hosts, 2 roots, 1 s sync for [`DAILY_DAYS`] days from 00:00:
/// a trickle of [`DAILY_TRICKLE`] × the daily rate all day (Poisson, any host), and
/// [`DAILY_BURST`] more requests in the [`DAILY_BURST_LEN_S`] from 09:00 each day; refused
/// requests come back as `retry` says.
pub fn daily(retry: Retry) -> Scenario {
    let limits = daily_limits();
    let per_s = limits.limit_units() / limits.window_secs() as f64;
    // Loads are multiples of the limit per second: the burst is 432 of them.
    let burst = DAILY_BURST / DAILY_BURST_LEN_S / per_s;
    let phase = |from_s: f64, rate: f64| Phase { from_s, rate, spread: Spread::Uniform };
    let mut phases = vec![phase(0.0, DAILY_TRICKLE)];
    for d in 0..DAILY_DAYS {
        let at = (d * DAY_S) as f64 + DAILY_BURST_AT_S;
        phases.push(phase(at, DAILY_TRICKLE + burst));
        phases.push(phase(at + DAILY_BURST_LEN_S, DAILY_TRICKLE));
    }
    let mut s = base(Load { phases }, DAILY_DAYS * DAY_S);
    s.limit = per_s;
    s.quota = Some(limits);
    s.retry = retry;
    s
}

/// The daily scenario's strategies, each with how its refused clients come back: YARL and
/// the exact central leaky bucket of the same limits (clients retry an hour after each
/// refusal), the fixed window per calendar day (clients retry when it resets at midnight,
/// and, as a control, an hour after each refusal).
pub fn daily_cases() -> Vec<(String, Strategy, Retry)> {
    let d = chosen_default();
    let hourly = Retry::After { after_s: DAILY_RETRY_S };
    let midnight = Retry::AtWindowEnd { window_s: DAY_S as f64, spread_s: MIDNIGHT_SPREAD_S };
    vec![
        ("**YARL, default strategy; retry hourly**".into(), Strategy::Yarl(d), hourly),
        (
            "ref: ideal leaky bucket, same limits, central; retry hourly".into(),
            // The scenario's quota gives the bursts.
            Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s },
            hourly,
        ),
        (
            "ref: fixed window per calendar day, central; retry at midnight".into(),
            Strategy::FixedWindow,
            midnight,
        ),
        (
            "ref: fixed window per calendar day, central; retry hourly".into(),
            Strategy::FixedWindow,
            hourly,
        ),
    ]
}

/// One strategy's figures in the daily scenario, in requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DailyRow {
    /// Admitted in each calendar day.
    pub per_day: Vec<f64>,
    /// The most admitted in any minute, any hour and any 24 hours of the run (sliding, to
    /// the second).
    pub max_minute: f64,
    pub max_hour: f64,
    pub max_day: f64,
    /// The most admitted in any minute and any hour of the last day, once the first
    /// burst has spent the quota.
    pub last_max_minute: f64,
    pub last_max_hour: f64,
    /// Admitted in the minute after the first midnight (00:00 to 00:01 of day 2).
    pub midnight_minute: f64,
    /// Admitted from 09:00 to 10:00, each day.
    pub burst_hour: Vec<f64>,
    /// Requests sent in all, retries included, and refused in all (a request refused
    /// three times counts three times in both).
    pub offered: f64,
    pub refused: f64,
}

/// Runs the daily scenario with `strategy`, refused clients coming back as `retry` says.
pub fn evaluate_daily(strategy: &Strategy, retry: Retry) -> (DailyRow, RunResult) {
    let r = run(&daily(retry), strategy);
    let (day, days) = (DAY_S as usize, DAILY_DAYS as usize);
    let all = 0..days * day;
    let last = (days - 1) * day..days * day;
    let nine = DAILY_BURST_AT_S as usize;
    let row = DailyRow {
        per_day: (0..days).map(|d| r.admitted_in(d * day..(d + 1) * day)).collect(),
        max_minute: r.max_admitted_in_any(60, all.clone()),
        max_hour: r.max_admitted_in_any(3600, all.clone()),
        max_day: r.max_admitted_in_any(day, all),
        last_max_minute: r.max_admitted_in_any(60, last.clone()),
        last_max_hour: r.max_admitted_in_any(3600, last),
        midnight_minute: r.admitted_in(day..day + 60),
        burst_hour: (0..days)
            .map(|d| r.admitted_in(d * day + nine..d * day + nine + 3600))
            .collect(),
        offered: r.offered.iter().sum(),
        refused: r.rejected.iter().sum(),
    };
    (row, r)
}

/// One strategy's results in every scenario of the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    /// Mean admitted / limit, 3x, from [`WARMUP_S`].
    pub steady_mean: f64,
    /// Per-second CV, 3x, from [`WARMUP_S`].
    pub steady_cv: f64,
    /// Mean admitted / limit, 3x with weights 1..=9.
    pub weighted_mean: f64,
    /// Rejected requests under 0.9x spread evenly.
    pub fp_even: f64,
    /// Rejected requests under 0.9x on one host.
    pub fp_one_host: f64,
    /// Admitted in the 2 s after a 10x step / (2 · limit), spread evenly.
    pub step_even: f64,
    /// Same, 95% of the step on one host.
    pub step_hot: f64,
    /// Admitted above the limit in the 2 s around a 0.5 s 10x spike, seconds of the limit.
    pub spike_excess: f64,
    /// Mean admitted / limit, the 300-host sparse case, from [`WARMUP_S`].
    pub sparse_mean: f64,
    /// Seconds of rejections after 3x drops to 0.8x.
    pub echo_s: f64,
    /// Admitted above the limit in the 10 s after the 10x step, seconds of the limit.
    pub step_excess: f64,
    /// Sync requests per root per second, 3x steady, from [`WARMUP_S`].
    pub root_rate: f64,
    /// Early rounds per host per second in the 3x steady run.
    pub early_rate: f64,
}

/// The runs behind one row, kept for the figures.
pub struct Runs {
    /// 3x steady.
    pub steady: RunResult,
    /// 10x step, even.
    pub step: RunResult,
    /// 10x step, hot host.
    pub step_hot: RunResult,
    /// Sparse.
    pub sparse: RunResult,
    /// Echo.
    pub echo: RunResult,
}

/// Runs every scenario of the table with `s`.
pub fn evaluate(s: &Strategy) -> (Row, Runs) {
    let steady = run(&steady_3x(), s);
    let weighted = run(&weighted_3x(), s);
    let even = run(&under_09x(), s);
    let one = run(&under_09x_one_host(), s);
    let step = run(&step_10x(), s);
    let step_hot = run(&step_10x_hot(), s);
    let spike = run(&short_spike(), s);
    let sparse = run(&sparse(), s);
    let echo = run(&echo(), s);
    let all = WARMUP_S..usize::MAX;
    let row = Row {
        steady_mean: steady.mean_ratio(all.clone()),
        steady_cv: steady.cv(all.clone()),
        weighted_mean: weighted.mean_ratio(all.clone()),
        fp_even: even.rejected_in(0..usize::MAX),
        fp_one_host: one.rejected_in(0..usize::MAX),
        step_even: step.reaction(STEP_S),
        step_hot: step_hot.reaction(STEP_S),
        spike_excess: spike.excess(STEP_S..STEP_S + 2),
        sparse_mean: sparse.mean_ratio(all.clone()),
        echo_s: echo.echo(STOP_S as f64),
        step_excess: step.excess(STEP_S..STEP_S + 10),
        root_rate: steady.root_messages[WARMUP_S..].iter().sum::<f64>()
            / (steady.root_messages.len() - WARMUP_S).max(1) as f64
            / steady_3x().roots as f64,
        early_rate: steady.early_rounds as f64
            / steady_3x().hosts as f64
            / steady.root_messages.len().max(1) as f64,
    };
    (row, Runs { steady, step, step_hot, sparse, echo })
}

/// Limits of the low-rate rows, units per second.
pub const LOW_RATE_LIMITS: [f64; 4] = [1.0, 10.0, 50.0, 1000.0];
/// Loads of the low-rate rows, times the limit.
pub const LOW_RATE_LOADS: [f64; 3] = [1.2, 1.5, 3.0];
/// How long the low-rate rows run: a limit of 1/s admits few enough that a mean needs
/// minutes.
pub const LOW_RATE_SECONDS: u64 = 300;
/// The window the low-rate rows' CV is taken over, seconds: per second, a limit of 1/s is
/// all Poisson noise.
pub const LOW_RATE_WINDOW_S: usize = 5;

/// One quota at a steady overload over 50 hosts, at a low limit: YARL's default, the same
/// without the demand signal (the drop zone alone) and one exact central bucket.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LowRateRow {
    pub limit: f64,
    pub load: f64,
    /// `low_burst` and `high_burst`, seconds of the limit.
    pub low_s: f64,
    pub high_s: f64,
    /// Mean admitted / limit from [`WARMUP_S`], and the CV of what was admitted per
    /// [`LOW_RATE_WINDOW_S`]: the default, the zone alone, the exact bucket.
    pub mean: f64,
    pub cv: f64,
    pub zone_mean: f64,
    pub zone_cv: f64,
    pub ideal_mean: f64,
    pub ideal_cv: f64,
}

/// Larger bursts tried at the lowest limit, seconds of the limit (`low_burst`, `high_burst`).
pub const LOW_RATE_BURSTS: [(f64, f64); 2] = [(3.0, 6.0), (5.0, 10.0)];

/// Where the demand signal stops counting: the same steady overload at limits from 1/s to
/// 1000/s (`decision::demand_excess_share` asks the meter's count to pass the limit's by
/// three times its square root), with the default bursts, and at the lowest limit with
/// larger ones.
pub fn low_rate_rows() -> Vec<LowRateRow> {
    let d = chosen_default();
    let mut cases: Vec<(f64, f64, f64, f64)> = LOW_RATE_LIMITS
        .iter()
        .flat_map(|&l| LOW_RATE_LOADS.iter().map(move |&x| (l, x, d.low_s, d.high_s)))
        .collect();
    for (low_s, high_s) in LOW_RATE_BURSTS {
        cases.extend(LOW_RATE_LOADS.iter().map(|&x| (LOW_RATE_LIMITS[0], x, low_s, high_s)));
    }
    // Each run seeds its own generators (`run`), so the threads change nothing.
    std::thread::scope(|scope| {
        let runs: Vec<_> = cases
            .into_iter()
            .map(|(limit, load, low_s, high_s)| {
                scope.spawn(move || {
                    let mut s = base(Load::steady(load, Spread::Uniform), LOW_RATE_SECONDS);
                    s.limit = limit;
                    let d = YarlConfig { low_s, high_s, ..d };
                    let of = |st: Strategy| {
                        let r = run(&s, &st);
                        (
                            r.mean_ratio(WARMUP_S..usize::MAX),
                            r.cv_per(WARMUP_S..usize::MAX, LOW_RATE_WINDOW_S),
                        )
                    };
                    let (mean, cv) = of(Strategy::Yarl(d));
                    let (zone_mean, zone_cv) =
                        of(Strategy::Yarl(YarlConfig { demand: false, ..d }));
                    let (ideal_mean, ideal_cv) =
                        of(Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s });
                    LowRateRow {
                        limit,
                        load,
                        low_s,
                        high_s,
                        mean,
                        cv,
                        zone_mean,
                        zone_cv,
                        ideal_mean,
                        ideal_cv,
                    }
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("a low-rate run")).collect()
    })
}
