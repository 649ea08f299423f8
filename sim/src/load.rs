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

/// What a client whose request was refused does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retry {
    /// Gives up: the offered traffic is the same whatever is refused.
    Never,
    /// Sends the request again `after_s` seconds after each refusal, until it passes.
    After {
        /// Seconds from a refusal to the retry.
        after_s: f64,
    },
    /// Sends it again when the calendar window of `window_s` seconds that refused it ends
    /// (windows counted from 0: a fixed window's reset, which its `X-RateLimit-Reset` header
    /// announces), at a uniform moment within `spread_s` after that boundary, and again at
    /// each later boundary until it passes.
    AtWindowEnd {
        /// The window, seconds.
        window_s: f64,
        /// The retries of one boundary spread uniformly over this many seconds after it.
        spread_s: f64,
    },
}

impl Retry {
    /// When a request refused at `t` (seconds) comes back, if it does.
    pub fn after(&self, t: f64, rng: &mut fastrand::Rng) -> Option<f64> {
        match *self {
            Retry::Never => None,
            Retry::After { after_s } => Some(t + after_s),
            Retry::AtWindowEnd { window_s, spread_s } => {
                Some(((t / window_s).floor() + 1.0) * window_s + rng.f64() * spread_s)
            }
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

/// Traffic over many keys, each its own quota with the scenario's limit and bursts (a limit
/// per client: per API key, per IP).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeySpace {
    /// Keys (quotas `k0`, `k1`, …).
    pub keys: usize,
    /// When each key sends.
    pub pattern: KeyPattern,
    /// Which host a key's request lands on.
    pub hosts: KeyHosts,
    /// Requests before this time (s) are decided but not counted in the results.
    pub from_s: f64,
}

/// When each key of a [`KeySpace`] sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyPattern {
    /// Quiet for a uniform time in `idle_s`, then a burst at `peak` × the limit for a
    /// uniform time in `burst_s` (Poisson within it), and again; the first burst of each
    /// key starts within its first quiet time.
    QuietThenBurst {
        /// Range of the quiet times, s.
        idle_s: (f64, f64),
        /// Range of the burst lengths, s.
        burst_s: (f64, f64),
        /// Rate during a burst, times the key's limit.
        peak: f64,
    },
    /// Every key sends all the time, key `k` (from 0) at `top / (k + 1)^exponent` times
    /// its limit (Zipf's law: a few keys are hot, most are cold). One "burst" per key, the
    /// whole run: its number is the key's.
    Zipf {
        /// Key 0's rate, times its limit.
        top: f64,
        /// How fast rates fall with rank (1: Zipf's classic).
        exponent: f64,
        /// When the keys start sending (s): after the limiters' first rounds, as on a
        /// cluster that has been up for a moment (a cluster restarted under full load is
        /// another matter: its limiters know nothing of each other yet).
        start_s: f64,
    },
}

impl KeySpace {
    /// Key `k`'s rate while it sends, times its limit.
    pub fn pattern_rate(&self, k: usize) -> f64 {
        self.pattern.rate(k)
    }
}

impl KeyPattern {
    /// Key `k`'s rate (times its limit) while it sends.
    fn rate(&self, k: usize) -> f64 {
        match *self {
            KeyPattern::QuietThenBurst { peak, .. } => peak,
            KeyPattern::Zipf { top, exponent, .. } => top / ((k + 1) as f64).powf(exponent),
        }
    }
}

/// Which host a key's request lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHosts {
    /// Any host, at random (a load balancer spreading every request).
    Random,
    /// Always the same host per key (a client kept on one host, e.g. by a keep-alive
    /// connection or a consistent hash).
    Sticky,
}

/// One key's request: its time (s), host, key, and which burst it belongs to (numbered over
/// all keys in the order bursts start).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyArrival {
    pub t: f64,
    pub host: usize,
    pub key: usize,
    pub burst: usize,
}

/// The arrivals of a [`KeySpace`] in time order.
pub struct KeyArrivals {
    space: KeySpace,
    /// Requests per second per unit of a key's rate (its limit, in requests).
    per_unit: f64,
    hosts: usize,
    /// (next arrival, key), earliest first.
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>>,
    /// Per key: the current burst's end (s) and number.
    bursts: Vec<(f64, usize)>,
    next_burst: usize,
}

/// Times in the heap: whole nanoseconds, so they order exactly.
fn to_ns(t: f64) -> u64 {
    (t * 1e9) as u64
}

impl KeyArrivals {
    pub fn new(
        space: KeySpace,
        limit: f64,
        weights: Weights,
        hosts: usize,
        rng: &mut fastrand::Rng,
    ) -> Self {
        let mut a = KeyArrivals {
            space,
            per_unit: limit / weights.mean(),
            hosts,
            heap: Default::default(),
            bursts: vec![(0.0, 0); space.keys],
            next_burst: 0,
        };
        for key in 0..space.keys {
            let start = match space.pattern {
                KeyPattern::QuietThenBurst { idle_s, .. } => rng.f64() * idle_s.1,
                KeyPattern::Zipf { start_s, .. } => start_s,
            };
            a.start_burst(key, start, rng);
        }
        a
    }

    /// Requests per second of `key` while it sends.
    fn rate(&self, key: usize) -> f64 {
        self.space.pattern.rate(key) * self.per_unit
    }

    fn start_burst(&mut self, key: usize, start: f64, rng: &mut fastrand::Rng) {
        let len = match self.space.pattern {
            KeyPattern::QuietThenBurst { burst_s, .. } => {
                burst_s.0 + rng.f64() * (burst_s.1 - burst_s.0)
            }
            KeyPattern::Zipf { .. } => f64::INFINITY,
        };
        self.bursts[key] = (start + len, self.next_burst);
        self.next_burst += 1;
        let first = start + -(1.0 - rng.f64()).ln() / self.rate(key);
        self.heap.push(std::cmp::Reverse((to_ns(first), key)));
    }

    /// The next request of any key.
    pub fn next(&mut self, rng: &mut fastrand::Rng) -> KeyArrival {
        loop {
            let std::cmp::Reverse((at, key)) = self.heap.pop().expect("every key has a next");
            let t = at as f64 * 1e-9;
            let (end, burst) = self.bursts[key];
            if t >= end {
                let KeyPattern::QuietThenBurst { idle_s, .. } = self.space.pattern else {
                    continue;
                };
                let quiet = idle_s.0 + rng.f64() * (idle_s.1 - idle_s.0);
                self.start_burst(key, end + quiet, rng);
                continue;
            }
            let gap = -(1.0 - rng.f64()).ln() / self.rate(key);
            self.heap.push(std::cmp::Reverse((to_ns(t + gap), key)));
            let host = match self.space.hosts {
                KeyHosts::Random => rng.usize(..self.hosts),
                KeyHosts::Sticky => key % self.hosts,
            };
            return KeyArrival { t, host, key, burst };
        }
    }

    /// Bursts started so far.
    pub fn bursts(&self) -> usize {
        self.next_burst
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
    fn quiet_keys_burst_at_their_peak_and_rest_in_between() {
        let space = KeySpace {
            keys: 20,
            pattern: KeyPattern::QuietThenBurst {
                idle_s: (30.0, 60.0),
                burst_s: (2.0, 4.0),
                peak: 10.0,
            },
            hosts: KeyHosts::Sticky,
            from_s: 0.0,
        };
        let mut rng = fastrand::Rng::with_seed(5);
        let mut a = KeyArrivals::new(space, 10.0, Weights::One, 4, &mut rng);
        let mut per_burst: std::collections::HashMap<usize, (usize, f64, f64, usize)> =
            Default::default();
        let mut last = 0.0;
        loop {
            let r = a.next(&mut rng);
            if r.t >= 600.0 {
                break;
            }
            assert!(r.t >= last, "in time order");
            last = r.t;
            assert_eq!(r.host, r.key % 4, "sticky");
            let e = per_burst.entry(r.burst).or_insert((r.key, r.t, r.t, 0));
            assert_eq!(e.0, r.key, "a burst is one key's");
            e.2 = r.t;
            e.3 += 1;
        }
        // 100 requests/s for 2-4 s: about 300 per burst; bursts of one key 30-60 s apart.
        let sizes: Vec<usize> = per_burst.values().map(|b| b.3).collect();
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        assert!((250.0..350.0).contains(&mean), "{mean} requests per burst");
        assert!(per_burst.values().all(|b| b.2 - b.1 < 4.0), "bursts end");
        let bursts_per_key = per_burst.len() as f64 / 20.0;
        assert!((9.0..16.0).contains(&bursts_per_key), "{bursts_per_key} bursts per key in 600 s");
    }

    #[test]
    fn retries_come_back_after_their_delay_or_at_the_next_window_end() {
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(Retry::Never.after(5.0, &mut rng), None);
        assert_eq!(Retry::After { after_s: 3600.0 }.after(5.0, &mut rng), Some(3605.0));
        let midnight = Retry::AtWindowEnd { window_s: 86_400.0, spread_s: 60.0 };
        for t in [0.0, 9.0 * 3600.0, 86_399.9] {
            let r = midnight.after(t, &mut rng).expect("retries");
            assert!((86_400.0..86_460.0).contains(&r), "{t} -> {r}");
        }
        // Refused again just after midnight: back the next midnight, not at once.
        let r = midnight.after(86_400.5, &mut rng).expect("retries");
        assert!((172_800.0..172_860.0).contains(&r), "{r}");
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
