//! The engine's side of each root session: the batches the root has not acknowledged, and
//! what a call's answer or failure changes in the root's entry of the block (instance,
//! `since`, acknowledged `seq`, backoff, whether it needs hints to catch up).

use super::slot_set::SlotSet;
use crate::limiter::Limiter;
use crate::proto::{DeltaBatch, SyncResponse, PROTOCOL_VERSION};
use crate::quota::QuotaId;
use crate::shard::Shard;
use crate::zone::roots as zroots;
use std::collections::VecDeque;
use std::sync::Arc;

/// One configured root.
#[derive(Debug)]
pub(super) struct RootLink {
    pub url: String,
    /// The shard this root aggregates (0 when unsharded).
    pub shard: u32,
    /// The root's entry in the block (instance, `since`, acknowledged `seq`, health).
    pub entry: usize,
    /// Batches sent and not acknowledged yet, oldest first: resent unchanged until they are.
    pending: VecDeque<Arc<DeltaBatch>>,
    /// Hints go in id order, at most [`MAX_HINTS_PER_CALL`] a call: the first id the next
    /// call hints (0: from the start).
    hint_next: QuotaId,
    /// Where the hints of the call in flight leave off: `Some(0)` if they were the last,
    /// `Some(id)` if hints from `id` on are still to send; taken in by an answer.
    hint_sent: Option<QuotaId>,
    /// Where the hints of the call in flight began (0: the first of them).
    hint_began: QuotaId,
    /// The highest `seq` this root acknowledged in an answer whose fills this limiter's
    /// view holds (see [`RootLink::acknowledge`]).
    pub in_view: u64,
    /// The batches this root acknowledged in an answer kept out of the view (it restarted,
    /// and summed them): the view holds them (folded in, as if no root had answered), and
    /// the hints this root gets next must not.
    pub summed_unmerged: Vec<Arc<DeltaBatch>>,
    /// When this root last answered (0: not since this engine began).
    pub answered_at: u64,
}

/// The most hints one call carries: a restarted root with a million active keys gets them
/// over a few rounds rather than in one request beyond its entry limit (each hinted key also
/// takes a `key_templates` entry; roots refuse more than 2,000,000 entries by default).
#[cfg(not(test))]
pub(super) const MAX_HINTS_PER_CALL: usize = 250_000;
/// Small in tests, so that hints over several calls are seen to work.
#[cfg(test)]
pub(super) const MAX_HINTS_PER_CALL: usize = 4;

impl RootLink {
    /// Continues the session of the root at `url` kept in entry `e` (number `entry`).
    pub fn resume(url: String, shard: u32, entry: usize, e: zroots::Entry<'_>) -> Self {
        if e.get(zroots::PENDING) > 0 {
            // The previous engine had batches this root never acknowledged; they were in
            // its memory. Hints bring the root up to date instead.
            add_hints(e);
            e.set(zroots::PENDING, 0);
        }
        let in_view = e.get(zroots::ACKED);
        RootLink {
            url,
            shard,
            entry,
            pending: VecDeque::new(),
            hint_next: 0,
            hint_sent: None,
            hint_began: 0,
            in_view,
            summed_unmerged: Vec::new(),
            answered_at: 0,
        }
    }

    /// Whether the next call carries hints: the root needs them ([`wants_hints`]) or the
    /// last ones it took were not all.
    pub fn wants_hints(&self, e: zroots::Entry<'_>, active: &SlotSet) -> bool {
        self.hint_next != 0 || wants_hints(e, active)
    }

    /// Cuts `hints` (in id order) to what this call carries: from where the last answered
    /// call left off, at most [`MAX_HINTS_PER_CALL`].
    pub fn take_hints(&mut self, mut hints: Vec<(QuotaId, u64)>) -> Vec<(QuotaId, u64)> {
        let from = hints.partition_point(|h| h.0 < self.hint_next);
        hints.drain(..from);
        self.hint_began = self.hint_next;
        if hints.len() > MAX_HINTS_PER_CALL {
            hints.truncate(MAX_HINTS_PER_CALL);
            self.hint_sent = hints.last().map(|h| h.0.saturating_add(1));
        } else {
            self.hint_sent = Some(0);
        }
        hints
    }

    /// A call failed: its hints go again.
    pub fn hints_lost(&mut self) {
        self.hint_sent = None;
    }

    /// The batches to send, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &Arc<DeltaBatch>> {
        self.pending.iter()
    }

    /// Queues this round's `batch` unless the root already acknowledged it. Past `max`
    /// batches the oldest is dropped, and hints bring the root up to date instead.
    pub fn queue(&mut self, e: zroots::Entry<'_>, batch: Option<&Arc<DeltaBatch>>, max: usize) {
        if let Some(b) = batch {
            if e.get(zroots::ACKED) < b.seq {
                self.pending.push_back(b.clone());
            }
            if self.pending.len() > max {
                self.pending.pop_front();
                add_hints(e);
            }
        }
        e.set(zroots::PENDING, self.pending.len() as u64);
    }

    /// Takes in the root's answer: what it acknowledged, where its next answer starts, and
    /// whether it restarted. Returns the batches still pending, and whether the answer's
    /// fills are to stay out of this limiter's view: the root restarted since the last
    /// answer and this call brought it no hints, so they are only what it summed since it
    /// started; merged, they would make the view look newer than its start, and the hints
    /// of the next request (read from the view as it was before) then merge by max,
    /// losing counts (`SyncRequest::view_age_ns`). `hold`: the fills stay out of the view
    /// although the root did not restart (`SyncEngine::holds_view`), and the batches it
    /// acknowledged stay pending.
    pub fn acknowledge(
        &mut self,
        e: zroots::Entry<'_>,
        resp: &SyncResponse,
        hold: bool,
    ) -> (usize, bool) {
        let known = e.get(zroots::INSTANCE);
        let flags = e.get(zroots::FLAGS) & !zroots::FLAG_HINTS;
        // A root that restarted lost its counters: tell it what we know next round, unless
        // this call told it from the first hint on (it took them as from a limiter it did
        // not know); a call that went on with hints an earlier instance took told it only
        // the rest.
        let told = self.hint_sent.is_some() && self.hint_began == 0;
        let restarted = known != 0 && known != resp.root_instance && !told;
        e.set(zroots::FLAGS, flags | if restarted { zroots::FLAG_HINTS } else { 0 });
        // A restart loses what earlier calls hinted: start over.
        self.hint_next =
            if restarted { 0 } else { self.hint_sent.take().unwrap_or(self.hint_next) };
        self.hint_sent = None;
        // No further than what was sent: an acknowledgement of a batch never sent (a root
        // that lies, a man in the middle) dropped the pending batches and kept the next
        // rounds' from being queued, so their counts never reached this root.
        let sent = self.pending.back().map_or(0, |b| b.seq).max(e.get(zroots::ACKED));
        let acked = resp.acked_seq.min(sent);
        e.set(zroots::INSTANCE, resp.root_instance);
        e.set(zroots::SINCE, resp.version);
        e.set(zroots::ACKED, acked);
        if restarted {
            // What this instance summed (an earlier one's sums died with it).
            self.summed_unmerged =
                self.pending.iter().filter(|b| b.seq <= acked).cloned().collect();
        } else if !hold {
            self.in_view = acked;
            self.summed_unmerged.clear();
        }
        // Held (and not from a restarted root, whose sums are `summed_unmerged`), the
        // batches this answer acknowledged stay pending until an answer is merged:
        // the root skips them as retries, and if it restarts meanwhile its new instance
        // gets them again, while the view (which holds them, folded in) keeps them out of
        // the hints. Dropped, they lived only in the dead instance.
        if restarted || !hold {
            self.pending.retain(|b| b.seq > acked);
        }
        e.set(zroots::SKIP, 0);
        (self.pending.len(), restarted)
    }
}

/// The answer if the engine can use it: in its protocol version, from a root that serves
/// the shard it is configured for (`want`; `None`: every counter). Otherwise the error to
/// record.
pub(super) fn accept(
    result: Result<SyncResponse, String>,
    want: Option<Shard>,
) -> Result<SyncResponse, String> {
    let r = result?;
    if r.v != PROTOCOL_VERSION {
        return Err(format!("root speaks protocol version {}", r.v));
    }
    if r.shard != want {
        let show =
            |s: Option<Shard>| s.map_or("every counter".to_string(), |s| format!("shard {s}"));
        return Err(format!("root serves {}, configured as {}", show(r.shard), show(want)));
    }
    Ok(r)
}

/// Records a failed call: the root is skipped for an exponential backoff of up to
/// `max_backoff` intervals, and gets hints with its next request.
pub(super) fn fail(e: zroots::Entry<'_>, error: &str, max_backoff: u32) {
    let consecutive = super::status::record_failure(e, error);
    let exp = consecutive.saturating_sub(1).min(16) as u32;
    e.set(zroots::SKIP, u64::from((1u32 << exp).min(max_backoff) - 1));
    // It may come back having lost what it had: it gets our view with its next request.
    add_hints(e);
}

/// Whether the root sits this round out, backing off after a failure (one round less).
pub(super) fn backing_off(e: zroots::Entry<'_>) -> bool {
    let skip = e.get(zroots::SKIP);
    if skip > 0 {
        e.set(zroots::SKIP, skip - 1);
    }
    skip > 0
}

/// Whether the root's next request carries hints: it asked for them (it failed, fell
/// behind or restarted), or the engine never met it and has counters to tell it of.
pub(super) fn wants_hints(e: zroots::Entry<'_>, active: &SlotSet) -> bool {
    e.get(zroots::FLAGS) & zroots::FLAG_HINTS != 0
        || (e.get(zroots::INSTANCE) == 0 && !active.is_empty())
}

fn add_hints(e: zroots::Entry<'_>) {
    e.set(zroots::FLAGS, e.get(zroots::FLAGS) | zroots::FLAG_HINTS);
}

/// Takes what `batches` admitted out of `hints` (in id order; hints left at 0 go).
pub(super) fn without_batches<'a>(
    hints: &mut Vec<(QuotaId, u64)>,
    batches: impl Iterator<Item = &'a Arc<DeltaBatch>>,
) {
    let mut sums: foldhash::HashMap<QuotaId, u64> = foldhash::HashMap::default();
    for b in batches {
        for d in &b.deltas {
            let v = sums.entry(d.0).or_default();
            *v = v.saturating_add(d.1);
        }
    }
    if sums.is_empty() {
        return;
    }
    for h in hints.iter_mut() {
        if let Some(v) = sums.get(&h.0) {
            h.1 = h.1.saturating_sub(*v);
        }
    }
    hints.retain(|h| h.1 > 0);
}

/// The hints for the roots of `shard`: every active counter's synced fill, in id order.
pub(super) fn collect_hints(
    limiter: &Limiter,
    active: &SlotSet,
    now: u64,
    shard: u32,
    shards: u32,
) -> Vec<(QuotaId, u64)> {
    // In slot order, which is close to id order for quotas loaded together.
    let mut hints: Vec<(QuotaId, u64)> = limiter.with_counters(|c| {
        active
            .iter()
            .filter_map(|s| {
                let v = c.synced(s, now);
                Some((c.id_of(s)?, v)).filter(|&(id, _)| v > 0 && Shard::of(id, shards) == shard)
            })
            .collect()
    });
    hints.sort_unstable_by_key(|h| h.0);
    hints
}
