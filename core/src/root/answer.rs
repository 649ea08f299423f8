//! What a root answers to a sync, shared with its tables rather than copied.

use super::changes::Change;
use super::counters::RootCounter;
use super::interest::{Inbox, Noted};
use super::sessions::Session;
use super::RootState;
use crate::proto::{
    InFlightGrant, SyncRequest, SyncResponse, LIVE_LIMITER_WINDOW, PROTOCOL_VERSION,
};
use crate::quota::{Epoch, QuotaId, QuotaUpdate};
use crate::shard::Shard;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What one root answers: a [`SyncResponse`] whose quotas are shared with the root's table
/// rather than copied, so building it under the root's lock costs one reference count per
/// quota and the JSON is written after the lock is released. Serialises exactly as the
/// [`SyncResponse`] it converts into.
#[derive(Debug, Clone)]
pub struct SyncAnswer {
    /// Protocol version.
    pub v: u32,
    /// Random id of this root process.
    pub root_instance: u64,
    /// Highest batch `seq` of this limiter the root has applied.
    pub acked_seq: u64,
    /// The root's counter version now.
    pub version: u64,
    /// Counters changed since `since`: `[id, fill, demand]`, in no particular order, and
    /// an id may appear twice (with the same values) until [`SyncAnswer::tidy`] runs:
    /// that work is left for after the root's lock.
    pub counters: Vec<(QuotaId, u64, u64)>,
    /// Quotas and tombstones above the limiter's epoch, in epoch order.
    pub quotas: Vec<Arc<QuotaUpdate>>,
    /// The epoch the limiter holds once it applied `quotas`.
    pub epoch: Epoch,
    /// More quotas are waiting.
    pub more: bool,
    /// The highest epoch this root applied.
    pub root_epoch: Epoch,
    /// The shard this root aggregates.
    pub shard: Option<Shard>,
    /// The cluster's secret for key ids ([`SyncResponse::key_secret`]).
    pub key_secret: Option<(u64, u64)>,
    /// Limiters this root heard from lately ([`SyncResponse::limiters`]).
    pub limiters: u32,
    /// Shares of concurrency counters ([`SyncResponse::grants`]).
    pub grants: Vec<InFlightGrant>,
}

impl SyncAnswer {
    /// Sorts the counters by id and drops repeated ids (v2 encodes each id as the
    /// difference to the previous one).
    pub fn tidy(&mut self) {
        self.counters.sort_unstable_by_key(|c| c.0);
        self.counters.dedup_by_key(|c| c.0);
    }

    /// The owned wire message, tidied.
    pub fn into_response(mut self) -> SyncResponse {
        self.tidy();
        SyncResponse {
            v: self.v,
            root_instance: self.root_instance,
            acked_seq: self.acked_seq,
            version: self.version,
            counters: self.counters,
            quotas: self.quotas.into_iter().map(|q| (*q).clone()).collect(),
            epoch: self.epoch,
            more: self.more,
            root_epoch: Some(self.root_epoch),
            shard: self.shard,
            key_secret: self.key_secret,
            limiters: Some(self.limiters),
            grants: self.grants,
        }
    }
}

struct QuotaList<'a>(&'a [Arc<QuotaUpdate>]);

impl Serialize for QuotaList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for q in self.0 {
            seq.serialize_element(&**q)?;
        }
        seq.end()
    }
}

impl Serialize for SyncAnswer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Field for field what `#[derive(Serialize)]` writes for `SyncResponse`.
        let fields = 10
            + usize::from(self.shard.is_some())
            + usize::from(self.key_secret.is_some())
            + usize::from(!self.grants.is_empty());
        let mut st = s.serialize_struct("SyncResponse", fields)?;
        st.serialize_field("v", &self.v)?;
        st.serialize_field("root_instance", &self.root_instance)?;
        st.serialize_field("acked_seq", &self.acked_seq)?;
        st.serialize_field("version", &self.version)?;
        st.serialize_field("counters", &self.counters)?;
        st.serialize_field("quotas", &QuotaList(&self.quotas))?;
        st.serialize_field("epoch", &self.epoch)?;
        st.serialize_field("more", &self.more)?;
        st.serialize_field("root_epoch", &self.root_epoch)?;
        if let Some(shard) = &self.shard {
            st.serialize_field("shard", &shard.to_string())?;
        }
        if let Some(secret) = &self.key_secret {
            st.serialize_field("key_secret", secret)?;
        }
        st.serialize_field("limiters", &self.limiters)?;
        if !self.grants.is_empty() {
            st.serialize_field("grants", &self.grants)?;
        }
        st.end()
    }
}

/// A counter as an answer carries it: `(id, fill, demand)`.
type Entry = (QuotaId, u64, u64);

impl Change {
    fn answered(&self, now: u64) -> Entry {
        (self.id, self.bucket.fill_at(now, self.limit), self.demand.rate(now) as u64)
    }
}

impl RootCounter {
    fn answered(&self, id: QuotaId, now: u64) -> Entry {
        (id, self.bucket.fill_at(now, self.limit), self.demand.rate(now) as u64)
    }
}

impl RootState {
    /// The answer to a sync of session `s`, whose batches up to `acked` are applied.
    pub(super) fn answer(
        &mut self,
        req: &SyncRequest,
        s: &Session,
        acked: u64,
        noted: Option<Noted>,
        now: u64,
    ) -> SyncAnswer {
        let since = if req.root_instance == Some(self.instance) {
            req.since
        } else {
            self.stats.first_contacts += 1;
            0
        };
        let mut counters = match noted {
            Some(noted) => self.by_interest(s, noted, since, now),
            None => self.changes.since(since).map(|c| c.answered(now)).collect(),
        };
        // What this limiter admitted beyond a ceiling is parked, not lost: it sees it in the
        // fills it gets back, or it would admit that much again (others do not see it).
        if !s.parked.is_empty() {
            for c in &mut counters {
                if let Some(&parked) = s.parked.get(&c.0) {
                    c.1 = c.1.saturating_add(parked);
                }
            }
        }
        let (quotas, epoch, more) = self.quota_page(req.epoch);
        self.stats.syncs += 1;
        self.stats.quotas_sent += quotas.len() as u64;
        SyncAnswer {
            v: PROTOCOL_VERSION,
            root_instance: self.instance,
            acked_seq: acked,
            version: self.version.load(Relaxed),
            counters,
            quotas,
            epoch,
            more,
            root_epoch: self.epoch,
            shard: self.config.shard,
            key_secret: self.key_secret,
            limiters: self.live_limiters(now),
            grants: Vec::new(),
        }
    }

    /// Limiters heard from within [`LIVE_LIMITER_WINDOW`], the one syncing now included
    /// (its session is out of the table while it syncs), counted at most once a second:
    /// the table may hold 100,000 sessions.
    fn live_limiters(&mut self, now: u64) -> u32 {
        let (_, at) = self.live_limiters;
        if at == 0 || now.saturating_sub(at) >= 1_000_000_000 || now < at {
            let since = now.saturating_sub(LIVE_LIMITER_WINDOW);
            let n = self.recency.range((since, 0)..).count();
            self.live_limiters = (u32::try_from(n).unwrap_or(u32::MAX).saturating_add(1), now);
        }
        self.live_limiters.0
    }

    /// The counters of an answer by interest: the changes its inbox recorded and the
    /// counters new to its interest, in no order (sorted and deduplicated by
    /// [`SyncAnswer::tidy`], after the lock).
    fn by_interest(&mut self, s: &Session, noted: Noted, since: u64, now: u64) -> Vec<Entry> {
        self.stats.interest_answers += 1;
        let inbox = self.inboxes.get_mut(s.sid as usize).map(Inbox::take);
        let (changed, overflow) = inbox.unwrap_or_default();
        let out = if since == 0 || overflow {
            // Its view is from another root, or none, or too much changed to list:
            // everything it names.
            s.interest.keys().filter_map(|&id| self.current(id, now)).collect()
        } else {
            self.inbox_counters(&changed, noted, now)
        };
        if let Some(i) = self.inboxes.get_mut(s.sid as usize) {
            i.give_back(changed);
        }
        out
    }

    /// The inbox's records that still name a counter's latest change, then the counters new
    /// to the interest.
    fn inbox_counters(
        &self,
        changed: &[(QuotaId, u64, usize)],
        noted: Noted,
        now: u64,
    ) -> Vec<Entry> {
        let mut out = Vec::with_capacity(changed.len() + noted.fresh.len());
        // The entries, all at once first (see `warm`).
        let mut touched = 0u64;
        for &(_, v, at) in changed {
            touched ^= self.changes.get(at, v).map_or(0, |e| e.limit.word());
        }
        std::hint::black_box(touched);
        for &(id, v, at) in changed {
            // Changes queued before a counter left the interest (this sync) stay out. A
            // small set: a lookup in the session's interest, thousands of ids, was a cache
            // miss for every record.
            if noted.left.contains(&id) {
                continue;
            }
            match self.changes.find(at, v) {
                Some(Some(c)) => out.push(c.answered(now)),
                // Tombstoned in place: a later change of it is further on (a counter that
                // changed twice since the last answer), or it is gone. No lookup of the
                // counter (a cache miss per record).
                Some(None) => {}
                // Moved by a compaction: answered if that is still its latest change.
                None => out.extend(
                    self.counter_of(id).filter(|c| c.version == v).map(|c| c.answered(id, now)),
                ),
            }
        }
        out.extend(noted.fresh.into_iter().filter_map(|id| self.current(id, now)));
        out
    }

    /// Counter `id` as it is now, for what the change log does not hold as recorded.
    fn current(&self, id: QuotaId, now: u64) -> Option<Entry> {
        self.counter_of(id).map(|c| c.answered(id, now))
    }

    /// The quotas and tombstones above `after` (a limiter's epoch), at most a page of them;
    /// the epoch the limiter holds once it applied them; whether more are waiting. Only the
    /// lead has pages to give (`by_epoch` is empty in the other stripes).
    fn quota_page(&self, after: Epoch) -> (Vec<Arc<QuotaUpdate>>, Epoch, bool) {
        let mut quotas = Vec::new();
        let mut epoch = self.epoch;
        for (&e, id) in self.by_epoch.range(after.saturating_add(1)..) {
            if quotas.len() == self.config.page_size {
                return (quotas, epoch, true);
            }
            quotas.push(Arc::clone(&self.quotas[id].update));
            epoch = e;
        }
        (quotas, self.epoch.max(after), false)
    }
}
