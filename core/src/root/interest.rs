//! Answers by interest: the counters each session named lately, and per session an inbox of
//! the changes among them since its last answer.

use super::sessions::{Session, Sid};
use super::{IdMap, IdSet, RootState};
use crate::proto::SyncRequest;
use crate::quota::QuotaId;
use std::collections::VecDeque;

/// The sessions (`sid`) watching one counter: about three at 300 limiters by interest over
/// a million counters, held in the map's slot. Six fit in the slot's 32 bytes (three did
/// as `u64`): with three on average, a third of the counters spilled to the heap, and that
/// list was a cache miss of its own for every delta (to notify) and for every id that left
/// an interest (to unwatch); with six, one in thirty spills.
pub(super) type Watchers = smallvec::SmallVec<[Sid; 6]>;

/// Records an inbox may hold beyond twice its session's interest.
const INBOX_SLACK: usize = 64;

/// The changes of one session's interest since its last answer (answers by interest).
#[derive(Debug, Default)]
pub(super) struct Inbox {
    /// `(counter, version, place in the change log)` of each change, in the order they
    /// came: a push per change, where a set cost a lookup, and the answer reads each change
    /// from the log entry it names, which holds all it needs (fill, limit, demand), where
    /// looking up the counter and its quota cost two more misses. A counter that changed
    /// twice has two records; the older one no longer matches the log and is skipped.
    pub(super) changes: Vec<(QuotaId, u64, usize)>,
    /// Records held at most (twice the interest, and some): a session that stops syncing
    /// stops growing its inbox here, and the whole interest it then answers with is at most
    /// half as long as the list it replaces.
    pub(super) cap: usize,
    /// More changes came than `cap`: the next answer looks at the whole interest instead.
    pub(super) overflow: bool,
}

/// What one sync changed in its session's interest, for its answer.
pub(super) struct Noted {
    /// Counters new to the interest: the answer carries them even if unchanged.
    pub(super) fresh: IdSet,
    /// Counters that left it. Since the session's last answer only this sync took ids
    /// out, so these are the only ones its inbox may hold and must not answer.
    pub(super) left: IdSet,
}

impl Inbox {
    /// The records since the last answer, and whether they overflowed; the inbox is left
    /// empty.
    pub(super) fn take(&mut self) -> (Vec<(QuotaId, u64, usize)>, bool) {
        (std::mem::take(&mut self.changes), std::mem::replace(&mut self.overflow, false))
    }

    /// Gives the list of [`Inbox::take`] back, emptied: grown anew every interval it cost a
    /// dozen reallocations and copies of up to tens of kilobytes, on fresh pages, under the
    /// lock. Not one far larger than the inbox may hold now.
    pub(super) fn give_back(&mut self, mut list: Vec<(QuotaId, u64, usize)>) {
        if self.changes.is_empty() && list.capacity() <= self.cap.saturating_mul(2) {
            list.clear();
            self.changes = list;
        }
    }

    pub(super) fn push(&mut self, id: QuotaId, v: u64, at: usize) {
        if self.overflow {
            return;
        }
        if self.changes.len() >= self.cap {
            self.overflow = true;
            self.changes = Vec::new();
            return;
        }
        self.changes.push((id, v, at));
    }
}

impl RootState {
    /// Tells the sessions watching counter `id` that it changed (version `v`, at `at`).
    pub(super) fn notify(&mut self, id: QuotaId, v: u64, at: usize) {
        if let Some(ws) = self.watchers.get(&id) {
            for &sid in ws {
                if let Some(inbox) = self.inboxes.get_mut(sid as usize) {
                    inbox.push(id, v, at);
                }
            }
        }
    }

    /// Brings the session's interest up to this sync; what changed in it, or `None` when
    /// the answer must carry every changed counter: the limiter does not ask by interest,
    /// or the session's or the root's interest is full.
    pub(super) fn update_interest(
        &mut self,
        s: &mut Session,
        req: &SyncRequest,
        applied_before: u64,
        now: u64,
    ) -> Option<Noted> {
        if !req.interest {
            if !s.interest.is_empty() {
                // It stopped asking by interest (a reconfigured limiter): free what it named.
                self.drop_interest(s);
            }
            return None;
        }
        let stripe = self.stripe;
        let named = req
            .batches
            .iter()
            // A batch resent because its answer was lost was named when it was applied:
            // naming it again would make a slow root slower (a limiter resends up to
            // dozens of batches when answers time out).
            .filter(|b| b.seq > applied_before)
            .flat_map(|b| b.deltas.iter().map(|d| d.0))
            .chain(req.hints.iter().map(|h| h.0))
            .chain(req.watch.iter().copied())
            .filter(move |&id| stripe.contains(id));
        self.warm_interest(s, named.clone(), now);
        let left = self.expire_interest(s, now);
        let fresh = self.note_interest(s, named, now)?;
        Some(Noted { fresh, left })
    }

    /// Loads the slots the interest's upkeep will touch, all at once first (see `warm`): a
    /// session's interest is thousands of ids, rarely in the cache.
    fn warm_interest(&self, s: &Session, named: impl Iterator<Item = QuotaId>, now: u64) {
        let leaving = s.expiry.iter().take_while(|e| e.0 <= now);
        let mut touched = 0u64;
        for &(_, id) in leaving {
            touched ^= self.watchers.get(&id).map_or(0, |w| w.len() as u64);
        }
        for id in named {
            touched ^= s.interest.get(&id).copied().unwrap_or(0);
        }
        std::hint::black_box(touched);
    }

    /// Takes out of the session's interest what was named last more than the interest
    /// time ago; those ids.
    fn expire_interest(&mut self, s: &mut Session, now: u64) -> IdSet {
        let mut left = IdSet::default();
        while let Some(&(until, id)) = s.expiry.front() {
            if until > now {
                break;
            }
            s.expiry.pop_front();
            if s.interest.get(&id) == Some(&until) {
                s.interest.remove(&id);
                self.interest -= 1;
                self.unwatch(id, s.sid);
                left.insert(id);
            }
        }
        left
    }

    /// Adds the `named` counters this root holds to the session's interest until `now` +
    /// the interest time; the ones new to it, or `None` when the interest is full.
    fn note_interest(
        &mut self,
        s: &mut Session,
        named: impl Iterator<Item = QuotaId>,
        now: u64,
    ) -> Option<IdSet> {
        let until = now.saturating_add(self.config.interest_ttl_ns.max(1));
        let mut fresh = IdSet::default();
        let mut full = false;
        for id in named {
            if !self.in_shard(id) || self.quotas.get(&id).is_none_or(|q| q.deleted) {
                continue;
            }
            if let Some(u) = s.interest.get_mut(&id) {
                // Renewed once past half its time, so an id named every round leaves at most
                // two records in `expiry`: it stays for between half the interest time and
                // the whole of it after it was last named.
                if *u < now.saturating_add(self.config.interest_ttl_ns / 2) {
                    *u = until;
                    s.expiry.push_back((until, id));
                }
                continue;
            }
            if s.interest.len() >= self.config.max_interest_per_limiter
                || self.interest >= self.config.max_interest
            {
                full = true;
                continue;
            }
            s.interest.insert(id, until);
            s.expiry.push_back((until, id));
            self.interest += 1;
            self.watchers.entry(id).or_default().push(s.sid);
            fresh.insert(id);
        }
        let inbox = &mut self.inboxes[s.sid as usize];
        inbox.cap = s.interest.len().saturating_mul(2).saturating_add(INBOX_SLACK);
        if full {
            self.stats.interest_full += 1;
            return None;
        }
        Some(fresh)
    }

    /// Takes session `sid` off counter `id`'s watchers.
    fn unwatch(&mut self, id: QuotaId, sid: Sid) {
        if let Some(ws) = self.watchers.get_mut(&id) {
            ws.retain(|w| *w != sid);
            if ws.is_empty() {
                self.watchers.remove(&id);
            }
        }
    }

    /// Empties a session's interest (forgotten, or no longer asking by interest).
    pub(super) fn drop_interest(&mut self, s: &mut Session) {
        self.interest -= s.interest.len();
        let ids: Vec<QuotaId> = s.interest.keys().copied().collect();
        for id in ids {
            self.unwatch(id, s.sid);
        }
        s.interest = IdMap::default();
        s.expiry = VecDeque::new();
        if let Some(i) = self.inboxes.get_mut(s.sid as usize) {
            *i = Inbox::default();
        }
    }
}
