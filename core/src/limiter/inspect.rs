//! Read-only views of the limiter for stats pages and metrics, and the lease that elects one
//! sync agent among the processes sharing a block.

use super::keys::{TSTAT_EVICTED, TSTAT_KEYS, TSTAT_REFUSED};
use super::{Limiter, QuotaInfo, TemplateKeys, MAX_CHAIN};
use crate::quota::Epoch;
use crate::ratelimit::{Level, Partition};
use crate::sync::RootStatus;
use crate::units::{milli_to_units, Rate, MILLI};
use crate::zone::roots::{self, LATENCY_BUCKETS_US};
use crate::zone::slot::{ID, LIMIT, LOW, REJECTS};
use crate::zone::{
    self, hdr, ZoneUsage, AUX_COUNTERS, AUX_LANES, RECENT_REJECTIONS, TEMPLATE_STATS,
};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The limiter's state as a whole, readable by any handle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZoneStatus {
    /// The limiter's id on the wire (hex), the same for every handle of a block and kept as
    /// long as the block is.
    pub limiter_id: String,
    /// How many times the block was prepared (an nginx reload reusing the zone adds one).
    pub generation: u64,
    /// Highest quota epoch held.
    pub epoch: Epoch,
    /// Requests rejected so far.
    pub rejections: u64,
    /// Sync rounds completed, by any agent.
    pub rounds: u64,
    /// Of those, rounds started early because a quota's traffic surged on this host.
    pub early_rounds: u64,
    /// Whether the last round reached at least one root.
    pub cluster_fresh: bool,
    /// Limiters the roots last said they heard from lately (0 before any answer): a counter
    /// no root has reported yet counts this many times what this limiter counted.
    pub cluster_limiters: u64,
    /// Clock time (ns) the last round ended; 0 before the first.
    pub last_round_end_ns: u64,
    /// The sync agent's token (nginx: its worker's pid), if one holds the lease.
    pub agent: Option<u32>,
    /// Milliseconds since the agent last renewed its lease.
    pub agent_age_ms: u64,
    /// How many times an agent took the lease.
    pub agent_starts: u64,
    /// Rounds an agent skipped because another live process was inside the write section
    /// ([`crate::WriteSection`]).
    pub write_waits: u64,
    /// Write sections left after another process had entered meanwhile: two writers at
    /// once; 0 unless something is wrong.
    pub write_overlaps: u64,
    /// Memory use.
    pub usage: ZoneUsage,
}

impl Limiter {
    /// Whether a quota called `name` is held (an index lookup, nothing else).
    pub fn contains<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> bool {
        self.find(name.as_ref()).is_some()
    }

    /// The quota called `name`, or the key of that name under a template, with its
    /// estimated fill now (a key seen nowhere yet is not created).
    pub fn quota<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> Option<QuotaInfo> {
        let (s, slot) = self.lookup(name.as_ref())?;
        let now = self.clock.now_nanos();
        let fresh = self.hdr(hdr::FRESH).load(Relaxed) != 0;
        let parent = match slot.parent() {
            0 => None,
            p => Some(self.slot_name(p - 1)),
        };
        let rate = Rate::from_word(slot.get(LIMIT)).unwrap_or_default();
        Some(QuotaInfo {
            id: slot.get(ID),
            epoch: if self.is_key_slot(s) { 0 } else { self.cold(s).0.load(Relaxed) },
            template: self.template_of_key(s).map(|t| self.slot_name(t)),
            limit: milli_to_units(rate.milli()),
            window: rate.window_secs(),
            low_burst: milli_to_units(slot.get(LOW)),
            high_burst: milli_to_units(slot.high_burst()),
            dry_run: slot.shadow(),
            parent,
            fill: slot.estimate(now, fresh, self.horizon_at(now), self.peers_cell()) / MILLI as f64,
            rejections: slot.get(REJECTS) >> 32,
        })
    }

    /// The chain of `name` (the quota, then its ancestors) with each level's estimated fill
    /// now: what the `RateLimit` header fields are made of ([`crate::ratelimit`]). Empty
    /// for an unknown name.
    pub fn levels<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> Vec<Level> {
        let Some((first, mut slot)) = self.lookup(name.as_ref()) else { return Vec::new() };
        let now = self.clock.now_nanos();
        let fresh = self.hdr(hdr::FRESH).load(Relaxed) != 0;
        let horizon = self.horizon_at(now);
        let peers = self.peers_cell();
        let mut out = Vec::with_capacity(3);
        // A key is a partition of its template's policy (see `ratelimit`).
        let mut partition = self
            .template_of_key(first)
            .map(|t| Partition { template: self.slot_name(t), key: slot.get(ID) });
        let mut name = crate::quota::escape_name(name.as_ref());
        loop {
            let rate = Rate::from_word(slot.get(LIMIT)).unwrap_or_default();
            out.push(Level {
                name,
                limit: milli_to_units(rate.milli()),
                window: rate.window_secs(),
                low_burst: milli_to_units(slot.get(LOW)),
                high_burst: milli_to_units(slot.high_burst()),
                fill: slot.estimate(now, fresh, horizon, peers) / MILLI as f64,
                partition: partition.take(),
            });
            let p = slot.parent();
            if p == 0 || out.len() == MAX_CHAIN {
                return out;
            }
            match self.live_slot(p - 1) {
                Some(next) => {
                    name = self.slot_name(p - 1);
                    slot = next;
                }
                None => return out,
            }
        }
    }

    /// The `n` quotas with the most rejections within the last `window` seconds (from the
    /// ring of the latest 2,048 rejections), most first: (name, rejections in the window,
    /// rejections since the quota was loaded or last reset). A key's rejections are its
    /// template's: one row per template, whose count includes its keys'.
    pub fn top_rejections(&self, n: usize, window_secs: u64) -> Vec<(String, u64, u64)> {
        let now = self.clock.now_nanos() / 1_000_000_000;
        let ring = &self.words()[self.layout.recent..self.layout.recent + RECENT_REJECTIONS];
        let mut counts: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for cell in ring {
            let v = cell.load(Relaxed);
            let (slot, at) = ((v as u32).wrapping_sub(1), v >> 32);
            if v == 0 || now.saturating_sub(at) > window_secs {
                continue;
            }
            // A key slot taken by another key since counts for that key's template: the
            // ranking is approximate, the counts are not.
            let slot = match (self.is_key_slot(slot), self.template_of_key(slot)) {
                (false, _) => slot,
                (true, Some(t)) => t,
                (true, None) => continue,
            };
            *counts.entry(slot).or_default() += 1;
        }
        let mut ranked: Vec<(u32, u64)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .filter_map(|(s, recent)| {
                let slot = self.live_slot(s)?;
                Some((self.slot_name(s), recent, slot.get(REJECTS) >> 32))
            })
            .take(n)
            .collect()
    }

    /// Highest quota epoch applied.
    pub fn epoch(&self) -> Epoch {
        self.hdr(hdr::EPOCH).load(Relaxed)
    }

    /// Number of quotas held.
    pub fn quota_count(&self) -> u64 {
        self.hdr(hdr::QUOTAS).load(Relaxed)
    }

    /// Requests rejected so far (by every handle of the block).
    pub fn rejections(&self) -> u64 {
        self.hdr(hdr::REJECTIONS).load(Relaxed)
    }

    /// Whether the last sync round reached a root (extrapolation is on).
    pub fn cluster_fresh(&self) -> bool {
        self.hdr(hdr::FRESH).load(Relaxed) != 0
    }

    /// The limiter's id as logs, `yarl_stats` and metrics print it: the public half of
    /// its [wire id](Self::wire_id).
    pub fn limiter_id(&self) -> String {
        format!("{:016x}", self.hdr(hdr::LIMITER_ID).load(Relaxed))
    }

    /// The id its sync requests carry, which roots key its session by: the printed
    /// [`limiter_id`](Self::limiter_id) and a secret half never printed, so nobody who
    /// reads the printed one (a dashboard, a log line) can send batches as this limiter and
    /// make its real ones look like duplicates.
    pub fn wire_id(&self) -> String {
        format!(
            "{:016x}{:016x}",
            self.hdr(hdr::LIMITER_ID).load(Relaxed),
            self.hdr(hdr::LIMITER_KEY).load(Relaxed)
        )
    }

    /// How many times the block was prepared; see [`ZoneStatus::generation`].
    pub fn generation(&self) -> u64 {
        self.hdr(hdr::GENERATION).load(Acquire)
    }

    /// Memory use of the block.
    pub fn zone_usage(&self) -> ZoneUsage {
        zone::usage(self.words(), &self.layout)
    }

    /// The keys of each template counted apart (the first [`TEMPLATE_STATS`] the block
    /// held), then the others together if they have counted anything; lock-free reads.
    pub fn template_keys(&self) -> Vec<TemplateKeys> {
        let count = |e: usize| {
            let get = |what| self.template_count_at(e, what).load(Relaxed);
            (get(TSTAT_KEYS), get(TSTAT_EVICTED), get(TSTAT_REFUSED))
        };
        let mut out = Vec::new();
        for e in 0..TEMPLATE_STATS {
            let t = self.hdr(hdr::TSTAT_IDS + e).load(Acquire);
            let Some(s) = t.checked_sub(1).and_then(|t| self.live_slot(t as u32).map(|_| t)) else {
                continue;
            };
            let (keys, evictions, refused) = count(e);
            let template = Some(self.slot_name(s as u32));
            out.push(TemplateKeys { template, keys, evictions, refused });
        }
        let (keys, evictions, refused) = count(TEMPLATE_STATS);
        if keys + evictions + refused > 0 {
            out.push(TemplateKeys { template: None, keys, evictions, refused });
        }
        out
    }

    /// Bytes of the block in use plus this handle's own writer caches.
    pub fn memory_bytes(&self) -> usize {
        let own = match self.writer.try_lock() {
            Some(w) => Limiter::id_count(&w) * 9,
            None => 0,
        };
        self.zone_usage().bytes_used as usize + own
    }

    /// A snapshot of the whole state.
    pub fn zone_status(&self) -> ZoneStatus {
        let now = self.clock.now_nanos();
        let lease = self.agent_lease();
        ZoneStatus {
            limiter_id: self.limiter_id(),
            generation: self.generation(),
            epoch: self.epoch(),
            rejections: self.rejections(),
            rounds: self.hdr(hdr::ROUNDS).load(Relaxed),
            early_rounds: self.hdr(hdr::EARLY_ROUNDS).load(Relaxed),
            cluster_fresh: self.cluster_fresh(),
            cluster_limiters: self.peers(),
            last_round_end_ns: self.hdr(hdr::LAST_ROUND_END).load(Relaxed),
            agent: lease.holder(),
            agent_age_ms: lease.age_ms(now),
            agent_starts: self.hdr(hdr::AGENT_STARTS).load(Relaxed),
            write_waits: self.write_section().waits(),
            write_overlaps: self.write_section().overlaps(),
            usage: self.zone_usage(),
        }
    }

    /// Counter `i` (< [`zone::AUX_COUNTERS`]) of lane `lane` (< [`zone::AUX_LANES`]), for
    /// the embedder's own statistics: kept in the block, so shared by every handle and kept
    /// across reloads. Each writer (an nginx worker) adds to its own lane; readers sum the
    /// lanes ([`Limiter::aux_sum`]).
    pub fn aux_counter(&self, lane: usize, i: usize) -> Option<&AtomicU64> {
        (i < AUX_COUNTERS && lane < AUX_LANES).then(|| self.hdr(hdr::AUX + lane * AUX_COUNTERS + i))
    }

    /// Counter `i` summed over every lane.
    pub fn aux_sum(&self, i: usize) -> u64 {
        (0..AUX_LANES)
            .filter_map(|lane| self.aux_counter(lane, i))
            .fold(0u64, |a, c| a.wrapping_add(c.load(Relaxed)))
    }

    /// The state of the root at `url` as the sync agent last recorded it.
    pub fn root_status(&self, url: &str) -> Option<RootStatus> {
        let e = self.roots_table().find(url)?;
        let opt = |f: usize| Some(e.get(f)).filter(|&v| v != 0);
        let (hist, sum) = e.histogram();
        Some(RootStatus {
            url: url.to_owned(),
            ok: match e.get(roots::OK) {
                1 => Some(true),
                2 => Some(false),
                _ => None,
            },
            last_error: e.error(),
            last_attempt_ns: opt(roots::LAST_ATTEMPT),
            last_success_ns: opt(roots::LAST_SUCCESS),
            last_latency_us: (e.get(roots::SUCCESSES) > 0).then(|| e.get(roots::LATENCY_US)),
            successes: e.get(roots::SUCCESSES),
            failures: e.get(roots::FAILURES),
            consecutive_failures: u32::try_from(e.get(roots::CONSECUTIVE)).unwrap_or(u32::MAX),
            instance: opt(roots::INSTANCE),
            pending_batches: e.get(roots::PENDING) as usize,
            latency_buckets_us: LATENCY_BUCKETS_US.to_vec(),
            latency_counts: hist.to_vec(),
            latency_sum_us: sum,
        })
    }

    /// The lease that elects one sync agent among the handles of this block.
    pub fn agent_lease(&self) -> AgentLease<'_> {
        AgentLease { word: self.hdr(hdr::AGENT), starts: self.hdr(hdr::AGENT_STARTS) }
    }
}

/// The sync agent's lease: one word holding the holder's token (non-zero, e.g. a pid) and
/// the time of its last renewal in milliseconds (wrapping), changed only by compare-and-swap,
/// so two candidates can never both win.
#[derive(Debug, Clone, Copy)]
pub struct AgentLease<'a> {
    word: &'a AtomicU64,
    starts: &'a AtomicU64,
}

fn pack(holder: u32, now_ns: u64) -> u64 {
    u64::from(holder) << 32 | (now_ns / 1_000_000) as u32 as u64
}

impl AgentLease<'_> {
    /// The holder's token, if any.
    pub fn holder(&self) -> Option<u32> {
        Some((self.word.load(Acquire) >> 32) as u32).filter(|&h| h != 0)
    }

    /// Milliseconds since the holder last renewed (0 when free).
    pub fn age_ms(&self, now_ns: u64) -> u64 {
        let v = self.word.load(Acquire);
        if v >> 32 == 0 {
            return 0;
        }
        u64::from(((now_ns / 1_000_000) as u32).wrapping_sub(v as u32))
    }

    /// Takes the lease for `me` (non-zero) if it is free, not renewed for `stale_ns`, or its
    /// holder is no longer `alive` (nginx: the worker was killed). `true` if `me` holds it.
    pub fn try_acquire(
        &self,
        me: u32,
        now_ns: u64,
        stale_ns: u64,
        alive: impl FnOnce(u32) -> bool,
    ) -> bool {
        if me == 0 {
            return false;
        }
        let cur = self.word.load(Acquire);
        let holder = (cur >> 32) as u32;
        if holder == me {
            return self.renew(me, now_ns);
        }
        if holder != 0 {
            let age_ns =
                u64::from(((now_ns / 1_000_000) as u32).wrapping_sub(cur as u32)) * 1_000_000;
            if age_ns < stale_ns && alive(holder) {
                return false;
            }
        }
        let won = self.word.compare_exchange(cur, pack(me, now_ns), AcqRel, Acquire).is_ok();
        if won {
            self.starts.fetch_add(1, Relaxed);
        }
        won
    }

    /// Renews the lease; `false` if `me` does not hold it any more.
    pub fn renew(&self, me: u32, now_ns: u64) -> bool {
        let cur = self.word.load(Acquire);
        (cur >> 32) as u32 == me
            && me != 0
            && self.word.compare_exchange(cur, pack(me, now_ns), AcqRel, Acquire).is_ok()
    }

    /// Gives the lease up if `me` holds it.
    pub fn release(&self, me: u32) {
        let cur = self.word.load(Acquire);
        if (cur >> 32) as u32 == me {
            let _ = self.word.compare_exchange(cur, 0, AcqRel, Acquire);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn one_holder_stale_or_dead_holders_are_replaced() {
        let l = Limiter::builder().capacity(100).build();
        let lease = l.agent_lease();
        assert_eq!(lease.holder(), None);
        assert!(lease.try_acquire(7, 1000 * MS, 2000 * MS, |_| true));
        assert!(!lease.try_acquire(8, 1500 * MS, 2000 * MS, |_| true), "fresh and alive");
        assert!(lease.renew(7, 2000 * MS));
        assert!(!lease.renew(8, 2000 * MS));
        assert!(lease.try_acquire(8, 2100 * MS, 2000 * MS, |p| p != 7), "holder died");
        assert_eq!(lease.holder(), Some(8));
        assert!(!lease.renew(7, 2200 * MS), "the old holder learns it lost");
        assert!(lease.try_acquire(9, 4200 * MS, 2000 * MS, |_| true), "stale");
        lease.release(8);
        assert_eq!(lease.holder(), Some(9), "only the holder releases");
        lease.release(9);
        assert_eq!(lease.holder(), None);
        assert!(!lease.try_acquire(0, 1, 1, |_| true), "0 is not a token");
        assert_eq!(l.zone_status().agent_starts, 3);
        // The millisecond clock wraps after 49 days; ages are still right across the wrap.
        let wrap = (u64::from(u32::MAX) + 1) * MS;
        assert!(lease.try_acquire(5, wrap - 10 * MS, 2000 * MS, |_| true));
        assert_eq!(lease.age_ms(wrap + 20 * MS), 30);
    }
}
