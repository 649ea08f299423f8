//! The sync agent's write section: what makes the agent the block's only writer.
//!
//! The agent's lease ([`super::AgentLease`]) elects one agent, but an election is not a
//! fence: an agent whose process stops (`SIGSTOP`, a long page fault, a debugger) longer
//! than the lease's staleness loses the lease to another process, and when it goes on it
//! finishes the round it was in, writing the block beside the new agent: two writers of
//! structures made for one (the seqlocks over counters, the quota slots, the free lists).
//! So an agent writes only inside this section, one word taken by compare-and-swap for the
//! writes of a round, which another process takes over only when its holder is dead (or,
//! so that a recycled process id cannot wedge it, has held it for [`SECTION_STALE_NS`]): a
//! new agent waits out a stopped one (its rounds are skipped, the cluster view ages) rather
//! than write beside it, and the stopped one, once it goes on, ends its round and finds the
//! lease gone. Every section also notes who entered last, so a writer that finds another
//! process entered while it was inside counts an overlap: the figure that says this holds.

use super::Limiter;
use crate::zone::hdr;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// How long a live holder keeps the section against others: far longer than any round
/// (they end within a timeout), so only a process id recycled after its holder died, or a
/// holder stopped that long, loses it.
pub const SECTION_STALE_NS: u64 = 60_000_000_000;

/// The block's write section (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct WriteSection<'a> {
    lock: &'a AtomicU64,
    last: &'a AtomicU64,
    overlaps: &'a AtomicU64,
    waits: &'a AtomicU64,
}

impl Limiter {
    /// The write section of this block's sync agent.
    pub fn write_section(&self) -> WriteSection<'_> {
        WriteSection {
            lock: self.hdr(hdr::SECTION_LOCK),
            last: self.hdr(hdr::SECTION_LAST),
            overlaps: self.hdr(hdr::SECTION_OVERLAPS),
            waits: self.hdr(hdr::SECTION_WAITS),
        }
    }
}

fn pack(holder: u32, now_ns: u64) -> u64 {
    u64::from(holder) << 32 | (now_ns / 1_000_000) as u32 as u64
}

impl WriteSection<'_> {
    /// Enters the section as `me` (non-zero, e.g. a pid): `true` when it was free, held by
    /// `me`, or held by a process that is no longer `alive` or has held it for
    /// [`SECTION_STALE_NS`]; `false` (counted in [`waits`](Self::waits)) while another live
    /// process is inside.
    pub fn enter(&self, me: u32, now_ns: u64, alive: impl FnOnce(u32) -> bool) -> bool {
        if me == 0 {
            return false;
        }
        let cur = self.lock.load(Acquire);
        let holder = (cur >> 32) as u32;
        if holder != 0 && holder != me {
            let age_ns =
                u64::from(((now_ns / 1_000_000) as u32).wrapping_sub(cur as u32)) * 1_000_000;
            if age_ns < SECTION_STALE_NS && alive(holder) {
                self.waits.fetch_add(1, Relaxed);
                return false;
            }
        }
        if self.lock.compare_exchange(cur, pack(me, now_ns), AcqRel, Acquire).is_err() {
            self.waits.fetch_add(1, Relaxed);
            return false;
        }
        self.last.store(u64::from(me), Release);
        true
    }

    /// Leaves the section `me` entered: `false` (counted in [`overlaps`](Self::overlaps))
    /// when another process entered while `me` was inside.
    pub fn leave(&self, me: u32) -> bool {
        let alone = self.last.load(Acquire) == u64::from(me);
        if !alone {
            self.overlaps.fetch_add(1, Relaxed);
        }
        let cur = self.lock.load(Acquire);
        if (cur >> 32) as u32 == me {
            let _ = self.lock.compare_exchange(cur, 0, AcqRel, Acquire);
        }
        alone
    }

    /// The process inside, if any.
    pub fn holder(&self) -> Option<u32> {
        Some((self.lock.load(Acquire) >> 32) as u32).filter(|&h| h != 0)
    }

    /// Sections left after another process had entered meanwhile: 0 unless two processes
    /// wrote the block at once.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Relaxed)
    }

    /// Entries refused because another live process was inside.
    pub fn waits(&self) -> u64 {
        self.waits.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use crate::Limiter;

    const MS: u64 = 1_000_000;

    #[test]
    fn one_process_inside_at_a_time_and_a_dead_one_is_replaced() {
        let l = Limiter::builder().build();
        let s = l.write_section();
        assert!(s.enter(7, 1_000 * MS, |_| true));
        assert!(s.enter(7, 1_001 * MS, |_| true), "re-entering its own section");
        // Another live process waits, however long the holder has been inside short of the
        // staleness: a stopped agent is waited out, never written beside.
        assert!(!s.enter(8, 30_000 * MS, |_| true));
        assert_eq!((s.waits(), s.holder()), (1, Some(7)));
        // A dead holder is replaced at once, and its late leave is an overlap.
        assert!(s.enter(8, 30_001 * MS, |pid| pid != 7));
        assert_eq!(s.holder(), Some(8));
        assert!(!s.leave(7), "7 finds 8 entered while it was inside");
        assert_eq!(s.overlaps(), 1);
        assert_eq!(s.holder(), Some(8), "and does not free 8's section");
        assert!(s.leave(8));
        assert_eq!(s.holder(), None);
        // A recycled process id cannot wedge it: after the staleness, taken over.
        assert!(s.enter(9, 40_000 * MS, |_| true));
        assert!(!s.enter(10, 99_999 * MS, |_| true));
        assert!(s.enter(10, 100_001 * MS, |_| true));
        assert!(!s.enter(0, 0, |_| true), "0 is nobody");
    }
}
