//! The change log, and the versions that order it: an answer is a walk of the log from the
//! version the limiter last saw, not a look at every counter.

use super::demand::DemandWindow;
use super::{place_of, RootState};
use crate::quota::QuotaId;
use crate::units::{LeakyBucket, Rate};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

/// A counter as its latest change left it, kept in the change log so that an answer is
/// built by walking the log alone: each entry's fill (drained to the answer's time at
/// `limit`) and demand (its window read at that time) come out exactly as from the counter
/// itself, without a lookup per counter. Answers carry every counter that changed in the
/// cluster since the limiter's last sync, so this walk is most of a root's work per sync.
#[derive(Debug, Clone, Copy)]
pub(super) struct Change {
    pub(super) id: QuotaId,
    pub(super) bucket: LeakyBucket,
    pub(super) limit: Rate,
    pub(super) demand: DemandWindow,
}

/// Entries per chunk of the change log.
pub(super) const LOG_CHUNK: usize = 4096;
/// A place in the change log: chunk number above these bits, offset in the chunk below.
const LOG_SHIFT: u32 = 16;
const LOG_OFFSET: usize = (1 << LOG_SHIFT) - 1;

/// The change log: each counter's latest change, in version order, in chunks of
/// [`LOG_CHUNK`]. A change replaces the counter's previous entry by a tombstone (O(1): the
/// counter knows the place) and is appended, where a `BTreeMap` by version took a removal
/// and an insertion deep in a tree of up to a million entries for every delta. A chunk is
/// compacted on its own once half of it is tombstones (a few thousand entries, not the whole
/// log: one pass over a million entries held every sync back for 50 ms every few seconds),
/// empty chunks leave from the front, and the few live entries of an old front chunk are
/// moved to the end so that it can leave too.
#[derive(Debug, Default)]
pub(super) struct ChangeLog {
    pub(super) chunks: VecDeque<LogChunk>,
    /// The number of `chunks[0]`; numbers only grow, so places stay valid when the front goes.
    pub(super) first: usize,
    pub(super) live: usize,
    /// Emptied buffers of a whole chunk's size, for the next new chunks: a fresh one is
    /// half a megabyte the allocator often maps anew, and the kernel would zero those pages
    /// under the root's lock.
    pub(super) spare: Vec<Vec<(u64, Option<Change>)>>,
}

/// Spare chunk buffers kept, at most.
pub(super) const LOG_SPARE: usize = 2;

#[derive(Debug, Default)]
pub(super) struct LogChunk {
    pub(super) entries: Vec<(u64, Option<Change>)>,
    pub(super) live: usize,
}

impl ChangeLog {
    /// Appends the change of version `v` (above every version in the log); its place.
    pub(super) fn push(&mut self, v: u64, c: Change) -> usize {
        if self.chunks.back().is_none_or(|ch| ch.entries.len() >= LOG_CHUNK) {
            let entries = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(LOG_CHUNK));
            self.chunks.push_back(LogChunk { entries, live: 0 });
        }
        let no = self.first + self.chunks.len() - 1;
        let ch = self.chunks.back_mut().expect("a chunk was pushed above");
        ch.entries.push((v, Some(c)));
        ch.live += 1;
        self.live += 1;
        no << LOG_SHIFT | (ch.entries.len() - 1)
    }

    /// The live change of version `v` at `at`, if it is still there (not replaced by a newer
    /// change of its counter, not moved by a compaction).
    pub(super) fn get(&self, at: usize, v: u64) -> Option<&Change> {
        let ch = self.chunks.get((at >> LOG_SHIFT).checked_sub(self.first)?)?;
        ch.entries.get(at & LOG_OFFSET).filter(|e| e.0 == v)?.1.as_ref()
    }

    /// What the log holds of the change of version `v` recorded at `at`: `Some(None)` when
    /// it was tombstoned in place (a later change of its counter is further on), `None`
    /// when it is no longer at `at` (its chunk was compacted or left: look at the counter).
    pub(super) fn find(&self, at: usize, v: u64) -> Option<Option<&Change>> {
        let ch = self.chunks.get((at >> LOG_SHIFT).checked_sub(self.first)?)?;
        ch.entries.get(at & LOG_OFFSET).filter(|e| e.0 == v).map(|e| e.1.as_ref())
    }

    fn chunk_mut(&mut self, at: usize) -> Option<&mut LogChunk> {
        self.chunks.get_mut((at >> LOG_SHIFT).checked_sub(self.first)?)
    }

    /// Tombstones the entry of version `v` at `at`; whether its chunk (not the newest) is
    /// now half tombstones and worth compacting.
    pub(super) fn kill(&mut self, at: usize, v: u64) -> bool {
        let newest = self.first + self.chunks.len().saturating_sub(1);
        let Some(ch) = self.chunk_mut(at) else { return false };
        let Some(e) = ch.entries.get_mut(at & LOG_OFFSET).filter(|e| e.0 == v && e.1.is_some())
        else {
            return false;
        };
        e.1 = None;
        ch.live -= 1;
        let worth = at >> LOG_SHIFT != newest && ch.live * 2 < ch.entries.len();
        self.live -= 1;
        worth
    }

    /// Drops the tombstones of the chunk of `at`, calling `moved(id, new place)` for each
    /// live entry, then the empty chunks at the front.
    pub(super) fn compact(&mut self, at: usize, mut moved: impl FnMut(QuotaId, usize)) {
        let no = at >> LOG_SHIFT;
        if let Some(ch) = self.chunk_mut(at) {
            // The live entries into a buffer of their size (memory follows what is live);
            // a whole chunk's buffer is kept for a new chunk.
            let live: Vec<_> = ch.entries.iter().filter(|e| e.1.is_some()).copied().collect();
            let old = std::mem::replace(&mut ch.entries, live);
            for (i, e) in ch.entries.iter().enumerate() {
                if let Some(c) = &e.1 {
                    moved(c.id, no << LOG_SHIFT | i);
                }
            }
            self.recycle(old);
        }
        while self.chunks.len() > 1 && self.chunks.front().is_some_and(|c| c.live == 0) {
            if let Some(ch) = self.chunks.pop_front() {
                self.recycle(ch.entries);
            }
            self.first += 1;
        }
    }

    /// Keeps a chunk's buffer for a new chunk, if it is a whole one and room is left.
    fn recycle(&mut self, mut buf: Vec<(u64, Option<Change>)>) {
        if buf.capacity() == LOG_CHUNK && self.spare.len() < LOG_SPARE {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// The live entries of the oldest chunk, when they are few and newer chunks follow:
    /// moving them to the end lets the chunk go (a counter left alone for long, draining a
    /// large fill slowly, would otherwise keep every chunk after it).
    fn stale_front(&self) -> Option<Vec<(usize, u64, Change)>> {
        let front = self.chunks.front()?;
        if self.chunks.len() < 3 || front.live == 0 || front.live > LOG_CHUNK / 8 {
            return None;
        }
        let no = self.first;
        Some(
            front
                .entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| Some((no << LOG_SHIFT | i, e.0, e.1?)))
                .collect(),
        )
    }

    /// The live changes after version `since`, in version order.
    pub(super) fn since(&self, since: u64) -> impl Iterator<Item = &Change> {
        // The first chunk that may hold a version above `since`, looking back from the
        // newest: answers are mostly about the last interval.
        let mut k = self.chunks.len();
        while k > 0 {
            k -= 1;
            if self.chunks[k].entries.first().is_some_and(|e| e.0 <= since) {
                break;
            }
        }
        self.chunks
            .range(k..)
            .flat_map(|ch| ch.entries.iter())
            .filter(move |e| e.0 > since)
            .filter_map(|e| e.1.as_ref())
    }
}

impl RootState {
    /// The version of the latest change (of every stripe): read before a sync goes to the
    /// stripes, it is the version to answer (see [`SyncAnswer::join`](super::SyncAnswer::join)).
    pub fn version(&self) -> u64 {
        self.version.load(Relaxed)
    }

    /// Versions are taken and their changes logged under the one lock of their stripe: a
    /// version read before a sync visits a stripe therefore names only changes that the
    /// stripe's log holds by the time the sync gets there.
    fn next_version(&mut self) -> u64 {
        self.version.fetch_add(1, Relaxed) + 1
    }

    /// Logs a change of counter `id`, whose live quota drains it at `limit`: the counter as
    /// it is now goes to the end of the log under a new version, its previous entry becomes
    /// a tombstone, and the sessions watching it are told. Only the caller knows the quota
    /// is live (a counter leaves with its quota), so it passes the limit it read.
    pub(super) fn log_change(&mut self, id: QuotaId, limit: Rate) {
        let v = self.next_version();
        let Some(c) = self.counters.get_mut(place_of(&self.quotas, id)) else { return };
        let old = (c.version != 0).then_some((c.log_at, c.version));
        c.version = v;
        c.limit = limit;
        let at = self.changes.push(v, Change { id, bucket: c.bucket, limit, demand: c.demand });
        c.log_at = at;
        self.notify(id, v, at);
        if let Some((at, old_v)) = old {
            self.kill_change(at, old_v);
        }
        if let Some(stale) = self.changes.stale_front() {
            // Same content, a new version: classic answers send them once more.
            for (at, old_v, change) in stale {
                let v = self.next_version();
                let new_at = self.changes.push(v, change);
                if let Some(c) = self.counter_mut(change.id) {
                    c.version = v;
                    c.log_at = new_at;
                }
                // Its watchers' records name the old place and version, which no longer
                // match anything: they get the new one.
                self.notify(change.id, v, new_at);
                self.kill_change(at, old_v);
            }
        }
    }

    /// Tombstones a change-log entry, compacting its chunk when it is half tombstones.
    pub(super) fn kill_change(&mut self, at: usize, v: u64) {
        if self.changes.kill(at, v) {
            let (quotas, counters) = (&self.quotas, &mut self.counters);
            self.changes.compact(at, |id, new_at| {
                if let Some(c) = counters.get_mut(place_of(quotas, id)) {
                    c.log_at = new_at;
                }
            });
        }
    }
}
