//! The session table: one session per limiter id, with the highest batch applied (the
//! sequence check), its parked claims and its interest, and the recency indexes that decide
//! who is forgotten when room is needed. What the sequence check allows, and why the table
//! never locks anyone out, is in "What a sync may claim" (`claims.rs`).

use super::interest::Inbox;
use super::{IdMap, RootState};
use crate::proto::{SyncError, SyncRequest};
use crate::quota::QuotaId;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::net::IpAddr;

/// A session's number: its index in [`RootState::inboxes`], reused once it is forgotten,
/// so it stays small (below `max_limiters`) and an inbox is found without a hash lookup.
pub(super) type Sid = u32;

/// The key of a session in the recency index: last seen, then a serial for ties.
pub(super) type Recency = (u64, u64);

#[derive(Debug, Default)]
pub(super) struct Session {
    /// The highest batch `seq` applied: a batch at or below it is a retry.
    pub(super) acked: u64,
    /// When it last synced (ns): its recency, and how far its `seq` may have run since.
    pub(super) last_seen: u64,
    /// Orders sessions seen at the same time in the recency index; 0 until the session is
    /// first kept (a limiter this root meets for the first time).
    pub(super) serial: u64,
    /// The peer address it syncs from, whose budget of sessions it counts against.
    pub(super) addr: Option<IpAddr>,
    /// Admitted amounts above a counter's ceiling, fed in as this session keeps syncing.
    pub(super) parked: IdMap<u64>,
    /// A number for this session that never changes (`serial` does at every sync); another
    /// session gets it once this one is forgotten.
    pub(super) sid: Sid,
    /// The counters this limiter named lately, with when each leaves (ns), if it asks for
    /// answers by interest.
    pub(super) interest: IdMap<u64>,
    /// (leaves at, counter) in the order they were named: the front leaves first. A counter
    /// named again has a later record; the earlier one is then stale.
    pub(super) expiry: VecDeque<(u64, QuotaId)>,
    /// It met this root without naming its instance (this root restarted, or is new to it),
    /// and has sent no request without hints since: its hints, over as many calls as they
    /// take, bring what this root lost, not only what the limiter had to drop.
    pub(super) catch_up: bool,
    /// One past the highest id of the hints this root took from it while it caught up (0:
    /// none). Catching up goes on in id order; hints that start at or below it again are
    /// its whole view sent once more after a failed call, in case this root lost it.
    pub(super) hinted_to: QuotaId,
    /// Copied from a live root of the shard ([`super::copy`]) with the counts of its
    /// batches up to `acked`, and not heard from since: its first sync is met as by a root
    /// that never lost it, though it names the instance this root replaced.
    pub(super) copied: bool,
}

/// What a root remembers of the sessions it forgot (evicted to make room, or idle): the
/// highest batch each had applied and when it last synced, by a hash of its limiter id, for
/// as many sessions as the table holds, the oldest going first. A limiter met again resends
/// the batches it has no answer for; one this root applied before forgetting the session
/// (its answer lost) must stay a retry, not count twice.
#[derive(Debug, Default)]
pub(super) struct Forgotten {
    /// What a session needs to go on as if never forgotten, and the serial of the note,
    /// by id hash.
    by_hash: super::IdMap<(Resumed, u64)>,
    /// (id hash, serial of the note), oldest first.
    order: VecDeque<(u64, u64)>,
    serial: u64,
    seed: foldhash::quality::RandomState,
}

/// The part of a forgotten session a new one of the same limiter starts from: its highest
/// batch applied and when it last synced, and where it stood in a catch-up after this
/// root restarted (its hints still to come are not the ones of a known session).
#[derive(Debug, Default, Clone, Copy)]
struct Resumed {
    acked: u64,
    last_seen: u64,
    catch_up: bool,
    hinted_to: QuotaId,
}

impl Forgotten {
    fn note(&mut self, limiter: &str, s: &Session, cap: usize) {
        if s.acked == 0 || cap == 0 {
            return;
        }
        let h = self.seed.hash_one(limiter);
        self.serial += 1;
        let resumed = Resumed {
            acked: s.acked,
            last_seen: s.last_seen,
            catch_up: s.catch_up,
            hinted_to: s.hinted_to,
        };
        self.by_hash.insert(h, (resumed, self.serial));
        self.order.push_back((h, self.serial));
        while self.order.len() > cap {
            let Some((old, serial)) = self.order.pop_front() else { break };
            if self.by_hash.get(&old).is_some_and(|e| e.1 == serial) {
                self.by_hash.remove(&old);
            }
        }
    }

    /// What `limiter`'s forgotten session had.
    fn take(&mut self, limiter: &str) -> Option<Resumed> {
        let h = self.seed.hash_one(limiter);
        self.by_hash.remove(&h).map(|(r, _)| r)
    }
}

impl RootState {
    /// The session of `req`'s limiter, taken out of the table (and its recency indexes)
    /// while the sync works on it, or a new one if the limiter is not known (making room
    /// for it first); an error if its batches run further ahead than it could have counted.
    pub(super) fn admit_session(
        &mut self,
        req: &SyncRequest,
        peer: Option<IpAddr>,
        now: u64,
    ) -> Result<(Box<str>, Session), SyncError> {
        match self.limiters.remove_entry(req.limiter.as_str()) {
            Some((name, s)) => {
                if let Err(e) = self.check_seq(req, &s, now) {
                    self.limiters.insert(name, s);
                    return Err(e);
                }
                self.unindex_session(&s);
                Ok((name, s))
            }
            None => {
                self.make_room(peer);
                if self.config.max_limiters == 0 {
                    return Err(SyncError::TooManyLimiters(0));
                }
                // A session forgotten lately keeps its highest batch: a retry of one applied
                // before stays a retry.
                let r = self.forgotten.take(&req.limiter).unwrap_or_default();
                let s = Session {
                    addr: peer,
                    sid: self.new_sid(),
                    acked: r.acked,
                    last_seen: r.last_seen,
                    catch_up: r.catch_up,
                    hinted_to: r.hinted_to,
                    ..Session::default()
                };
                self.stats.sessions_created += 1;
                Ok((Box::from(req.limiter.as_str()), s))
            }
        }
    }

    /// Puts a session back into the table once its sync is done, as the most recently seen,
    /// with `acked` the highest batch applied.
    pub(super) fn keep_session(
        &mut self,
        name: Box<str>,
        mut s: Session,
        acked: u64,
        peer: Option<IpAddr>,
        now: u64,
    ) {
        s.acked = acked;
        s.last_seen = now;
        s.serial = self.next_serial;
        self.next_serial += 1;
        if peer.is_some() {
            s.addr = peer;
        }
        self.index_session(name.clone(), &s);
        self.limiters.insert(name, s);
    }

    /// Refuses a batch `seq` further ahead of a known session's acknowledged one than that
    /// limiter could have counted since its last sync. A session that never had a batch
    /// applied takes any `seq`: a limiter keeps its numbering across nginx reloads, and this
    /// root may be meeting it for the first time after its own restart.
    fn check_seq(&self, req: &SyncRequest, s: &Session, now: u64) -> Result<(), SyncError> {
        if s.acked == 0 {
            return Ok(());
        }
        let Some(seq) = req.batches.iter().map(|b| b.seq).max() else { return Ok(()) };
        let elapsed = now.saturating_sub(s.last_seen);
        let max_ahead = self
            .config
            .seq_ahead_slack
            .saturating_add(elapsed / self.config.seq_min_interval_ns.max(1));
        if seq - s.acked.min(seq) > max_ahead {
            return Err(SyncError::SeqTooFarAhead { seq, acked: s.acked, max_ahead });
        }
        Ok(())
    }

    /// Files a session under its recency, overall and for its address: who goes first
    /// when room is needed.
    fn index_session(&mut self, name: Box<str>, s: &Session) {
        let key = (s.last_seen, s.serial);
        self.recency.insert(key, name);
        if let Some(a) = s.addr {
            self.by_addr.entry(a).or_default().insert(key);
        }
    }

    fn unindex_session(&mut self, s: &Session) {
        let key = (s.last_seen, s.serial);
        self.recency.remove(&key);
        if let Some(a) = s.addr {
            if let Some(set) = self.by_addr.get_mut(&a) {
                set.remove(&key);
                if set.is_empty() {
                    self.by_addr.remove(&a);
                }
            }
        }
    }

    /// Forgets the session of recency `key`, with its parked claims and interest.
    fn forget_session(&mut self, key: Recency) {
        let Some(name) = self.recency.get(&key).cloned() else { return };
        if let Some(mut s) = self.limiters.remove(&name) {
            self.forgotten.note(&name, &s, self.config.max_limiters);
            self.unindex_session(&s);
            self.parked -= s.parked.len();
            // No counter names it any more: its number may go to a new session.
            self.drop_interest(&mut s);
            self.free_sids.push(s.sid);
        }
    }

    /// A number for a new session, with an empty inbox.
    pub(super) fn new_sid(&mut self) -> Sid {
        if let Some(sid) = self.free_sids.pop() {
            return sid;
        }
        self.inboxes.push(Inbox::default());
        // Below `max_limiters` sessions are held at once (`make_room` runs first), and a
        // `u32` limit far above any table size a root is configured with.
        Sid::try_from(self.inboxes.len() - 1).expect("fewer than 2^32 sessions at once")
    }

    /// Makes room for one more session from `peer`: the least recently seen session of that
    /// address goes if the address is at its budget, the least recently seen of all if the
    /// table is full. A live limiter syncs every interval, so what goes is whoever has been
    /// quiet longest; forgetting a live one costs little (its next batches count as a first
    /// contact: nothing is lost, and a batch resent after a lost answer is still known as
    /// applied, see [`Forgotten`]).
    pub(super) fn make_room(&mut self, peer: Option<IpAddr>) {
        if let Some(a) = peer {
            while self.by_addr.get(&a).is_some_and(|s| s.len() >= self.config.max_limiters_per_addr)
            {
                let Some(&oldest) = self.by_addr.get(&a).and_then(|s| s.first()) else { break };
                self.forget_session(oldest);
                self.stats.limiters_evicted += 1;
            }
        }
        while self.limiters.len() >= self.config.max_limiters {
            let Some((&oldest, _)) = self.recency.first_key_value() else { break };
            self.forget_session(oldest);
            self.stats.limiters_evicted += 1;
        }
    }

    /// Forgets the sessions not seen for
    /// [`RootConfig::limiter_idle_ns`](super::RootConfig::limiter_idle_ns).
    pub(super) fn forget_idle_limiters(&mut self, now: u64) {
        let idle = self.config.limiter_idle_ns;
        while let Some((&key, _)) = self.recency.first_key_value() {
            if now.saturating_sub(key.0) < idle {
                break;
            }
            self.forget_session(key);
        }
    }
}
