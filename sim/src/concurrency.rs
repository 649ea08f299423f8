//! Concurrency quotas on the virtual clock: hosts admit requests under the shares of `C`
//! their root replicas grant (the real [`yarl_core::concurrency`] code on both sides), and
//! each request holds its slot for a set time.
//!
//! Each host syncs with every root once per interval (its own phase); a report reaches its
//! root after half a round trip and the answer comes back after the other half. The agent
//! republishes its shares every 10 ms, as the nginx module's does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use yarl_core::concurrency::{replica_part, Due, Escrow, Grant, HostShares, PermitWords, Report};

const NS: f64 = 1e9;
const POLL_NS: u64 = 10_000_000;
const SAMPLE_NS: u64 = 10_000_000;

/// How the hosts decide.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Shares of `C` from the roots, under leases.
    Escrow {
        /// After applying a smaller share, report to that root again at once, so the
        /// root can hand what was given back to another host without waiting a round.
        early_ack: bool,
    },
    /// Each host admits `C / hosts` on its own (what a per-node limit such as nginx's
    /// `limit_conn` set to a fixed split gives).
    StaticSplit,
    /// One exact counter of `C` every host asks on every request (a central server or
    /// Redis, with its round trip not counted): the reference.
    Central,
}

/// One run.
#[derive(Clone, Debug)]
pub struct ConcScenario {
    /// Seed of the arrivals and the network's jitter.
    pub seed: u64,
    /// Hosts.
    pub hosts: usize,
    /// Root replicas of the counter's shard (each owns its part of `C`).
    pub roots: u32,
    /// `C`.
    pub capacity: u32,
    /// How long each request holds its slot, s.
    pub duration_s: f64,
    /// Offered concurrency as a multiple of `C` (arrivals at `offered * C / duration`).
    pub offered: f64,
    /// Sync interval, s.
    pub interval_s: f64,
    /// The lease, in intervals.
    pub lease_intervals: f64,
    /// Round trip to a root, s (each half jittered by up to 50 %).
    pub rtt_s: f64,
    /// Length of the run, s.
    pub seconds: f64,
    /// Each host's part of the traffic (relative weights).
    pub weights: Vec<f64>,
    /// At this time (s) the weights become these.
    pub shift: Option<(f64, Vec<f64>)>,
    /// At this time (s) this host dies: its requests die with it and it syncs no more.
    pub kill: Option<(f64, usize)>,
}

impl ConcScenario {
    /// 50 hosts, 2 roots, `C` = 50, requests of 200 ms, 4x the concurrency offered evenly,
    /// 1 s sync, a lease of 3 intervals, 2 ms round trips, 60 s.
    pub fn base() -> Self {
        Self {
            seed: 20_261_126,
            hosts: 50,
            roots: 2,
            capacity: 50,
            duration_s: 0.2,
            offered: 4.0,
            interval_s: 1.0,
            lease_intervals: 3.0,
            rtt_s: 0.002,
            seconds: 60.0,
            weights: vec![1.0; 50],
            shift: None,
            kill: None,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct ConcResult {
    /// (time s, in flight across the cluster) every 10 ms.
    pub samples: Vec<(f64, u32)>,
    /// (time s, in flight on the hosts the traffic moved to) every 10 ms, with a shift.
    pub target_samples: Vec<(f64, u32)>,
    /// (time s, the shares those hosts hold together) every 10 ms, with a shift.
    pub target_shares: Vec<(f64, u32)>,
    /// Requests admitted and refused.
    pub admitted: u64,
    /// Requests refused.
    pub refused: u64,
    /// Reports the roots took (regular, early and releases), per host and second.
    pub reports: u64,
}

impl ConcResult {
    /// The most in flight at once from `from_s` on.
    pub fn max(&self, from_s: f64) -> u32 {
        self.samples.iter().filter(|s| s.0 >= from_s).map(|s| s.1).max().unwrap_or(0)
    }

    /// Mean in flight over [`from_s`, `to_s`) as a fraction of `c`.
    pub fn utilisation(&self, from_s: f64, to_s: f64, c: u32) -> f64 {
        let v: Vec<u32> =
            self.samples.iter().filter(|s| s.0 >= from_s && s.0 < to_s).map(|s| s.1).collect();
        v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64 / f64::from(c)
    }

    /// Seconds from `at_s` until `series` first reaches `level`.
    pub fn time_to(series: &[(f64, u32)], at_s: f64, level: f64) -> Option<f64> {
        series.iter().find(|s| s.0 >= at_s && f64::from(s.1) >= level).map(|s| s.0 - at_s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Sample,
    Arrival,
    End { host: usize, life: u32 },
    Round { host: usize, early: bool },
    Ack { host: usize, root: usize },
    AtRoot { host: usize, root: usize, sent: u64, id: usize },
    Answer { host: usize, root: usize, sent: u64, share: u32 },
    Poll { host: usize },
}

struct Host {
    permits: PermitWords,
    book: HostShares,
    seq: Vec<u64>,
    /// The last round's (demand, refused): an early acknowledgement repeats them, so it
    /// does not read as a drop in demand.
    last: (u32, u32),
    alive: bool,
    /// Requests of an earlier life end with it (a dead host's requests die with it).
    life: u32,
    fixed: u32,
    /// In flight on the central counter, in [`Mode::Central`].
    central: u32,
}

impl Host {
    /// The next report to `root` at `t`, with the last round's demand.
    fn report_to(&mut self, root: usize, t: u64) -> Report {
        self.seq[root] += 1;
        let (demand, refused) = self.last;
        self.book.report(root, t, self.seq[root], self.permits.view(), demand, refused)
    }
}

/// Runs `s` under `mode`.
pub fn run_concurrency(s: &ConcScenario, mode: Mode) -> ConcResult {
    let mut rng = fastrand::Rng::with_seed(s.seed);
    let lease_ns = (s.lease_intervals * s.interval_s * NS) as u64;
    let interval_ns = (s.interval_s * NS) as u64;
    let end_ns = (s.seconds * NS) as u64;
    let mut roots: Vec<Escrow> = (0..s.roots)
        .map(|i| Escrow::new(s.capacity, replica_part(s.capacity, i, s.roots), lease_ns, 1024))
        .collect();
    let mut hosts: Vec<Host> = (0..s.hosts)
        .map(|i| Host {
            permits: PermitWords::default(),
            book: HostShares::new(s.roots as usize, 0),
            seq: vec![0; s.roots as usize],
            last: (0, 0),
            alive: true,
            life: 0,
            fixed: replica_part(s.capacity, i as u32, s.hosts as u32),
            central: 0,
        })
        .collect();
    // The central counter, and what each host runs of it (a dead host's requests end).
    let central = PermitWords::default();
    central.view().publish(s.capacity, u64::MAX / 2);
    if mode == Mode::StaticSplit {
        for h in &hosts {
            h.permits.view().publish(h.fixed, u64::MAX / 2);
        }
    }
    let mut q: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut serial = 0u64;
    let mut push = |q: &mut BinaryHeap<_>, t: u64, e: Event| {
        serial += 1;
        q.push(Reverse((t, serial, e)));
    };
    let rate = s.offered * f64::from(s.capacity) / s.duration_s;
    let half = |rng: &mut fastrand::Rng| (s.rtt_s / 2.0 * (0.5 + rng.f64()) * NS) as u64;
    push(&mut q, 0, Event::Sample);
    push(&mut q, 0, Event::Arrival);
    if let Mode::Escrow { .. } = mode {
        for h in 0..s.hosts {
            push(
                &mut q,
                (rng.f64() * interval_ns as f64) as u64,
                Event::Round { host: h, early: false },
            );
            push(&mut q, rng.u64(0..POLL_NS), Event::Poll { host: h });
        }
    }
    let cumulative = |w: &[f64]| -> Vec<f64> {
        w.iter()
            .scan(0.0, |acc, &x| {
                *acc += x;
                Some(*acc)
            })
            .collect()
    };
    let mut weights = cumulative(&s.weights);
    let shift_ns = s.shift.as_ref().map(|(at, _)| (at * NS) as u64);
    let shifted: Vec<usize> = s.shift.as_ref().map_or(Vec::new(), |(_, w)| {
        w.iter().enumerate().filter(|(_, &x)| x > 0.0).map(|(i, _)| i).collect()
    });
    let mut shifted_in = false;
    // A starving host reports early at most once between two rounds: at most twice the
    // sync load, and a round sooner for a share to reach it.
    let early_gap = interval_ns / 2;
    let kill_ns = s.kill.map(|(at, h)| ((at * NS) as u64, h));
    let mut out = ConcResult::default();
    // Reports in flight to their roots, by the index their event carries.
    let mut pending: Vec<Report> = Vec::new();
    while let Some(Reverse((t, _, e))) = q.pop() {
        if t > end_ns {
            break;
        }
        if let Some((_, w)) = s.shift.as_ref().filter(|_| shift_ns.is_some_and(|x| t >= x)) {
            if !shifted_in {
                weights = cumulative(w);
                shifted_in = true;
            }
        }
        if let Some((at, h)) = kill_ns {
            if t >= at && hosts[h].alive {
                hosts[h].alive = false;
                hosts[h].life += 1;
                hosts[h].permits = PermitWords::default();
                central.view().release_many(hosts[h].central);
                hosts[h].central = 0;
            }
        }
        match e {
            Event::Sample => {
                let total = if mode == Mode::Central {
                    central.view().in_flight()
                } else {
                    hosts.iter().filter(|h| h.alive).map(|h| h.permits.view().in_flight()).sum()
                };
                out.samples.push((t as f64 / NS, total));
                if !shifted.is_empty() {
                    let on: u32 = shifted
                        .iter()
                        .map(|&i| {
                            if mode == Mode::Central {
                                hosts[i].central
                            } else {
                                hosts[i].permits.view().in_flight()
                            }
                        })
                        .sum();
                    out.target_samples.push((t as f64 / NS, on));
                    let held: u32 = shifted.iter().map(|&i| hosts[i].permits.view().share(t)).sum();
                    out.target_shares.push((t as f64 / NS, held));
                }
                push(&mut q, t + SAMPLE_NS, Event::Sample);
            }
            Event::Arrival => {
                let total = *weights.last().unwrap_or(&1.0);
                let x = rng.f64() * total;
                let host = weights.partition_point(|&c| c <= x).min(s.hosts - 1);
                let h = &hosts[host];
                if h.alive {
                    let permits =
                        if mode == Mode::Central { central.view() } else { h.permits.view() };
                    if permits.acquire(t) {
                        out.admitted += 1;
                        let life = h.life;
                        if mode == Mode::Central {
                            hosts[host].central += 1;
                        }
                        push(&mut q, t + (s.duration_s * NS) as u64, Event::End { host, life });
                    } else {
                        out.refused += 1;
                    }
                }
                let gap = -(1.0 - rng.f64()).ln() / rate;
                push(&mut q, t + (gap * NS) as u64 + 1, Event::Arrival);
            }
            Event::End { host, life } => {
                if hosts[host].life == life && hosts[host].alive {
                    if mode == Mode::Central {
                        central.view().release();
                        hosts[host].central -= 1;
                    } else {
                        hosts[host].permits.view().release();
                    }
                }
            }
            Event::Round { host, early } => {
                if !hosts[host].alive {
                    continue;
                }
                let h = &mut hosts[host];
                h.last = h.book.round(t, h.permits.view());
                for root in 0..s.roots as usize {
                    pending.push(h.report_to(root, t));
                    let (d, id) = (half(&mut rng), pending.len() - 1);
                    push(&mut q, t + d, Event::AtRoot { host, root, sent: t, id });
                }
                if !early {
                    push(&mut q, t + interval_ns, Event::Round { host, early });
                }
            }
            Event::Ack { host, root } => {
                if !hosts[host].alive {
                    continue;
                }
                pending.push(hosts[host].report_to(root, t));
                let (d, id) = (half(&mut rng), pending.len() - 1);
                push(&mut q, t + d, Event::AtRoot { host, root, sent: t, id });
            }
            Event::AtRoot { host, root, sent, id } => {
                if !hosts[host].alive {
                    continue;
                }
                let r: Report = pending[id];
                out.reports += 1;
                let g = roots[root].report(host as u64, t, &r);
                let d = half(&mut rng);
                push(&mut q, t + d, Event::Answer { host, root, sent, share: g.share });
            }
            Event::Answer { host, root, sent, share } => {
                let h = &mut hosts[host];
                if !h.alive {
                    continue;
                }
                let in_flight = h.permits.view().in_flight();
                let shrank = h.book.apply(root, Grant { share, lease_ns }, sent, t, in_flight);
                h.book.poll(t, h.permits.view(), u64::MAX);
                if shrank && mode == (Mode::Escrow { early_ack: true }) {
                    push(&mut q, t, Event::Ack { host, root });
                }
            }
            Event::Poll { host } => {
                let h = &mut hosts[host];
                if h.alive {
                    let due = h.book.poll(t, h.permits.view(), early_gap);
                    if mode == (Mode::Escrow { early_ack: true }) {
                        match due {
                            Due::Release => {
                                for root in 0..s.roots as usize {
                                    push(&mut q, t, Event::Ack { host, root });
                                }
                            }
                            Due::Starving => push(&mut q, t, Event::Round { host, early: true }),
                            Due::No => {}
                        }
                    }
                    push(&mut q, t + POLL_NS, Event::Poll { host });
                }
            }
        }
    }
    out
}

/// When something happens in a case, s.
pub const EVENT_S: f64 = 30.0;

/// The cases of the report: (name, scenario).
pub fn cases() -> Vec<(&'static str, ConcScenario)> {
    let b = ConcScenario::base;
    let n = b().hosts;
    let only =
        |pick: &dyn Fn(usize) -> bool| (0..n).map(|i| f64::from(u8::from(pick(i)))).collect();
    vec![
        ("even: 4x offered on every host", b()),
        (
            "skewed: 5 hosts take 98 % of it",
            ConcScenario {
                weights: (0..n).map(|i| if i < 5 { 16.0 } else { 0.2 }).collect(),
                ..b()
            },
        ),
        (
            "moved: all of it from 25 hosts to the other 25 at 30 s",
            ConcScenario {
                weights: only(&|i| i < n / 2),
                shift: Some((EVENT_S, only(&|i| i >= n / 2))),
                ..b()
            },
        ),
        (
            "killed: the host with 98 % of it dies at 30 s, its traffic spreads",
            ConcScenario {
                weights: (0..n).map(|i| if i == 0 { 49.0 } else { 1.0 / 49.0 }).collect(),
                shift: Some((EVENT_S, only(&|i| i > 0))),
                kill: Some((EVENT_S, 0)),
                ..b()
            },
        ),
        (
            "2 hosts, moved from one to the other at 30 s",
            ConcScenario {
                hosts: 2,
                weights: vec![1.0, 0.0],
                shift: Some((EVENT_S, vec![0.0, 1.0])),
                ..b()
            },
        ),
        (
            "2 hosts, the busier (4:1) dies at 30 s",
            ConcScenario {
                hosts: 2,
                weights: vec![4.0, 1.0],
                shift: Some((EVENT_S, vec![0.0, 1.0])),
                kill: Some((EVENT_S, 0)),
                ..b()
            },
        ),
    ]
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct ConcRow {
    /// The most in flight at once in the whole run.
    pub max: u32,
    /// Mean in flight / `C` before the event (5 s to 30 s), or over 5 s to the end.
    pub before: f64,
    /// Mean in flight / `C` from 5 s after the event to the end.
    pub after: Option<f64>,
    /// Seconds from the event until the hosts the traffic went to hold 0.9 `C` of shares.
    pub shares_09: Option<f64>,
    /// Seconds from the event until they run 0.9 `C`.
    pub runs_09: Option<f64>,
    /// Reports each root took per host and second.
    pub reports: f64,
}

/// Runs case `s` under `mode`.
pub fn evaluate(s: &ConcScenario, mode: Mode) -> ConcRow {
    let r = run_concurrency(s, mode);
    let event = s.shift.is_some() || s.kill.is_some();
    let level = 0.9 * f64::from(s.capacity);
    ConcRow {
        max: r.max(0.0),
        before: r.utilisation(5.0, if event { EVENT_S } else { s.seconds }, s.capacity),
        after: event.then(|| r.utilisation(EVENT_S + 5.0, s.seconds, s.capacity)),
        shares_09: ConcResult::time_to(&r.target_shares, EVENT_S, level),
        runs_09: ConcResult::time_to(&r.target_samples, EVENT_S, level),
        reports: r.reports as f64 / s.hosts as f64 / s.seconds / f64::from(s.roots),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_never_exceed_c_and_follow_the_traffic() {
        let s = ConcScenario {
            hosts: 2,
            seconds: 12.0,
            weights: vec![1.0, 0.0],
            shift: Some((6.0, vec![0.0, 1.0])),
            ..ConcScenario::base()
        };
        let r = run_concurrency(&s, Mode::Escrow { early_ack: true });
        assert!(r.max(0.0) <= s.capacity);
        assert!(r.utilisation(2.0, 6.0, s.capacity) > 0.9, "{}", r.utilisation(2.0, 6.0, 50));
        let moved = ConcResult::time_to(&r.target_shares, 6.0, 45.0).expect("the share moved");
        assert!(moved <= 2.0 * s.interval_s, "{moved} s");
        // A fixed split cannot follow it.
        let r = run_concurrency(&s, Mode::StaticSplit);
        assert_eq!(ConcResult::time_to(&r.target_samples, 6.0, 45.0), None);
    }

    #[test]
    fn a_dead_hosts_share_comes_back_within_the_lease_and_a_round() {
        let s = ConcScenario {
            hosts: 2,
            seconds: 12.0,
            weights: vec![4.0, 1.0],
            shift: Some((6.0, vec![0.0, 1.0])),
            kill: Some((6.0, 0)),
            ..ConcScenario::base()
        };
        let r = run_concurrency(&s, Mode::Escrow { early_ack: true });
        let back = ConcResult::time_to(&r.target_shares, 6.0, 50.0).expect("the share came back");
        assert!(back <= (s.lease_intervals + 1.0) * s.interval_s, "{back} s");
        assert!(r.max(0.0) <= s.capacity);
    }
}
