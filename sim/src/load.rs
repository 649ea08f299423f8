//! Offered traffic: a piecewise-constant total rate, how it spreads over the hosts, and the
//! weight of each request.

/// How one phase's requests are spread over the hosts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spread {
    /// Every host equally likely (a round-robin balancer).
    Uniform,
    /// Host 0 gets `share` of the requests, the rest spread evenly over all hosts (a sticky
    /// client, or a balancer that failed over to one box).
    Hot {
        /// Fraction of the phase's requests that go to host 0.
        share: f64,
    },
    /// Every whole second a fresh random `fraction` of the hosts takes all requests, the
    /// others are idle (the article's 300-host case: two of three idle in any second,
    /// different ones each second).
    Sparse {
        /// Fraction of hosts active in any one second.
        fraction: f64,
    },
}

/// From `from_s` on (until the next phase), `rate` times the limit arrives, spread by `spread`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Start, seconds of simulated time.
    pub from_s: f64,
    /// Offered weight per second, as a multiple of the quota's limit.
    pub rate: f64,
    /// Where the requests land.
    pub spread: Spread,
}

/// Request weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weights {
    /// Every request weighs 1 (requests per second).
    One,
    /// Uniform integer weights in `lo..=hi` (bytes, objects, …).
    Uniform {
        /// Smallest weight.
        lo: u64,
        /// Largest weight.
        hi: u64,
    },
}

impl Weights {
    /// Mean weight of one request.
    pub fn mean(&self) -> f64 {
        match *self {
            Weights::One => 1.0,
            Weights::Uniform { lo, hi } => (lo + hi) as f64 / 2.0,
        }
    }

    /// One request's weight.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> u64 {
        match *self {
            Weights::One => 1,
            Weights::Uniform { lo, hi } => rng.u64(lo..=hi),
        }
    }
}

/// A whole load pattern: phases in time order, the first starting at 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Phases, sorted by `from_s`.
    pub phases: Vec<Phase>,
}

impl Load {
    /// One phase for the whole run.
    pub fn steady(rate: f64, spread: Spread) -> Load {
        Load { phases: vec![Phase { from_s: 0.0, rate, spread }] }
    }

    /// `before` until `at_s`, then `after`.
    pub fn step(before: f64, at_s: f64, after: f64, spread_after: Spread) -> Load {
        Load {
            phases: vec![
                Phase { from_s: 0.0, rate: before, spread: Spread::Uniform },
                Phase { from_s: at_s, rate: after, spread: spread_after },
            ],
        }
    }

    /// `base`, with `peak` between `from_s` and `from_s + len_s`.
    pub fn spike(base: f64, from_s: f64, len_s: f64, peak: f64) -> Load {
        Load {
            phases: vec![
                Phase { from_s: 0.0, rate: base, spread: Spread::Uniform },
                Phase { from_s, rate: peak, spread: Spread::Uniform },
                Phase { from_s: from_s + len_s, rate: base, spread: Spread::Uniform },
            ],
        }
    }

    /// The phase in force at `t` seconds.
    pub fn phase_at(&self, t: f64) -> &Phase {
        let i = self.phases.partition_point(|p| p.from_s <= t);
        &self.phases[i.saturating_sub(1)]
    }

    /// Start of the next phase after `t`, if any.
    pub fn next_change(&self, t: f64) -> Option<f64> {
        self.phases.iter().map(|p| p.from_s).find(|&s| s > t)
    }

    /// Offered rate at `t`, multiple of the limit.
    pub fn rate_at(&self, t: f64) -> f64 {
        self.phase_at(t).rate
    }
}

/// Draws request times (a Poisson process at the phase's rate) and the host of each.
pub(crate) struct Arrivals<'a> {
    load: &'a Load,
    /// Requests per second per unit of `Phase::rate`.
    per_unit: f64,
    hosts: usize,
    t: f64,
    sparse_second: Option<u64>,
    active: Vec<usize>,
}

impl<'a> Arrivals<'a> {
    pub fn new(load: &'a Load, limit: f64, weights: Weights, hosts: usize) -> Self {
        Arrivals {
            load,
            per_unit: limit / weights.mean(),
            hosts,
            t: 0.0,
            sparse_second: None,
            active: Vec::new(),
        }
    }

    /// The next request after the previous one: (time in seconds, host).
    pub fn next(&mut self, rng: &mut fastrand::Rng) -> (f64, usize) {
        loop {
            let rate = self.load.rate_at(self.t) * self.per_unit;
            let change = self.load.next_change(self.t);
            if rate <= 0.0 {
                match change {
                    Some(c) => {
                        self.t = c;
                        continue;
                    }
                    None => return (f64::INFINITY, 0),
                }
            }
            // 1 - U is in (0, 1]: ln never sees 0.
            let gap = -(1.0 - rng.f64()).ln() / rate;
            match change {
                // Memoryless: restarting the draw at the boundary keeps it a Poisson process.
                Some(c) if self.t + gap >= c => self.t = c,
                _ => {
                    self.t += gap;
                    let host = self.host(rng);
                    return (self.t, host);
                }
            }
        }
    }

    fn host(&mut self, rng: &mut fastrand::Rng) -> usize {
        match self.load.phase_at(self.t).spread {
            Spread::Uniform => rng.usize(..self.hosts),
            Spread::Hot { share } => {
                if rng.f64() < share {
                    0
                } else {
                    rng.usize(..self.hosts)
                }
            }
            Spread::Sparse { fraction } => {
                let sec = self.t as u64;
                if self.sparse_second != Some(sec) {
                    self.sparse_second = Some(sec);
                    let mut all: Vec<usize> = (0..self.hosts).collect();
                    rng.shuffle(&mut all);
                    let k = ((self.hosts as f64 * fraction).round() as usize).clamp(1, self.hosts);
                    all.truncate(k);
                    self.active = all;
                }
                self.active[rng.usize(..self.active.len())]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_follow_the_phase_rates() {
        let load = Load::step(1.0, 5.0, 3.0, Spread::Uniform);
        let mut a = Arrivals::new(&load, 1000.0, Weights::One, 10);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut per_s = [0u32; 10];
        loop {
            let (t, h) = a.next(&mut rng);
            if t >= 10.0 {
                break;
            }
            assert!(h < 10);
            per_s[t as usize] += 1;
        }
        let before: u32 = per_s[..5].iter().sum();
        let after: u32 = per_s[5..].iter().sum();
        assert!((before as f64 / 5000.0 - 1.0).abs() < 0.05, "{before}");
        assert!((after as f64 / 15000.0 - 1.0).abs() < 0.05, "{after}");
    }

    #[test]
    fn sparse_leaves_the_expected_hosts_idle_and_changes_them() {
        let load = Load::steady(0.1, Spread::Sparse { fraction: 1.0 / 3.0 });
        let mut a = Arrivals::new(&load, 1000.0, Weights::One, 300);
        let mut rng = fastrand::Rng::with_seed(3);
        let mut seen: Vec<std::collections::HashSet<usize>> = vec![Default::default(); 3];
        loop {
            let (t, h) = a.next(&mut rng);
            if t >= 3.0 {
                break;
            }
            seen[t as usize].insert(h);
        }
        for s in &seen {
            assert!(s.len() <= 100, "{} hosts active in one second", s.len());
        }
        assert_ne!(seen[0], seen[1]);
    }
}
