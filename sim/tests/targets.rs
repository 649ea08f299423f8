//! The accuracy targets of the chosen default, on a shortened run (debug builds are slow).

use yarl_sim::experiments::{
    chosen_default, evaluate_zipf, steady_3x, under_09x, zipf_keys, WARMUP_S,
};
use yarl_sim::{run, Strategy};

#[test]
fn default_holds_3x_overload_within_3_percent_without_a_saw() {
    let mut s = steady_3x();
    s.seconds = 15;
    let r = run(&s, &Strategy::Yarl(chosen_default()));
    let mean = r.mean_ratio(WARMUP_S..usize::MAX);
    let cv = r.cv(WARMUP_S..usize::MAX);
    assert!((mean - 1.0).abs() <= 0.03, "admitted {mean} x limit, per second {:?}", r.admitted);
    assert!(cv < 0.05, "per-second CV {cv}, per second {:?}", r.admitted);
}

#[test]
fn default_never_rejects_at_0_9x() {
    let mut s = under_09x();
    s.seconds = 15;
    let r = run(&s, &Strategy::Yarl(chosen_default()));
    assert_eq!(r.rejected_in(0..usize::MAX), 0.0, "rejections per second {:?}", r.rejected);
    assert!((r.mean_ratio(0..usize::MAX) - 0.9).abs() < 0.05);
}

#[test]
fn runs_are_deterministic() {
    let mut s = steady_3x();
    s.seconds = 4;
    let a = run(&s, &Strategy::Yarl(chosen_default()));
    let b = run(&s, &Strategy::Yarl(chosen_default()));
    assert_eq!(a, b);
}

#[test]
fn false_rejections_are_those_the_exact_bucket_was_certain_to_admit() {
    let mut s = zipf_keys();
    s.seconds = 20;
    let d = chosen_default();
    // The exact bucket against itself: the same traffic and draws, the same refusals, none
    // false (the check itself can tell a refusal in the drop zone from one outside it).
    let same = evaluate_zipf(&s, &Strategy::IdealBucket { low_s: d.low_s, high_s: d.high_s });
    assert!(same.ideal_cold_rejected > 0.0, "the warmest cold keys' clumps reach the zone");
    assert_eq!(same.cold_rejected, same.ideal_cold_rejected);
    assert_eq!(same.cold_false, 0);
    // A bucket with a third of the `low_burst` refuses where the exact one admits for sure.
    let tight = evaluate_zipf(&s, &Strategy::IdealBucket { low_s: 0.5, high_s: d.high_s });
    assert!(tight.cold_false > 0, "{tight:?}");
    assert!(tight.cold_false_gap_s > 0.0 && tight.cold_false_gap_s < d.low_s, "{tight:?}");
}

#[test]
fn a_key_run_without_a_burst_in_its_span_reports_none() {
    let mut s = yarl_sim::experiments::quiet_keys(yarl_sim::KeyHosts::Sticky);
    s.seconds = 3;
    if let Some(k) = s.keys.as_mut() {
        k.keys = 20;
        k.from_s = 10.0;
    }
    let r = yarl_sim::experiments::evaluate_keys(&s, &Strategy::Yarl(chosen_default()));
    assert_eq!(r.bursts, 0);
    assert_eq!(r.under, 0);
}
