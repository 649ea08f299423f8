//! A set of slot numbers as a bitmap.
//!
//! The engine visits its active counters every round: in slot order, the block's own
//! address order, which the hardware prefetcher follows, where a hash set hands them out at
//! random; and inserting one costs a bit, not a hash. A million slots take 128 KiB.

/// Slot numbers, as bits of words grown on demand.
#[derive(Debug, Default, Clone)]
pub(crate) struct SlotSet {
    words: Vec<u64>,
    len: usize,
}

impl SlotSet {
    /// Adds `s`; `false` if it was there.
    pub fn insert(&mut self, s: u32) -> bool {
        let (w, bit) = ((s / 64) as usize, 1u64 << (s % 64));
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        if self.words[w] & bit != 0 {
            return false;
        }
        self.words[w] |= bit;
        self.len += 1;
        true
    }

    #[cfg(test)]
    pub fn contains(&self, s: u32) -> bool {
        self.words.get((s / 64) as usize).is_some_and(|w| w & (1u64 << (s % 64)) != 0)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slots, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| Bits(w).map(move |b| i as u32 * 64 + b))
    }

    /// Keeps the slots `keep` says yes to, visiting them in increasing order, and hands
    /// each run of about `chunk` slots to `ahead` before `keep` sees them one by one: the
    /// caller loads their memory in one go (see `CounterAccess::warm`) rather than missing
    /// on each in turn, misses that would take most of the walk's time.
    pub fn retain_in_chunks(
        &mut self,
        chunk: usize,
        mut ahead: impl FnMut(&[u32]),
        mut keep: impl FnMut(u32) -> bool,
    ) {
        let mut run = Vec::with_capacity(chunk + 64);
        let mut next = 0;
        while next < self.words.len() {
            run.clear();
            while next < self.words.len() && run.len() < chunk {
                run.extend(Bits(self.words[next]).map(|b| next as u32 * 64 + b));
                next += 1;
            }
            ahead(&run);
            for &s in &run {
                if !keep(s) {
                    self.words[(s / 64) as usize] &= !(1u64 << (s % 64));
                    self.len -= 1;
                }
            }
        }
    }
}

impl Extend<u32> for SlotSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for s in iter {
            self.insert(s);
        }
    }
}

/// The set bits of a word, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let b = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn behaves_as_an_ordered_set(
            ops in prop::collection::vec((0u32..2000, 0u8..3), 0..400),
            cut in 0u32..2000,
            chunk in 1usize..200,
        ) {
            let (mut set, mut model) = (SlotSet::default(), BTreeSet::new());
            for (s, op) in ops {
                match op {
                    0 | 1 => prop_assert_eq!(set.insert(s), model.insert(s)),
                    _ => prop_assert_eq!(set.contains(s), model.contains(&s)),
                }
            }
            prop_assert_eq!(set.len(), model.len());
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            let mut visited = Vec::new();
            let mut ahead = Vec::new();
            set.retain_in_chunks(chunk, |run| ahead.extend_from_slice(run), |s| {
                visited.push(s);
                s < cut
            });
            prop_assert_eq!(&ahead, &visited);
            prop_assert_eq!(visited, model.iter().copied().collect::<Vec<_>>());
            model.retain(|&s| s < cut);
            prop_assert_eq!(set.len(), model.len());
            prop_assert_eq!(set.is_empty(), model.is_empty());
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), model.into_iter().collect::<Vec<_>>());
        }
    }
}
