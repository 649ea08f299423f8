//! The daily-quota scenario's references (YARL's two-day run is `make sim`'s: too slow for a
//! debug build).

use yarl_sim::experiments::{daily_cases, evaluate_daily};
use yarl_sim::Strategy;

#[test]
fn fixed_window_stampedes_at_midnight_and_the_leaky_bucket_refills_smoothly() {
    let cases = daily_cases();
    let case = |needle: &str| {
        let (_, s, retry) = cases.iter().find(|(n, _, _)| n.contains(needle)).expect("case");
        evaluate_daily(s, *retry).0
    };
    let fixed = case("retry at midnight");
    assert_eq!(fixed.per_day, vec![1000.0; 2], "one calendar day's limit each day");
    assert_eq!(fixed.midnight_minute, 1000.0, "the whole day in the minute after midnight");
    let ideal = case("ideal leaky bucket");
    assert!(matches!(cases[1].1, Strategy::IdealBucket { .. }));
    assert!((ideal.per_day[1] - 1000.0).abs() <= 2.0, "day 2: {:?}", ideal.per_day);
    assert_eq!(ideal.midnight_minute, 0.0);
    // After the first burst it refills one each 86.4 s, about 42 an hour; retries come in
    // hourly waves, so a sliding hour can catch two waves' starts, never the day.
    assert!(ideal.last_max_hour <= 100.0, "{}", ideal.last_max_hour);
    assert!(ideal.max_day <= 2.0 * 1000.0, "{} in 24 h", ideal.max_day);
}
