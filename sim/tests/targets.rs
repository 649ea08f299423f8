//! The accuracy targets of the chosen default, on a shortened run (debug builds are slow).

use yarl_sim::experiments::{chosen_default, steady_3x, under_09x, WARMUP_S};
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
