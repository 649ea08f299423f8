//! Prints the quiet-keys rows of the accuracy report alone (faster than `make sim`).
use yarl_sim::experiments::{chosen_default, evaluate_keys, quiet_keys};
use yarl_sim::{KeyHosts, Strategy};

fn main() {
    for hosts in [KeyHosts::Random, KeyHosts::Sticky] {
        let t = std::time::Instant::now();
        let r = evaluate_keys(&quiet_keys(hosts), &Strategy::Yarl(chosen_default()));
        println!("{hosts:?}: {r:?} ({:.1} s)", t.elapsed().as_secs_f64());
    }
}
