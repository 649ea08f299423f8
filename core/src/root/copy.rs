//! A root's state copied to a restarted root of the same shard.
//!
//! A root keeps counters and sessions in memory only. Restarted, it used to rebuild them
//! from the limiters' hints (their views, merged by max), which miss what the other
//! limiters sent in the round before: each view is a root's answer of up to an interval
//! ago. A live root of the shard holds the exact sums, and which batches of each limiter
//! they hold (its sessions' acknowledged `seq`; limiters number a batch once for all roots
//! of a shard). So a restarting root asks one for a [`RootCopy`] before it serves: the
//! counters' fills and each session's acknowledged `seq` and parked claims, taken at one
//! instant (the server takes it with no sync half applied). Then each limiter's batches
//! above its copied `seq` are the ones the copy lacks: applied by sum, as to a root that
//! never lost the session, and its hints skipped, since a view of another root's answer
//! could repeat counts the copy holds and those batches bring again. A limiter the copy
//! has no session for, or one whose pending batches start past its copied `seq` (it
//! dropped some), is met as by any restarted root: with its hints.
//!
//! A copy taken from a root that is itself catching up (it restarted without one, and
//! some limiter's hints are still on their way) would hold less than the limiters' views;
//! sessions still catching up there are copied as not caught up, so their hints are
//! taken here too.
//!
//! A copy of a root still in its hint window also carries how long before the copy it
//! started and what it holds of views older than that (`RootState::pre_start`): the root
//! that takes it goes on adding hints of such views where the copied root would have, and
//! merges hints of newer views, which may repeat what the copy holds, by max; and the
//! credit late batches had that such a hint takes back (`RootState::lent`). Without it
//! (the copied root is past its window) every hint merges by max.

use super::claims::Floor;
use super::sessions::Session;
use super::RootState;
use crate::quota::{Epoch, QuotaId};
use crate::shard::Shard;
use serde::{Deserialize, Serialize};

/// One root's counters and sessions at one instant, for a root of the same shard that
/// restarted ([`RootState::copy_out`], [`RootState::copy_in`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RootCopy {
    /// The shard the copied root aggregates: a root of another takes none of it.
    pub shard: Option<Shard>,
    /// An id derived from the cluster's key secret (none: the copied root had none): quota
    /// ids are a database's, so a root on another database takes none of it.
    pub cluster: Option<QuotaId>,
    /// The copied root's quota epoch: a counter of a quota reset after it is not taken.
    pub epoch: Epoch,
    /// Per counter: id, fill (milli-units), admitted rate (milli-units per second) and
    /// spare drain (milli-units, see "Late batches" in `root/claims.rs`).
    pub counters: Vec<(QuotaId, u64, f64, u64)>,
    /// The template of each key among `counters`.
    pub key_templates: Vec<(QuotaId, QuotaId)>,
    /// The sessions.
    pub sessions: Vec<SessionCopy>,
    /// The copied root's start and what it holds of older views, while it takes hints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_start: Option<PreStartCopy>,
}

/// What a copied root, still in its hint window, holds of limiters' views older than its
/// start (see `RootState::sync_from`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreStartCopy {
    /// How long before the copy it started taking syncs (ns).
    pub started_ago_ns: u64,
    /// Per counter: the highest hint of such a view it added, drained to the copy
    /// (milli-units), or none once a hint of a newer view lifted the counter by max.
    pub floors: Vec<(QuotaId, Option<u64>)>,
    /// Per counter: the credit its late batches had that a hint of such a view would take
    /// back (milli-units; see "Late batches" in `root/claims.rs`). Absent from roots that
    /// predate it.
    #[serde(default)]
    pub lent: Vec<(QuotaId, u64)>,
}

/// One limiter's session in a [`RootCopy`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionCopy {
    /// The limiter id.
    pub limiter: String,
    /// The highest batch `seq` the copied counters hold.
    pub acked: u64,
    /// How long before the copy it last synced (ns).
    pub idle_ns: u64,
    /// Its hints were still coming in at the copied root: its batches above `acked` are
    /// not all that the copy lacks.
    pub catching_up: bool,
    /// Its parked claims: (quota id, milli-units).
    pub parked: Vec<(QuotaId, u64)>,
}

/// What [`RootState::copy_in`] took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyTaken {
    /// Counters set.
    pub counters: usize,
    /// Counters left out: of a quota this root does not hold, or reset after the copy.
    pub skipped: usize,
    /// Sessions made.
    pub sessions: usize,
}

/// Why a copy was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// The copied root aggregates another shard.
    #[error("the copy is of shard {theirs:?}, this root aggregates {ours:?}")]
    OtherShard {
        /// The copy's.
        theirs: Option<Shard>,
        /// This root's.
        ours: Option<Shard>,
    },
    /// This root has synced already: a copy would count its batches twice or lose them.
    #[error("this root has served syncs already")]
    Served,
    /// The copied root's quotas come from another database (its key secret differs).
    #[error("the copy is of another cluster (its key secret differs)")]
    OtherCluster,
}

impl RootCopy {
    /// One copy from the copies of a root's stripes, taken together: counters and parked
    /// claims are each in one stripe; sessions are in all, with the same `seq`.
    pub fn join(parts: Vec<RootCopy>) -> RootCopy {
        let mut parts = parts.into_iter();
        let Some(mut lead) = parts.next() else { return RootCopy::default() };
        let index: std::collections::HashMap<String, usize> =
            lead.sessions.iter().enumerate().map(|(i, s)| (s.limiter.clone(), i)).collect();
        for p in parts {
            lead.counters.extend(p.counters);
            lead.key_templates.extend(p.key_templates);
            // Every stripe's, or none: the earliest start, as the one to count from.
            lead.pre_start = match (lead.pre_start.take(), p.pre_start) {
                (Some(mut a), Some(b)) => {
                    a.started_ago_ns = a.started_ago_ns.max(b.started_ago_ns);
                    a.floors.extend(b.floors);
                    a.lent.extend(b.lent);
                    Some(a)
                }
                _ => None,
            };
            for s in p.sessions {
                if let Some(&i) = index.get(&s.limiter) {
                    let l = &mut lead.sessions[i];
                    l.acked = l.acked.min(s.acked);
                    l.catching_up |= s.catching_up;
                    l.parked.extend(s.parked);
                }
            }
        }
        lead
    }
}

impl RootState {
    /// This state's counters and sessions at `now` (one stripe's, for a striped root: join
    /// them with [`RootCopy::join`], taken with no sync between them).
    pub fn copy_out(&self, now: u64) -> RootCopy {
        let mut copy = RootCopy {
            shard: self.config.shard,
            cluster: self.key_secret.map(cluster_id),
            epoch: self.epoch,
            ..RootCopy::default()
        };
        for p in 0..self.counters.places() {
            let Some((id, c)) = self.counters.at(p) else { continue };
            let Some(q) = self.quotas.get(&id).filter(|q| !q.deleted) else { continue };
            let fill = c.bucket.fill_at(now, q.limits.limit());
            copy.counters.push((id, fill, c.rate, c.spare));
            if let Some(t) = q.template {
                copy.key_templates.push((id, t));
            }
        }
        copy.sessions = self
            .limiters
            .iter()
            .map(|(name, s)| SessionCopy {
                limiter: name.to_string(),
                acked: s.acked,
                idle_ns: now.saturating_sub(s.last_seen),
                catching_up: s.catch_up,
                parked: s.parked.iter().map(|(&id, &p)| (id, p)).collect(),
            })
            .collect();
        let started = self.started.or(self.born.map(i128::from));
        let in_window =
            self.born.is_none_or(|b| now.saturating_sub(b) <= self.config.hint_window_ns);
        copy.pre_start = in_window.then(|| PreStartCopy {
            started_ago_ns: started.map_or(0, |s| u64::try_from(now as i128 - s).unwrap_or(0)),
            floors: self
                .pre_start
                .iter()
                .map(|(&id, f)| {
                    // Drained to the copy; `None` for a counter lifted by max.
                    let fill = match self.quotas.get(&id) {
                        Some(q) => f.fill_at(now, &q.limits),
                        None => Some(f.fill).filter(|_| *f != Floor::MIXED),
                    };
                    (id, fill)
                })
                .collect(),
            lent: self.lent.iter().map(|(&id, &v)| (id, v)).collect(),
        });
        copy
    }

    /// Takes `copy` (another root's [`RootState::copy_out`], taken `age` ns before `now`,
    /// at most) as this state's counters and sessions, before it serves any sync: this
    /// stripe's counters of quotas it holds and that were not reset after the copy, drained
    /// over `age`, and every session, as if it had applied their batches up to their copied
    /// `seq` (see the module docs).
    pub fn copy_in(&mut self, copy: &RootCopy, age: u64, now: u64) -> Result<CopyTaken, CopyError> {
        if copy.shard != self.config.shard {
            return Err(CopyError::OtherShard { theirs: copy.shard, ours: self.config.shard });
        }
        if copy.cluster.is_some() && copy.cluster != self.key_secret.map(cluster_id) {
            return Err(CopyError::OtherCluster);
        }
        if self.born.is_some() {
            return Err(CopyError::Served);
        }
        let taken_at = now.saturating_sub(age);
        let mut taken = CopyTaken::default();
        // Views older than the copied root's start (counted from when the copy was asked,
        // which is no later) add where they would have there; without, all merge by max.
        match &copy.pre_start {
            Some(p) => {
                self.started = Some(taken_at as i128 - p.started_ago_ns as i128);
                for &(id, f) in &p.floors {
                    if self.stripe.contains(id) {
                        let floor = f.map_or(Floor::MIXED, |fill| Floor { fill, at: taken_at });
                        self.pre_start.insert(id, floor);
                    }
                }
                for &(id, v) in &p.lent {
                    if self.stripe.contains(id) {
                        self.lent.insert(id, v);
                    }
                }
            }
            None => self.copied_in = true,
        }
        self.keys.asked.clear();
        for &(key, template) in &copy.key_templates {
            if self.stripe.contains(key) {
                self.keys.asked.insert(key, template);
            }
        }
        for &(id, fill, rate, spare) in &copy.counters {
            if !self.stripe.contains(id) {
                continue;
            }
            let fresh =
                self.in_shard(id) && self.key_entry(id) && self.reset_epoch(id) <= copy.epoch;
            let Some(l) = self.live_limits(id).filter(|_| fresh) else {
                taken.skipped += 1;
                continue;
            };
            let ceiling = self.ceiling(&l);
            let most_spare = l.limit().over(self.config.late_credit_ns);
            let Some(c) = self.counter_now(id, l.limit(), now) else {
                taken.skipped += 1;
                continue;
            };
            // As it stood when the copy was taken, drained since.
            c.bucket =
                crate::units::LeakyBucket { fill: fill.min(ceiling), at: taken_at, carry: 0 };
            c.bucket.advance(now, l.limit());
            c.rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
            c.rate_at = now;
            c.spare = spare.min(most_spare);
            self.log_change(id, l.limit());
            taken.counters += 1;
        }
        self.keys.asked.clear();
        for sc in copy.sessions.iter().take(self.config.max_limiters) {
            if sc.limiter.is_empty() || sc.limiter.len() > crate::proto::MAX_LIMITER_ID_LEN {
                continue;
            }
            if self.limiters.contains_key(sc.limiter.as_str()) {
                continue;
            }
            self.make_room(None);
            let mut s = Session {
                acked: sc.acked,
                sid: self.new_sid(),
                copied: !sc.catching_up,
                catch_up: sc.catching_up,
                ..Session::default()
            };
            for &(id, p) in &sc.parked {
                if self.stripe.contains(id) && self.live_limits(id).is_some() {
                    self.park(&mut s, id, p);
                }
            }
            self.stats.sessions_created += 1;
            // Its recency and how far its `seq` may have run are as at the copied root.
            let seen = taken_at.saturating_sub(sc.idle_ns);
            self.keep_session(Box::from(sc.limiter.as_str()), s, sc.acked, None, seen);
            taken.sessions += 1;
        }
        Ok(taken)
    }
}

/// The id a copy names its cluster by: derived from the key secret, which it does not
/// reveal.
fn cluster_id(secret: (u64, u64)) -> QuotaId {
    crate::zone::keys::key_id(secret, b"yarl root copy")
}
