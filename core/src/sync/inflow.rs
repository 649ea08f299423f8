//! The inflow estimate: how fast the rest of the cluster fills a counter's bucket between two
//! rounds. The request path adds it to the synced fill for the time since the last sync, so
//! that it decides on what the other limiters count before the roots report it.
//!
//! A pure function of what one round learned of one counter, apart from the block, the clock
//! and the engine, so that each estimator's reasoning can be tested on plain numbers.
//!
//! Units: fills in milli-units, times in clock nanoseconds, rates in milli-units per second.

use crate::decision::{chance, demand_at_least};
use crate::limiter::Estimator;
use crate::root::demand::DEMAND_WINDOW_NS;

/// What a round learned of one counter that some root reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// The quota's limit: the rate at which its bucket drains.
    pub limit: f64,
    /// The synced (fill, time) before the round's first report; time 0 if the counter had
    /// never been synced.
    pub before: (u64, u64),
    /// The synced (fill, time) once the round's reports are merged.
    pub after: (u64, u64),
    /// What this limiter counted on the counter in the round's batch.
    pub own: u64,
    /// How long the round's batch was counted over.
    pub round_ns: u64,
    /// The sync interval.
    pub interval_ns: u64,
    /// The estimate so far (0: none).
    pub inflow: f64,
    /// The cluster's demand the roots metered (0: unknown).
    pub demand: f64,
}

/// The inflow estimate of `estimator` after the round described by `s`: what the other
/// limiters are estimated to add per second. Always finite and at least 0, as the block
/// stores nothing else.
#[inline]
pub(crate) fn estimate(estimator: Estimator, s: &Sample) -> f64 {
    let inflow = match estimator {
        Estimator::Static { correction_ratio } => static_share(correction_ratio, s),
        Estimator::StaticOrMeasured { correction_ratio } => static_or_surge(correction_ratio, s),
        Estimator::Measured => measured(s),
    };
    if inflow.is_finite() && inflow > 0.0 {
        inflow
    } else {
        0.0
    }
}

/// [`Estimator::Static`]: `correction_ratio · limit` is the whole cluster's inflow while the
/// counter is hot, or `correction_ratio ·` what the roots' demand says came in, at least,
/// when that is less: a quota under its limit drains at the limit while the cluster adds
/// its demand, and taken as adding the limit its estimate never drained between answers.
/// At least: the roots meter the demand over [`DEMAND_WINDOW_NS`], and a key under its
/// limit sends clumps that read as more than the limit there (8 units/s read as 12) while
/// its bucket drains; taken as read, the limit stood for the inflow and a fill a clump had
/// raised past `low_burst` held for the whole interval (false rejections of keys under
/// their limit, docs/accuracy.md's Zipf keys). This limiter's own share is counted exactly
/// in `local`, so the others add the rest: the ratio minus this limiter's own rate over the
/// round, and nothing when that rate alone reaches the ratio.
fn static_share(correction_ratio: f64, s: &Sample) -> f64 {
    let cluster = if s.demand > 0.0 {
        s.limit.min(demand_at_least(s.demand, DEMAND_WINDOW_NS))
    } else {
        s.limit
    };
    (correction_ratio * cluster - own_rate(s)).max(0.0)
}

/// This limiter's own rate over the round.
fn own_rate(s: &Sample) -> f64 {
    s.own as f64 / (s.round_ns as f64 * 1e-9)
}

/// [`Estimator::StaticOrMeasured`]: the static share, raised to what the fill's change
/// between the two syncs says came in, at least ([`chance`]), when that is more. During a
/// surge the cluster adds far more than `limit` per second until the drops catch up, and
/// the constant under-reads it for a whole interval; at steady state the drops hold the
/// cluster at the limit and the static share is the larger.
///
/// Only a bucket that cannot have emptied in between says what flowed in: one that held at
/// least `limit · dt` drained the full `limit · dt`, so the inflow is the fill's change plus
/// that drain. An emptied one hides the drain it missed, and a counter never synced before
/// (time 0) or two syncs at the same time measure nothing: these keep the static share.
fn static_or_surge(correction_ratio: f64, s: &Sample) -> f64 {
    let stat = static_share(correction_ratio, s);
    let ((b1, t1), (b2, t2)) = (s.before, s.after);
    let limit = s.limit;
    if t1 == 0 || t2 <= t1 {
        return stat;
    }
    let dt = span(s) as f64 * 1e-9;
    if (b1 as f64) < limit * dt {
        return stat;
    }
    // What came in over dt, at least: requests arrive in clumps, and one read as a surge
    // is added again for a whole interval (clumps of keys at 0.9 x of 10/s, read so, were
    // refused: docs/accuracy.md, Zipf keys).
    let came = b2 as f64 - b1 as f64 + limit * dt;
    let total = (came - chance(came)) / dt;
    stat.max(total - own_rate(s))
}

/// [`Estimator::Measured`]: the fill's change between the two syncs plus the drain at
/// `limit` is what the whole cluster added; this limiter's own count over the same time is
/// the part that is not the others'. A counter never synced before started empty, so its
/// fill came in about an interval; two syncs at the same time measure nothing and leave the
/// estimate as it was.
///
/// Each round's measure is averaged with the previous estimate (weights ½, ½), which damps
/// the noise of a single measure between two syncs; with no previous estimate (a counter new
/// or cold) the measure is taken as is.
fn measured(s: &Sample) -> f64 {
    let ((b1, t1), (b2, t2)) = (s.before, s.after);
    if t1 != 0 && t2 <= t1 {
        return s.inflow;
    }
    let dt = span(s);
    let secs = dt as f64 * 1e-9;
    let total = (b2 as f64 - b1 as f64) / secs + s.limit;
    let others = (total - s.own as f64 / secs).max(0.0);
    if s.inflow > 0.0 {
        0.5 * s.inflow + 0.5 * others
    } else {
        others
    }
}

/// The time the fill's change between the two syncs is measured over: at least the round's
/// span (what its batch was counted over; short for an early round). The earlier fill's
/// time is not always a root's report: a round no root answered folds its batch into the
/// local view at the round's end, and a round slowed by a root that does not answer ends
/// late; the next report can then come tens of ms after it while the roots gathered a
/// whole round of the cluster's counts. Measured over those ms, a quota at 0.9 x its limit
/// read as a surge at 2.25 x and was refused for a round (`make chaos`, 20 % loss).
fn span(s: &Sample) -> u64 {
    let (t1, t2) = (s.before.1, s.after.1);
    if t1 == 0 {
        return s.interval_ns;
    }
    t2.saturating_sub(t1).max(s.round_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;
    const STATIC: Estimator = Estimator::Static { correction_ratio: 1.0 };
    const SURGE: Estimator = Estimator::StaticOrMeasured { correction_ratio: 1.0 };
    const MEASURED: Estimator = Estimator::Measured;

    /// 10 units/s, synced a second apart at 10 s and 11 s with a steady fill of 20 units,
    /// nothing counted here, one-second rounds, no estimate yet.
    fn sample() -> Sample {
        Sample {
            limit: 10_000.0,
            before: (20_000, 10 * S),
            after: (20_000, 11 * S),
            own: 0,
            round_ns: S,
            interval_ns: S,
            inflow: 0.0,
            demand: 0.0,
        }
    }

    /// Seen in `make chaos` under loss: a report 70 ms after the local view was last set
    /// (a folded batch, a late round end), the fill up 11.3 units: over 70 ms that read as
    /// the others adding 225/s to a quota of 100/s with 90/s of demand in all.
    #[test]
    fn a_change_is_never_measured_over_less_than_the_round() {
        let s = Sample {
            limit: 100_000.0,
            before: (81_764, 10 * S),
            after: (93_031, 10 * S + 70_000_000),
            own: 18_000,
            round_ns: S / 2,
            interval_ns: S / 2,
            inflow: 70_000.0,
            demand: 0.0,
        };
        // 11.3 units more over half a second while draining 50: 61.3 came in, of which
        // 18 were this limiter's own; at least 61.3 - 3 * sqrt(61.3) = 37.8 of it by more
        // than chance, 75.6/s, under the static 100/s less the own 36/s.
        let surge = estimate(SURGE, &s);
        assert_eq!(surge, 64_000.0);
        let measured = estimate(MEASURED, &s);
        assert!(measured < 100_000.0, "{measured}");
    }

    #[test]
    fn static_is_the_ratio_less_the_own_rate() {
        let s = Sample { own: 3_000, ..sample() };
        assert_eq!(estimate(STATIC, &s), 7_000.0);
        let half = Estimator::Static { correction_ratio: 0.5 };
        assert_eq!(estimate(half, &s), 2_000.0);
        // The own rate is over the round: 1 unit in a quarter second is 4 units/s.
        let quick = Sample { own: 1_000, round_ns: S / 4, ..sample() };
        assert!((estimate(STATIC, &quick) - 6_000.0).abs() < 1e-6);
    }

    #[test]
    fn an_own_share_above_the_ratio_leaves_nothing_to_the_others() {
        let s = Sample { own: 25_000, ..sample() };
        assert_eq!(estimate(Estimator::Static { correction_ratio: 2.0 }, &s), 0.0);
        assert_eq!(estimate(Estimator::StaticOrMeasured { correction_ratio: 2.0 }, &s), 0.0);
    }

    /// What came in, less three standard deviations of a Poisson count of unit
    /// requests, per second of `secs`.
    fn at_least(came: f64, secs: f64) -> f64 {
        (came - 3.0 * (1000.0 * came).sqrt()) / secs
    }

    #[test]
    fn a_surge_raises_the_static_share_to_what_came_in_at_least() {
        // 30 units more in a second while draining 10: 40 units/s came in, at least 21 of
        // it by more than chance.
        let s = Sample { after: (50_000, 11 * S), ..sample() };
        let surge = at_least(40_000.0, 1.0);
        assert!((surge - 21_026.3).abs() < 0.1, "{surge}");
        assert_eq!(estimate(SURGE, &s), surge);
        // 5 of them are this limiter's own.
        let own = Sample { own: 5_000, ..s };
        assert_eq!(estimate(SURGE, &own), surge - 5_000.0);
        // The static estimator does not see it.
        assert_eq!(estimate(STATIC, &s), 10_000.0);
        // On a busy quota the margin is small: 3 x of 1000/s over a second reads 2836/s.
        let busy = Sample {
            limit: 1_000_000.0,
            before: (2_000_000, 10 * S),
            after: (4_000_000, 11 * S),
            ..sample()
        };
        assert!((estimate(SURGE, &busy) - 2_835_683.0).abs() < 1.0, "{}", estimate(SURGE, &busy));
    }

    /// The Zipf scenario of docs/accuracy.md: a key at 0.9 x of 10/s (Poisson) sometimes
    /// brings 15 units in a second, and read as a surge of 15/s it was added again for the
    /// next interval on top of a fill already near `low_burst`: refused under its limit.
    #[test]
    fn a_clump_a_steady_stream_makes_by_chance_is_no_surge() {
        let clump = Sample { before: (12_000, 10 * S), after: (17_000, 11 * S), ..sample() };
        assert_eq!(estimate(SURGE, &clump), 10_000.0);
        // Four times the limit is a surge: 40 came in, at least 21 of it.
        let surge = Sample { after: (42_000, 11 * S), ..clump };
        assert!(estimate(SURGE, &surge) > 20_000.0);
    }

    #[test]
    fn the_static_share_is_what_the_clusters_demand_says_came_in_at_least() {
        // The roots metered 9 units/s in all, 18 units over their 2 s: at least
        // 18 - 3 * sqrt(18) = 5.27 of it, 2.64/s; the others add that less the own 1.
        let s = Sample { own: 1_000, demand: 9_000.0, ..sample() };
        let want = 9_000.0 - 1_500.0 * 18f64.sqrt() - 1_000.0;
        assert!((estimate(STATIC, &s) - want).abs() < 1e-6, "{}", estimate(STATIC, &s));
        assert_eq!(estimate(STATIC, &s), estimate(SURGE, &s));
        // A key at 8/s read as 12/s over the meter's 2 s: not the limit, 4.65/s.
        let clump = Sample { own: 0, demand: 12_000.0, ..s };
        assert!((estimate(STATIC, &clump) - 4_651.5).abs() < 1.0, "{}", estimate(STATIC, &clump));
        // Well above the limit the drops hold the cluster at the limit: 3 x of 10/s.
        let over = Sample { demand: 30_000.0, ..s };
        assert_eq!(estimate(STATIC, &over), 9_000.0);
        // A busy quota loses little: 900/s of 1000/s reads as at least 836/s.
        let busy = Sample { limit: 1e6, own: 0, demand: 9e5, ..s };
        assert!((estimate(STATIC, &busy) - 836_360.0).abs() < 1.0, "{}", estimate(STATIC, &busy));
        // No demand metered (an old root): the limit.
        let unknown = Sample { demand: 0.0, ..s };
        assert_eq!(estimate(STATIC, &unknown), 9_000.0);
    }

    #[test]
    fn a_steady_or_falling_fill_keeps_the_static_share() {
        assert_eq!(estimate(SURGE, &sample()), 10_000.0);
        let falling = Sample { after: (12_000, 11 * S), ..sample() };
        assert_eq!(estimate(SURGE, &falling), 10_000.0);
    }

    #[test]
    fn a_bucket_that_may_have_emptied_measures_nothing() {
        // 5 units cannot last the second at 10 units/s: the drain it missed is unknown.
        let s = Sample { before: (5_000, 10 * S), after: (50_000, 11 * S), ..sample() };
        assert_eq!(estimate(SURGE, &s), 10_000.0);
        // Exactly one second's drain cannot have emptied it before the end.
        let full = Sample { before: (10_000, 10 * S), ..s };
        assert_eq!(estimate(SURGE, &full), at_least(50_000.0, 1.0));
    }

    #[test]
    fn syncs_at_the_same_time_measure_nothing() {
        let s = Sample { after: (50_000, 10 * S), inflow: 1_234.0, ..sample() };
        assert_eq!(estimate(SURGE, &s), 10_000.0);
        assert_eq!(estimate(MEASURED, &s), 1_234.0);
        // A report older than the one before it is no interval either.
        let back = Sample { after: (50_000, 9 * S), ..s };
        assert_eq!(estimate(SURGE, &back), 10_000.0);
        assert_eq!(estimate(MEASURED, &back), 1_234.0);
    }

    #[test]
    fn a_counter_never_synced_before() {
        let s = Sample { before: (0, 0), after: (30_000, 11 * S), ..sample() };
        assert_eq!(estimate(SURGE, &s), 10_000.0);
        // Its 30 units came in over about an interval, draining 10.
        assert_eq!(estimate(MEASURED, &s), 40_000.0);
        let slow = Sample { interval_ns: 2 * S, ..s };
        assert_eq!(estimate(MEASURED, &slow), 25_000.0);
    }

    #[test]
    fn measured_takes_out_the_own_count_over_the_same_time() {
        let s = Sample { after: (50_000, 11 * S), own: 10_000, round_ns: S / 2, ..sample() };
        assert_eq!(estimate(MEASURED, &s), 30_000.0);
        let two = Sample { after: (80_000, 12 * S), own: 10_000, ..sample() };
        assert_eq!(estimate(MEASURED, &two), 35_000.0);
    }

    #[test]
    fn measured_averages_with_the_previous_estimate() {
        let s = Sample { after: (50_000, 11 * S), inflow: 20_000.0, ..sample() };
        assert_eq!(estimate(MEASURED, &s), 30_000.0);
        // A falling fill measures nothing coming in, and halves the estimate.
        let falling = Sample { before: (100_000, 10 * S), after: (0, 11 * S), ..s };
        assert_eq!(estimate(MEASURED, &falling), 10_000.0);
        assert_eq!(estimate(MEASURED, &Sample { inflow: 0.0, ..falling }), 0.0);
    }

    fn any_estimator() -> impl Strategy<Value = Estimator> {
        prop_oneof![
            any::<f64>().prop_map(|r| Estimator::Static { correction_ratio: r }),
            any::<f64>().prop_map(|r| Estimator::StaticOrMeasured { correction_ratio: r }),
            Just(Estimator::Measured),
        ]
    }

    prop_compose! {
        /// Any sample, with a previous estimate of any value.
        fn any_sample()(
            limit in any::<u64>().prop_map(|l| l as f64),
            before in any::<(u64, u64)>(),
            after in any::<(u64, u64)>(),
            own in any::<u64>(),
            round_ns in any::<u64>(),
            interval_ns in any::<u64>(),
            inflow in any::<f64>(),
            demand in any::<f64>(),
        ) -> Sample {
            Sample { limit, before, after, own, round_ns, interval_ns, inflow, demand }
        }
    }

    prop_compose! {
        /// A sample as the block holds them: a limit up to 10^9 units/s, syncs within a day,
        /// rounds from 1 ms to a minute, and a previous estimate that is finite and not
        /// negative.
        fn held_sample()(
            limit in (0..1_000_000_000_000u64).prop_map(|l| l as f64),
            b1 in 0..1_000_000_000_000_000u64,
            t1 in 0..86_400 * S,
            b2 in 0..1_000_000_000_000_000u64,
            dt in 0..600 * S,
            own in 0..1_000_000_000_000_000u64,
            round_ns in 1_000_000..60 * S,
            interval_ns in 1_000_000..60 * S,
            inflow in 0.0..1e15f64,
            demand in 0.0..1e15f64,
        ) -> Sample {
            let (before, after) = ((b1, t1), (b2, t1 + dt));
            Sample { limit, before, after, own, round_ns, interval_ns, inflow, demand }
        }
    }

    fn ratio() -> impl Strategy<Value = f64> {
        0.0..=2.0f64
    }

    proptest! {
        #[test]
        fn never_negative_nan_or_infinite(e in any_estimator(), s in any_sample()) {
            let x = estimate(e, &s);
            prop_assert!(x.is_finite() && x >= 0.0, "{x} for {e:?} {s:?}");
        }

        #[test]
        fn static_ignores_what_was_measured(
            r in ratio(),
            s in held_sample(),
            o in held_sample(),
        ) {
            let e = Estimator::Static { correction_ratio: r };
            let (before, after, inflow) = (o.before, o.after, o.inflow);
            let other = Sample { before, after, inflow, interval_ns: o.interval_ns, ..s };
            prop_assert_eq!(estimate(e, &s), estimate(e, &other));
            prop_assert!(estimate(e, &s) <= r * s.limit);
        }

        #[test]
        fn the_surge_estimate_never_falls_below_the_static_one(r in ratio(), s in held_sample()) {
            let floor = estimate(Estimator::Static { correction_ratio: r }, &s);
            let raised = estimate(Estimator::StaticOrMeasured { correction_ratio: r }, &s);
            prop_assert!(raised >= floor, "{raised} < {floor}");
        }

        #[test]
        fn measured_estimates_grow_with_the_fill_increase(
            r in ratio(),
            s in held_sample(),
            more in 0..1_000_000_000_000_000u64,
        ) {
            let fuller = Sample { after: (s.after.0 + more, s.after.1), ..s };
            for e in [Estimator::StaticOrMeasured { correction_ratio: r }, Estimator::Measured] {
                prop_assert!(estimate(e, &fuller) >= estimate(e, &s), "{e:?}");
            }
        }

        #[test]
        fn measured_lies_between_the_old_estimate_and_the_new_measure(
            s in held_sample(),
            old in 1e-3..1e15f64,
        ) {
            prop_assume!(s.before.1 == 0 || s.after.1 > s.before.1);
            let new = estimate(Estimator::Measured, &Sample { inflow: 0.0, ..s });
            let avg = estimate(Estimator::Measured, &Sample { inflow: old, ..s });
            prop_assert!(avg >= old.min(new) && avg <= old.max(new), "{avg} from {old}, {new}");
        }
    }
}
