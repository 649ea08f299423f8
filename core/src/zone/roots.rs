//! The sync engine's state per root, kept in the block: a new sync agent (after `nginx -s
//! reload`, or when the worker that ran the agent died) continues every root session where
//! the previous one left it, and any process can show every root's health.
//!
//! An entry is keyed by a hash of the root's URL; entries of roots no longer configured are
//! reused, least recently used first.

use super::layout::word_table;
use super::{Layout, MAX_ROOTS, ROOT_WORDS};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Upper bounds (µs) of the sync latency histogram buckets; one more bucket counts the rest.
pub const LATENCY_BUCKETS_US: [u64; 12] =
    [250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000];

word_table! { FIELDS:
    pub(crate) const URL_HASH = 0;
    pub(crate) const INSTANCE = 1;
    pub(crate) const SINCE = 2;
    pub(crate) const ACKED = 3;
    /// Bit 0: the next request carries hints.
    pub(crate) const FLAGS = 4;
    pub(crate) const SKIP = 5;
    pub(crate) const PENDING = 6;
    /// 0 never called, 1 last call succeeded, 2 last call failed.
    pub(crate) const OK = 7;
    pub(crate) const LAST_ATTEMPT = 8;
    pub(crate) const LAST_SUCCESS = 9;
    pub(crate) const LATENCY_US = 10;
    pub(crate) const SUCCESSES = 11;
    pub(crate) const FAILURES = 12;
    pub(crate) const CONSECUTIVE = 13;
    pub(crate) const LAST_USED = 14;
    pub(crate) const ERR_LEN = 15;
    pub(crate) const ERR = 16;
    /// Histogram: one count per bucket of [`LATENCY_BUCKETS_US`], then the overflow bucket,
    /// then the sum of latencies in µs.
    pub(crate) const HIST = 32;
    pub(crate) const HIST_SUM = HIST + LATENCY_BUCKETS_US.len() + 1;
}

/// Bytes of the last error kept.
pub(crate) const ERR_BYTES: usize = 128;

pub(crate) const FLAG_HINTS: u64 = 1;

/// The hash that keys a root's entry (FNV-1a; never 0).
pub(crate) fn url_hash(url: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in url.trim_end_matches('/').bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

#[derive(Clone, Copy)]
pub(crate) struct Entry<'a>(&'a [AtomicU64]);

impl Entry<'_> {
    #[inline]
    pub fn get(&self, f: usize) -> u64 {
        self.0[f].load(Relaxed)
    }

    #[inline]
    pub fn set(&self, f: usize, v: u64) {
        self.0[f].store(v, Relaxed);
    }

    pub fn add(&self, f: usize, v: u64) {
        self.0[f].fetch_add(v, Relaxed);
    }

    fn reset(&self, hash: u64) {
        for w in &self.0[1..] {
            w.store(0, Relaxed);
        }
        self.0[URL_HASH].store(hash, Relaxed);
    }

    pub fn set_error(&self, e: &str) {
        let b = e.as_bytes();
        let n = b.len().min(ERR_BYTES);
        for i in 0..ERR_BYTES / 8 {
            let mut w = [0u8; 8];
            for (k, x) in w.iter_mut().enumerate() {
                *x = b.get(i * 8 + k).copied().filter(|_| i * 8 + k < n).unwrap_or(0);
            }
            self.set(ERR + i, u64::from_le_bytes(w));
        }
        self.set(ERR_LEN, n as u64);
    }

    pub fn error(&self) -> Option<String> {
        let n = (self.get(ERR_LEN) as usize).min(ERR_BYTES);
        if n == 0 {
            return None;
        }
        let bytes: Vec<u8> =
            (0..ERR_BYTES / 8).flat_map(|i| self.get(ERR + i).to_le_bytes()).take(n).collect();
        // A cut in the middle of a UTF-8 sequence is replaced, not refused.
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub fn observe_latency(&self, us: u64) {
        let b =
            LATENCY_BUCKETS_US.iter().position(|&ub| us <= ub).unwrap_or(LATENCY_BUCKETS_US.len());
        self.add(HIST + b, 1);
        self.add(HIST_SUM, us);
    }

    /// Non-cumulative counts per bucket (the last is the overflow) and the sum in µs.
    pub fn histogram(&self) -> ([u64; LATENCY_BUCKETS_US.len() + 1], u64) {
        (std::array::from_fn(|i| self.get(HIST + i)), self.get(HIST_SUM))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Roots<'a> {
    w: &'a [AtomicU64],
    base: usize,
}

impl<'a> Roots<'a> {
    pub fn new(w: &'a [AtomicU64], l: &Layout) -> Self {
        Roots { w, base: l.roots }
    }

    pub fn entry(&self, i: usize) -> Entry<'a> {
        let at = self.base + (i % MAX_ROOTS) * ROOT_WORDS;
        Entry(&self.w[at..at + ROOT_WORDS])
    }

    /// The entry of `url`, if one exists.
    pub fn find(&self, url: &str) -> Option<Entry<'a>> {
        let h = url_hash(url);
        (0..MAX_ROOTS).map(|i| self.entry(i)).find(|e| e.get(URL_HASH) == h)
    }

    /// The entries of `urls`, claiming free or stale entries for new ones (least recently
    /// used first, never one of `urls`). Only the sync agent calls this.
    pub fn claim(&self, urls: &[String], now: u64) -> Vec<usize> {
        let hashes: Vec<u64> = urls.iter().map(|u| url_hash(u)).collect();
        let mut out = Vec::with_capacity(urls.len());
        for &h in &hashes {
            let i = match (0..MAX_ROOTS).find(|&i| self.entry(i).get(URL_HASH) == h) {
                Some(i) => i,
                None => {
                    let i = (0..MAX_ROOTS)
                        .filter(|&i| !hashes.contains(&self.entry(i).get(URL_HASH)))
                        .min_by_key(|&i| {
                            let e = self.entry(i);
                            (e.get(URL_HASH) != 0, e.get(LAST_USED))
                        })
                        .unwrap_or(0);
                    self.entry(i).reset(h);
                    i
                }
            };
            self.entry(i).set(LAST_USED, now.max(1));
            out.push(i);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::{format_new, Block};

    #[test]
    fn entries_are_claimed_kept_and_recycled() {
        let b = Block::heap(1 << 20);
        let l = format_new(&b, 0).unwrap();
        let r = Roots::new(b.words(), &l);
        let urls: Vec<String> = (0..3).map(|i| format!("http://r{i}:7700")).collect();
        let first = r.claim(&urls, 10);
        r.entry(first[1]).set(SINCE, 42);
        assert_eq!(r.claim(&urls, 20), first, "the same entries again");
        assert_eq!(
            r.find("http://r1:7700/").unwrap().get(SINCE),
            42,
            "a trailing / is the same root"
        );
        // Fill every entry with other roots: the least recently used go first, never ours.
        let many: Vec<String> = (0..MAX_ROOTS).map(|i| format!("http://x{i}")).collect();
        r.claim(&many, 30);
        assert!(r.find("http://r1:7700").is_none());
        assert_eq!(r.claim(&urls[..1], 40).len(), 1);
    }

    #[test]
    fn errors_and_histogram() {
        let b = Block::heap(1 << 20);
        let l = format_new(&b, 0).unwrap();
        let e = Roots::new(b.words(), &l).entry(0);
        assert_eq!(e.error(), None);
        e.set_error("connection failed");
        assert_eq!(e.error().as_deref(), Some("connection failed"));
        e.set_error(&"é".repeat(100));
        assert_eq!(e.error().unwrap().chars().count(), 64);
        for us in [100, 300, 2_000_000] {
            e.observe_latency(us);
        }
        let (h, sum) = e.histogram();
        assert_eq!((h[0], h[1], h[LATENCY_BUCKETS_US.len()], sum), (1, 1, 1, 2_000_400));
    }
}
