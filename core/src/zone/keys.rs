//! The key table: a bucket per name under a template, created by the request path on a
//! name's first sight, without a lock.
//!
//! A template (a quota named `prefix*`) limits every name that starts with its prefix and
//! has no quota of its own: each such name, a *key*, gets a slot of its own here, with the
//! template's limits and parent. Keys come from request data (an API key, a client address)
//! and nobody creates them ahead of time, so any request path of any process inserts them,
//! concurrently with every other and with the sync agent.
//!
//! # Layout
//!
//! [`KeyTable`] is open addressing over whole slots (the same 16 words as a quota's, so the
//! decision code is the same): a key's slot is within [`WINDOW`] positions of its home,
//! which the key's 128-bit name hash picks. A lookup loads the home slot directly (one
//! cache miss for most keys, no index in between) and compares the hash; names are not
//! stored, only that hash (keyed by the block's own secret, so nobody can aim two names at
//! one slot), which makes keys of any length cost the same.
//!
//! | word | in a key's slot |
//! |---|---|
//! | 0 | state: 0 empty, [`claimed`] while a request path fills it, [`tomb`] with the time it was freed, or the key's wire id ([`is_key_id`]) |
//! | 1 | the writer's mark that it knows the key by its wire id ([`known_mark`]; 0 until then) · the template's parent slot + 1 |
//! | 2–12 | as in a quota's slot: limits (the template's), the counter |
//! | 13, 14 | the 128-bit name hash |
//! | 15 | the template's slot + 1 |
//!
//! # Concurrency
//!
//! * Insert: probe the window; a free position (empty, or freed longer than [`GRACE_MS`]
//!   ago) is claimed by a compare-and-swap of word 0, the slot is written, and the claim
//!   is turned into the wire id last (a compare-and-swap, Release: see
//!   [`KeyTable::publish`]). Readers only trust a slot whose word 0 holds a key id and
//!   whose hash matches.
//! * Two inserts of one name: the one that loses the claim finds the winner's claim (it
//!   carries the hash's low bits) and waits a moment for it to be published; inserts that
//!   claimed two different positions both look again from home afterwards, and the later
//!   position gives its counts to the earlier one and frees itself.
//! * Empty positions never come back (a freed key leaves a tomb), so a key is never past
//!   an empty position of its window: probes stop at the first empty one.
//! * A request path that finds no free position takes over a drained key of its window
//!   (nothing counted, nothing in flight, fill 0); a key that still limits someone is never
//!   taken. The sync agent frees drained keys too (without news for a minute, or any
//!   drained one in a nearly full table: `Limiter::sweep_keys`), and those wait
//!   [`GRACE_MS`] before reuse, so a reader that found the slot an instant before never
//!   sees another key's numbers. A drained key a request path takes over has no such
//!   rest (the new key needs the place now): a request of the old key that found it a few
//!   nanoseconds before may be decided on the new key's numbers (an empty bucket, so it
//!   passes, as on the drained one) and count its units there and on the new key's
//!   parent. That is one request's units out of place, on two buckets that were empty.
//!   The agent's fold of a root's report into a key it found (checked by id, then
//!   written) has the same window: a new key published in it may start from the old
//!   key's reported fill, which drains as any fill does.
//! * The writer gives keys new template numbers (a template changed) with each key
//!   claimed meanwhile, so that no request path evicts it between the load of its id and
//!   the stores; and it bumps the key generation first, so that an insert that read the
//!   template before the change and was still a claim when the walk passed sees it and
//!   inserts its key again (`Limiter::publish_key`). The same holds for the cluster's
//!   secret. An agent killed inside such a rewrite leaves its claim over the key: the
//!   key's requests share the template's bucket until the sweep frees the claim (10 s),
//!   and its counts are lost, as for a key evicted.
//! * `KEYS_LIVE` counts claims as the keys they become: whoever frees a claim (its
//!   inserter, or the sweep when the inserter died) uncounts it.
//! * An inserter that dies between its claim and its publish leaves a claim; the agent's
//!   sweep frees a claim it finds again at least 10 s after it first saw it (a pass of the
//!   sweep takes 16 rounds while the table is over half full, up to 256 below). One that
//!   was only stopped that long finds, when it resumes, that its claim is gone, and
//!   publishes nothing ([`KeyTable::publish`]).

use super::slot::{Slot, HIGH, ID, LIMIT, LOW, NAME, TAG_PARENT};
use super::{Layout, SLOT_WORDS};
use siphasher::sip::SipHasher13;
use siphasher::sip128::{Hasher128, SipHasher13 as SipHasher128};
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// How far from its home a key may be. Sixteen slots of 128 bytes: the probe of a missing
/// name loads them together.
pub(crate) const WINDOW: u32 = 16;
/// How long a key freed by the agent rests before its slot takes another key.
pub(crate) const GRACE_MS: u64 = 2_000;
/// Word 15: the template's slot + 1.
pub(crate) const TEMPLATE: usize = 15;

const STATE: u64 = 0b11 << 62;
const KEY: u64 = 0b10 << 62;
const CLAIM: u64 = 0b11 << 62;
const TOMB: u64 = 0b01 << 62;
const LOW62: u64 = (1 << 62) - 1;

/// Whether a word 0 holds a key's wire id (a live key).
#[inline]
pub(crate) fn is_key_id(id: u64) -> bool {
    id & STATE == KEY
}

/// Whether a word 0 holds a claim (a key being inserted).
#[inline]
pub(crate) fn is_claim(id: u64) -> bool {
    id & STATE == CLAIM
}

/// The low bits of a claim that tell one insert of a name from another (20: the time in
/// seconds, which wraps after 12 days).
const NONCE: u64 = (1 << 20) - 1;

/// A claim for a name whose hash starts with `h0`, by the insert that drew `nonce`: its
/// hash bits tell an insert of the same name that it is under way, its nonce tells the
/// insert that it is still its own (see [`KeyTable::publish`]).
#[inline]
pub(crate) fn claimed(h0: u64, nonce: u64) -> u64 {
    CLAIM | h0 & LOW62 & !NONCE | nonce & NONCE
}

/// A request path's claim for a name whose hash starts with `h0`, at `now_ms`: its nonce
/// is the time in (binary) seconds, never 0 (the writer's, see [`writer_claim`]), so
/// another insert's claim of the same name at this place, which comes at least 12 s
/// later (see [`KeyTable::publish`]), is another word.
#[inline]
pub(crate) fn insert_claim(h0: u64, now_ms: u64) -> u64 {
    claimed(h0, ((now_ms >> 10) & NONCE).max(1))
}

/// The writer's claim over a live key whose hash starts with `h0`, while it gives the key
/// new numbers: readers of the name wait for it as for an insert.
#[inline]
pub(crate) fn writer_claim(h0: u64) -> u64 {
    claimed(h0, 0)
}

/// Whether `id` is a claim of the writer's over a live key ([`writer_claim`]).
#[inline]
pub(crate) fn is_writer_claim(id: u64) -> bool {
    is_claim(id) && id & NONCE == 0
}

/// Whether `id` is a claim for a name whose hash starts with `h0`, by any insert.
#[inline]
fn claims_name(id: u64, h0: u64) -> bool {
    is_claim(id) && (id ^ h0) & LOW62 & !NONCE == 0
}

/// A freed slot, freed at `ms`.
#[inline]
pub(crate) fn tomb(ms: u64) -> u64 {
    TOMB | ms & LOW62
}

/// The wire id of a key named `raw` (the bytes requests gave), derived with the cluster's
/// secret so that every limiter and root of a cluster gives a name the same id, and nobody
/// without the secret can aim a name at another's id. Quota ids from the database stay
/// below 2^62, so the two never meet.
pub fn key_id(secret: (u64, u64), raw: &[u8]) -> u64 {
    let mut h = SipHasher13::new_with_keys(secret.0, secret.1);
    h.write(raw);
    KEY | h.finish() & LOW62
}

/// The low half of word 1 in the slot of key `id` once the sync agent's writer (the one
/// stamped `token`) knows the key by its id (see `Limiter::learn_keys`): each round then
/// skips, for the keys it meets again, the lookup of the id among the million it knows, a
/// cache miss each. Never 0, which a request path writes when it publishes a key. A
/// fingerprint of the id and the writer's token rather than a flag: a mark the writer sets
/// just as another key takes the slot names the key it was meant for, and a writer that
/// takes over (a new token) trusts no mark of the one before, whose map it did not see.
#[inline]
pub(crate) fn known_mark(id: u64, token: u64) -> u32 {
    ((id ^ token.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 | 1
}

/// The 128-bit hash that names a key in a block, keyed by the block's own secret.
#[inline]
pub(crate) fn name_hash(secret: (u64, u64), raw: &[u8]) -> (u64, u64) {
    let mut h = SipHasher128::new_with_keys(secret.0, secret.1);
    h.write(raw);
    let h = h.finish128();
    (h.h1, h.h2)
}

/// What a probe found.
pub(crate) enum Probe {
    /// The key's position.
    Found(u32),
    /// Not in its window; a free position to claim (with the word 0 it holds now), if any.
    Absent(Option<(u32, u64)>),
    /// Another request path is inserting this name right now.
    Busy,
}

/// The key table of a block.
#[derive(Clone, Copy)]
pub(crate) struct KeyTable<'a> {
    w: &'a [AtomicU64],
    base: usize,
    cap: u32,
}

impl<'a> KeyTable<'a> {
    pub fn new(w: &'a [AtomicU64], l: &Layout) -> Self {
        KeyTable { w, base: l.keys, cap: l.key_cap }
    }

    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// The slot at `pos` (`pos < cap`).
    #[inline]
    pub fn slot(&self, pos: u32) -> Option<Slot<'a>> {
        if pos >= self.cap {
            return None;
        }
        let at = self.base + pos as usize * SLOT_WORDS;
        Some(Slot(self.w.get(at..at + SLOT_WORDS)?.try_into().ok()?))
    }

    #[inline]
    fn home(&self, h0: u64) -> u32 {
        ((u128::from(h0) * u128::from(self.cap)) >> 64) as u32
    }

    /// Looks `h` up in its window; `now_ms` decides which freed slots may be reused.
    #[inline]
    pub fn probe(&self, h: (u64, u64), now_ms: u64) -> Probe {
        if self.cap == 0 {
            return Probe::Absent(None);
        }
        let home = self.home(h.0);
        let mut free = None;
        for i in 0..WINDOW.min(self.cap) {
            let pos = (home + i) % self.cap;
            let Some(s) = self.slot(pos) else { break };
            let id = s.id();
            match id & STATE {
                0 => {
                    free = free.or(Some((pos, 0)));
                    break;
                }
                KEY => {
                    if s.get(NAME) == h.0 && s.get(NAME + 1) == h.1 {
                        return Probe::Found(pos);
                    }
                }
                CLAIM => {
                    if claims_name(id, h.0) {
                        return Probe::Busy;
                    }
                }
                _ => {
                    let freed = id & LOW62;
                    if free.is_none() && now_ms.saturating_sub(freed) >= GRACE_MS {
                        free = Some((pos, id));
                    }
                }
            }
        }
        Probe::Absent(free)
    }

    /// Claims `pos` (holding `old`) with the claim word `mine` (see [`claimed`]); false
    /// when someone else changed it first.
    pub fn claim(&self, pos: u32, old: u64, mine: u64) -> bool {
        self.slot(pos)
            .is_some_and(|s| s.w(ID).compare_exchange(old, mine, Acquire, Relaxed).is_ok())
    }

    /// Fills the slot `pos`, claimed with `mine`, for key `h` of template slot `template`
    /// (its limits and parent given), then publishes it under `id`; false when the claim
    /// no longer stands.
    ///
    /// A claim stands until its inserter publishes it, or until the agent's sweep takes it
    /// for a dead inserter's (it stood 10 s) and frees it, after which another key may take
    /// the place ([`GRACE_MS`] on), another insert of this very name too. An inserter that
    /// was only stopped that long (a worker held by `SIGSTOP`, a paused VM) must then not
    /// write its words over the other key's: it checks its claim (its nonce tells it from
    /// another insert's of the name) before it writes, and turns the claim into the id by a
    /// compare-and-swap, so a key is published only from its own claim. What stays open is
    /// a stop of over 12 s between that check and the swap (eight stores), which can leave
    /// another key's slot with some of these words; the swap still fails, so this inserter
    /// reports its key as not published.
    #[allow(clippy::too_many_arguments)]
    pub fn publish(
        &self,
        pos: u32,
        mine: u64,
        h: (u64, u64),
        id: u64,
        template: u32,
        limits: (u64, u64, u64),
        parent: u32,
    ) -> bool {
        let Some(s) = self.slot(pos) else { return false };
        if s.w(ID).load(Acquire) != mine {
            return false;
        }
        s.clear_counters();
        s.w(NAME).store(h.0, Relaxed);
        s.w(NAME + 1).store(h.1, Relaxed);
        s.w(TEMPLATE).store(u64::from(template) + 1, Relaxed);
        s.w(LIMIT).store(limits.0, Relaxed);
        s.w(LOW).store(limits.1, Relaxed);
        s.w(HIGH).store(limits.2, Relaxed);
        s.w(TAG_PARENT).store(u64::from(parent) << 32, Relaxed);
        // SeqCst, not only Release: the insert's check of the key generation after it
        // relies on it (`Limiter::publish_key`).
        s.w(ID).compare_exchange(mine, id, SeqCst, Relaxed).is_ok()
    }

    /// Frees `pos` if it still holds `id` (a key or a claim), as of `now_ms`.
    pub fn free(&self, pos: u32, id: u64, now_ms: u64) -> bool {
        self.slot(pos)
            .is_some_and(|s| s.w(ID).compare_exchange(id, tomb(now_ms), AcqRel, Relaxed).is_ok())
    }

    /// Positions of the window of `h` before `pos`, in probe order.
    pub fn before(&self, h0: u64, pos: u32) -> impl Iterator<Item = u32> + '_ {
        let home = self.home(h0);
        let dist = (pos + self.cap - home) % self.cap.max(1);
        (0..dist).map(move |i| (home + i) % self.cap)
    }

    /// The window of `h`, in probe order.
    pub fn window(&self, h0: u64) -> impl Iterator<Item = u32> + '_ {
        let home = self.home(h0);
        (0..WINDOW.min(self.cap)).map(move |i| (home + i) % self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::{format_new, Block};

    #[test]
    fn states_do_not_meet() {
        let id = key_id((1, 2), b"api_key_abc");
        assert!(is_key_id(id));
        assert!(!is_key_id(0) && !is_key_id(claimed(id, 3)) && !is_key_id(tomb(5)));
        assert!(claims_name(claimed(id, 3), id) && claims_name(claimed(id, 4), id));
        assert_ne!(claimed(id, 3), claimed(id, 4));
        assert!(!claims_name(claimed(id, 3), id ^ 1 << 40));
        assert!(!is_key_id(12345), "database ids are not key ids");
        assert_ne!(key_id((1, 2), b"api_key_abc"), key_id((1, 3), b"api_key_abc"));
        assert_ne!(key_id((1, 2), b"api_key_abc"), key_id((1, 2), b"api_key_abd"));
        assert_ne!(name_hash((1, 2), b"a"), name_hash((1, 2), b"b"));
    }

    #[test]
    fn insert_find_free_and_reuse_after_the_grace() {
        let b = Block::for_capacity(64, 64);
        let l = format_new(&b, 64).unwrap();
        let t = KeyTable::new(b.words(), &l);
        let h = name_hash((7, 7), b"k1");
        let Probe::Absent(Some((pos, old))) = t.probe(h, 10_000) else { panic!() };
        assert!(t.claim(pos, old, claimed(h.0, 1)));
        assert!(matches!(t.probe(h, 10_000), Probe::Busy), "a claim in progress");
        assert!(!t.claim(pos, old, claimed(h.0, 2)), "claimed once");
        assert!(!t.publish(pos, claimed(h.0, 2), h, 5, 3, (1, 1, 1), 0), "not its claim");
        assert!(t.publish(
            pos,
            claimed(h.0, 1),
            h,
            key_id((1, 1), b"k1"),
            3,
            (1000, 5000, 5000),
            0
        ));
        assert!(matches!(t.probe(h, 10_000), Probe::Found(p) if p == pos));
        assert_eq!(t.slot(pos).unwrap().get(LIMIT), 1000);
        let id = t.slot(pos).unwrap().id();
        assert!(t.free(pos, id, 10_000));
        // Freed: not found; its slot rests before it takes a key again.
        let Probe::Absent(free) = t.probe(h, 10_500) else { panic!() };
        assert_ne!(free.map(|f| f.0), Some(pos));
        let Probe::Absent(Some((again, _))) = t.probe(h, 12_001) else { panic!() };
        assert_eq!(again, pos);
    }
}
