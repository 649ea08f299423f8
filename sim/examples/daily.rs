//! Prints the daily-quota rows of the accuracy report alone (faster than `make sim`).
use yarl_sim::experiments::{daily_cases, evaluate_daily};

fn main() {
    for (name, strategy, retry) in daily_cases() {
        let t = std::time::Instant::now();
        let (r, _) = evaluate_daily(&strategy, retry);
        println!("{name}: {r:?} ({:.1} s)", t.elapsed().as_secs_f64());
    }
}
