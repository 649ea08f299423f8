//! Variable-size records in the block: the part of a name beyond what a slot holds inline,
//! and the parent name of a quota whose parent has not arrived yet.
//!
//! Records are whole words, 1 to [`MAX_RECORD`] of them, addressed by their offset from the
//! arena's start (0 means "none"). Freed records go on a free list of their exact size, so
//! the arena never fragments into pieces no record can use: a name of 40 bytes always finds
//! the room a deleted 40-byte name left. Only the writer allocates and frees; readers only
//! load words of records they reached through a live slot.

use super::{hdr, Layout};
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Largest record, in words: a 255-byte name with its length byte.
pub(crate) const MAX_RECORD: usize = 32;

pub(crate) struct Arena<'a> {
    w: &'a [AtomicU64],
    base: usize,
    len: u32,
}

impl<'a> Arena<'a> {
    pub fn new(w: &'a [AtomicU64], l: &Layout) -> Self {
        Arena { w, base: l.arena, len: l.arena_words }
    }

    /// Word `i` of the record at `off`; 0 outside the arena.
    #[inline]
    pub fn word(&self, off: u32, i: usize) -> u64 {
        let at = off as usize + i;
        if off == 0 || at >= self.len as usize {
            return 0;
        }
        self.w[self.base + at].load(Relaxed)
    }

    pub fn set(&self, off: u32, i: usize, v: u64) {
        let at = off as usize + i;
        if off != 0 && at < self.len as usize {
            self.w[self.base + at].store(v, Relaxed);
        }
    }

    /// A record of `n` words (1..=MAX_RECORD), or `None` when the arena is full.
    pub fn alloc(&self, n: usize) -> Option<u32> {
        debug_assert!((1..=MAX_RECORD).contains(&n));
        let head = &self.w[hdr::ARENA_FREE + n];
        let off = head.load(Relaxed) as u32;
        if off != 0 {
            head.store(self.word(off, 0), Relaxed);
            self.w[hdr::ARENA_FREE_WORDS].fetch_sub(n as u64, Relaxed);
            return Some(off);
        }
        let bump = &self.w[hdr::ARENA_BUMP];
        let at = bump.load(Relaxed);
        if at + n as u64 > u64::from(self.len) {
            return None;
        }
        bump.store(at + n as u64, Relaxed);
        Some(at as u32)
    }

    pub fn free(&self, off: u32, n: usize) {
        if off == 0 || !(1..=MAX_RECORD).contains(&n) {
            return;
        }
        let head = &self.w[hdr::ARENA_FREE + n];
        self.set(off, 0, head.load(Relaxed));
        head.store(u64::from(off), Relaxed);
        self.w[hdr::ARENA_FREE_WORDS].fetch_add(n as u64, Relaxed);
    }
}

/// Names as words: a length byte, then the bytes, zero-padded to whole words. A slot keeps
/// the first [`INLINE`] words; the rest is an arena record.
pub(crate) mod name {
    /// Words of a name kept inside the slot (the length byte and 23 bytes of name).
    pub const INLINE: usize = 3;

    /// Words of the encoded name.
    #[inline]
    pub fn words(name: &[u8]) -> usize {
        (name.len() + 1).div_ceil(8)
    }

    /// Word `i` of the encoded name.
    #[inline]
    pub fn word(name: &[u8], i: usize) -> u64 {
        let mut b = [0u8; 8];
        let (dst, from) = if i == 0 {
            b[0] = name.len() as u8;
            (1, 0)
        } else {
            (0, i * 8 - 1)
        };
        if from < name.len() {
            let n = (8 - dst).min(name.len() - from);
            b[dst..dst + n].copy_from_slice(&name[from..from + n]);
        }
        u64::from_le_bytes(b)
    }

    /// Words beyond the inline part (0 for names up to 23 bytes).
    #[inline]
    pub fn tail_words(name: &[u8]) -> usize {
        words(name).saturating_sub(INLINE)
    }

    /// Decodes words (length byte first) into bytes.
    pub fn decode(mut get: impl FnMut(usize) -> u64) -> Vec<u8> {
        let first = get(0).to_le_bytes();
        let len = first[0] as usize;
        let mut out = Vec::with_capacity(len);
        let mut i = 0;
        while out.len() < len {
            let w = get(i).to_le_bytes();
            let from = if i == 0 { 1 } else { 0 };
            for &b in &w[from..] {
                if out.len() == len {
                    break;
                }
                out.push(b);
            }
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zone::{format_new, Block};

    #[test]
    fn names_encode_and_decode() {
        for n in ["", "a", "s3_bucket-0123456_read", "exactly-23-bytes-long-x", &"z".repeat(255)] {
            let b = n.as_bytes();
            let words: Vec<u64> = (0..name::words(b)).map(|i| name::word(b, i)).collect();
            assert_eq!(name::decode(|i| words[i]), b);
        }
        assert_eq!(name::tail_words(b"exactly-23-bytes-long-x"), 0);
        assert_eq!(name::tail_words(b"exactly-24-bytes-long-xy"), 1);
        assert_eq!(name::words(&[b'z'; 255]), MAX_RECORD);
    }

    #[test]
    fn exact_size_free_lists_and_full_arena() {
        let b = Block::heap(1 << 20);
        let l = format_new(&b, 0).unwrap();
        let a = Arena::new(b.words(), &l);
        let x = a.alloc(3).unwrap();
        let y = a.alloc(5).unwrap();
        assert_eq!((x, y), (1, 4));
        a.free(x, 3);
        assert_eq!(a.alloc(5).unwrap(), 9, "a 3-word hole does not take 5 words");
        assert_eq!(a.alloc(3).unwrap(), x, "but a 3-word record reuses it");
        let mut n = 0;
        while a.alloc(MAX_RECORD).is_some() {
            n += 1;
        }
        assert!(n > 0 && a.alloc(MAX_RECORD).is_none());
        assert_eq!(a.word(0, 0), 0);
        assert_eq!(a.word(u32::MAX, 0), 0, "out of range reads are 0");
    }
}
