//! Time sources. Everything in this crate takes time from a [`Clock`], so tests drive it with
//! a [`ManualClock`] and never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic clock in nanoseconds since an arbitrary start.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's start. Must never go backwards.
    fn now_nanos(&self) -> u64;
}

/// The process's monotonic clock ([`Instant`]), counted from construction.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    /// A clock that reads 0 now.
    pub fn new() -> Self {
        MonotonicClock { start: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_nanos(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `nanos`.
    pub fn at(nanos: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(nanos)))
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Sets the time; refuses to go backwards (keeps the later value).
    pub fn set(&self, nanos: u64) {
        self.0.fetch_max(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_nanos(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_is_shared_and_monotonic() {
        let c = ManualClock::at(5);
        let d = c.clone();
        c.advance(Duration::from_nanos(10));
        assert_eq!(d.now_nanos(), 15);
        d.set(3);
        assert_eq!(c.now_nanos(), 15);
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let a = c.now_nanos();
        let b = c.now_nanos();
        assert!(b >= a);
    }
}
