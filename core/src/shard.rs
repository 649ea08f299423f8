//! Sharded roots: the counter space split across groups of roots.
//!
//! With `N` shards, the counter of quota `id` lives in shard [`Shard::of`]`(id, N)`: only
//! that shard's roots aggregate it, and a limiter sends that counter's deltas (and hints)
//! only to them, still to every root of the shard, taking the max over their answers.
//! Quotas themselves (names, limits, epochs) keep coming from every root, since all roots
//! read the same quota database. A parent chain needs nothing special: accounting adds to
//! every counter of the chain, and each counter's delta goes to its own shard, so a child
//! on shard 0 and its parent on shard 1 are each summed where they live.
//!
//! The shard of an id is a hash, not `id % N`: quotas are often created in patterns (a
//! parent, then its children), and consecutive ids would otherwise put every parent on the
//! same shard.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// One shard of `count`: `index` in `0..count`. Written `index/count`, e.g. `0/2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// This shard, from 0.
    pub index: u32,
    /// How many shards the counter space is split into.
    pub count: u32,
}

/// Most shards: the limiter's block keeps at most 64 roots, and every shard needs one.
pub const MAX_SHARDS: u32 = 64;

impl Shard {
    /// The shard (of `count`) that holds the counter of quota `id`.
    pub fn of(id: u64, count: u32) -> u32 {
        if count <= 1 {
            return 0;
        }
        // splitmix64's finalizer: every bit of the id moves every bit of the hash.
        let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % u64::from(count)) as u32
    }

    /// Whether this shard holds the counter of quota `id`.
    pub fn holds(&self, id: u64) -> bool {
        Shard::of(id, self.count) == self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Why a shard could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("shard must be INDEX/COUNT with COUNT from 1 to 64 and INDEX below COUNT, e.g. 0/2")]
pub struct ShardError;

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Shard, ShardError> {
        let (i, n) = s.split_once('/').ok_or(ShardError)?;
        let index: u32 = i.trim().parse().map_err(|_| ShardError)?;
        let count: u32 = n.trim().parse().map_err(|_| ShardError)?;
        if count == 0 || count > MAX_SHARDS || index >= count {
            return Err(ShardError);
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_show() {
        assert_eq!("1/2".parse(), Ok(Shard { index: 1, count: 2 }));
        assert_eq!(Shard { index: 0, count: 3 }.to_string(), "0/3");
        for bad in ["2/2", "0/0", "1", "a/b", "0/65", "-1/2"] {
            assert_eq!(bad.parse::<Shard>(), Err(ShardError), "{bad}");
        }
    }

    #[test]
    fn ids_spread_evenly_and_stably() {
        let mut n = [0u32; 4];
        for id in 1..=100_000u64 {
            n[Shard::of(id, 4) as usize] += 1;
        }
        assert!(n.iter().all(|&c| (24_000..26_000).contains(&c)), "{n:?}");
        // The function is part of the protocol: roots and limiters of any build agree.
        assert_eq!(
            (1..=8).map(|id| Shard::of(id, 2)).collect::<Vec<_>>(),
            vec![1, 0, 1, 0, 0, 0, 1, 0]
        );
        assert_eq!(Shard::of(12345, 1), 0);
    }
}
