//! The host's side: the permit words every worker shares, and the agent's book of what each
//! root granted.

use super::{lease_margin, Grant, Report};
use std::sync::atomic::{AtomicU64, Ordering};

/// Shares are at most this (24 bits), so a share and its lease end fit one atomic word and a
/// request never reads a share with another share's lease.
pub const MAX_SHARE: u32 = (1 << 24) - 1;

const NS_PER_MS: u64 = 1_000_000;

/// Words of one counter's permits.
pub const PERMIT_WORDS: usize = 3;
/// Requests in flight (low 32 bits), and the word's generation (high 32 bits): a permit
/// entry made anew for another counter starts a generation, so a release that found the
/// entry still its counter's and then stalled cannot take a slot of the next counter's.
pub(crate) const IN_FLIGHT: usize = 0;
const COUNT: u64 = 0xFFFF_FFFF;
/// `share | lease end in ms << 24`: the share counts while `now` is before the end.
pub(crate) const SHARE: usize = 1;
/// Acquires admitted (low 32 bits) and refused (high 32 bits) since the agent last took
/// them: one word, one cache line with the others. Four billion acquires within one round
/// would carry into the refusals.
pub(crate) const ROUND: usize = 2;
const REFUSED_ONE: u64 = 1 << 32;

/// One concurrency counter's permits on one host: [`PERMIT_WORDS`] plain words (atomics,
/// no pointers), so they can live in a memory block shared by processes, which hands out
/// this view of them. Acquire and release are lock-free and wait for no one: the agent
/// publishes shares with one store.
#[derive(Debug, Clone, Copy)]
pub struct Permits<'a>(&'a [AtomicU64; PERMIT_WORDS]);

/// Permits of one's own (a test, a simulation, a process that shares no memory).
#[derive(Debug, Default)]
pub struct PermitWords([AtomicU64; PERMIT_WORDS]);

impl PermitWords {
    /// The view that acquires, releases and reports.
    pub fn view(&self) -> Permits<'_> {
        Permits(&self.0)
    }

    /// The share word as stored (for the zone layout's golden test).
    #[cfg(test)]
    pub(crate) fn share_word(&self) -> u64 {
        self.0[SHARE].load(Ordering::Relaxed)
    }
}

impl<'a> Permits<'a> {
    /// The permits held in `words`.
    pub fn new(words: &'a [AtomicU64; PERMIT_WORDS]) -> Self {
        Permits(words)
    }

    fn w(&self, i: usize) -> &AtomicU64 {
        &self.0[i]
    }

    /// Admits one more request in flight if the host's share, unexpired at `now` (ns on the
    /// limiter's monotonic clock), has room; counts a refusal otherwise.
    pub fn acquire(&self, now: u64) -> bool {
        self.acquire_in(now).is_some()
    }

    /// [`acquire`](Self::acquire), with the generation the slot was taken in (see
    /// [`release_in`](Self::release_in)).
    pub(crate) fn acquire_in(&self, now: u64) -> Option<u32> {
        let share = u64::from(self.share(now));
        let in_flight = self.w(IN_FLIGHT);
        let mut cur = in_flight.load(Ordering::Relaxed);
        loop {
            // A share is below 2^24, so the count never carries into the generation.
            if cur & COUNT >= share {
                self.w(ROUND).fetch_add(REFUSED_ONE, Ordering::Relaxed);
                return None;
            }
            match in_flight.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.w(ROUND).fetch_add(1, Ordering::Relaxed);
                    return Some((cur >> 32) as u32);
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Counts one more request in flight whatever the share: one admitted on another
    /// counter's slot (a key new to the host, on its template's), which must still count
    /// here so that the key's own share, once granted, covers every request of it the host
    /// runs, and the roots hear of it.
    pub fn add(&self) {
        self.add_in();
    }

    /// [`add`](Self::add), with the generation counted in.
    pub(crate) fn add_in(&self) -> u32 {
        let was = self.w(IN_FLIGHT).fetch_add(1, Ordering::AcqRel);
        self.w(ROUND).fetch_add(1, Ordering::Relaxed);
        (was >> 32) as u32
    }

    /// Ends one request admitted by [`acquire`](Self::acquire). Never goes below zero: a
    /// release without its acquire (a bug elsewhere) must not open a slot for free.
    pub fn release(&self) {
        let _ = self
            .w(IN_FLIGHT)
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| (v & COUNT != 0).then(|| v - 1));
    }

    /// Ends one request whose slot was taken in generation `generation`; nothing if the
    /// words have started another since (they count another counter now). Whether it did.
    pub(crate) fn release_in(&self, generation: u32) -> bool {
        self.release_many_in(1, generation)
    }

    /// Releases `n` at once: what a worker that died held, from its ledger.
    pub fn release_many(&self, n: u32) {
        let _ = self.w(IN_FLIGHT).fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            Some(v - (v & COUNT).min(u64::from(n)))
        });
    }

    /// [`release_many`](Self::release_many) of slots taken in generation `generation`
    /// (read before the ledger's counts were); whether they were given back.
    pub(crate) fn release_many_in(&self, n: u32, generation: u32) -> bool {
        self.w(IN_FLIGHT)
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                ((v >> 32) as u32 == generation && v & COUNT != 0)
                    .then(|| v - (v & COUNT).min(u64::from(n)))
            })
            .is_ok()
    }

    /// The generation the words count in now.
    pub(crate) fn generation(&self) -> u32 {
        (self.w(IN_FLIGHT).load(Ordering::Acquire) >> 32) as u32
    }

    /// Starts a generation with nothing in flight: the words now count another counter.
    pub(crate) fn renew(&self) {
        let _ = self.w(IN_FLIGHT).fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            Some((((v >> 32) + 1) & COUNT) << 32)
        });
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        (self.w(IN_FLIGHT).load(Ordering::Relaxed) & COUNT) as u32
    }

    /// The share in force at `now`.
    pub fn share(&self, now: u64) -> u32 {
        let word = self.w(SHARE).load(Ordering::Acquire);
        if now / NS_PER_MS < word >> 24 {
            (word as u32) & MAX_SHARE
        } else {
            0
        }
    }

    /// Publishes `share` (capped at [`MAX_SHARE`]) valid until `until` (ns), rounded down to
    /// the millisecond so it ends no later.
    pub fn publish(&self, share: u32, until: u64) {
        let word = ((until / NS_PER_MS) << 24) | u64::from(share.min(MAX_SHARE));
        self.w(SHARE).store(word, Ordering::Release);
    }

    /// The acquires admitted and refused since the last call.
    pub fn take_round(&self) -> (u32, u32) {
        let word = self.w(ROUND).swap(0, Ordering::Relaxed);
        (word as u32, (word >> 32) as u32)
    }

    /// Acquires refused since the agent last took them, without taking them.
    pub fn refused(&self) -> u32 {
        (self.w(ROUND).load(Ordering::Relaxed) >> 32) as u32
    }
}

/// Whether a host should report to its roots before its next round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// No: the next round will do.
    No,
    /// It last reported running more than its shares (a share shrank under running
    /// requests) and those requests have ended: reporting now (repeating the round's
    /// demand) lets the roots hand the slots on at once instead of a round later.
    Release,
    /// It has refused requests since its round began, at least the early gap ago: a round
    /// now (measuring the demand) lets the roots move slots to it a round sooner.
    Starving,
}

/// The agent's book of one counter's shares (what each root granted, until when) and of
/// the demand it measures between rounds.
#[derive(Clone, Debug, Default)]
pub struct HostShares {
    /// (share, valid until ns on this host's clock), by root.
    roots: Vec<(u32, u64)>,
    /// Slot-nanoseconds run since the round began, sampled at each poll.
    busy: u128,
    last_poll: u64,
    round_start: u64,
    /// How long a request holds its slot (ns), smoothed over rounds; 0 until measured.
    hold: u64,
    /// A report went out (or a smaller share came in) while more ran than the shares.
    over: bool,
    /// The last round's demand and refusals, once one was measured.
    last: Option<(u32, u32)>,
    /// Rounds in a row with nothing admitted, refused or running.
    quiet: u32,
}

impl HostShares {
    /// A book for `roots` roots, holding nothing, measuring from `now`.
    pub fn new(roots: usize, now: u64) -> Self {
        Self {
            roots: vec![(0, 0); roots],
            busy: 0,
            last_poll: now,
            round_start: now,
            hold: 0,
            over: false,
            last: None,
            quiet: 0,
        }
    }

    /// Takes root `root`'s grant, answering a report sent at `sent_at`, received at `now`
    /// with `in_flight` running. Publish it ([`poll`](Self::poll)) before the host admits
    /// again or reports: a report acknowledging a smaller share while requests are still
    /// admitted on the larger one lets the root hand out the difference twice. `true` if the share shrank: the host should report to that
    /// root again at once, so the root counts the slots it gave back as free without
    /// waiting a round (if requests above the new share still run, [`poll`](Self::poll)
    /// says when they have ended).
    pub fn apply(
        &mut self,
        root: usize,
        grant: Grant,
        sent_at: u64,
        now: u64,
        in_flight: u32,
    ) -> bool {
        let until =
            sent_at.saturating_add(grant.lease_ns).saturating_sub(lease_margin(grant.lease_ns));
        let before = self.held(root, now);
        if let Some(r) = self.roots.get_mut(root) {
            *r = (grant.share, until);
        }
        if in_flight > self.total(now).0 {
            self.over = true;
        }
        grant.share < before
    }

    /// What root `root` granted that still holds at `now`.
    pub fn held(&self, root: usize, now: u64) -> u32 {
        self.roots.get(root).map_or(0, |&(s, until)| if now < until { s } else { 0 })
    }

    /// Every root's unexpired share together, and when the first of them ends.
    pub fn total(&self, now: u64) -> (u32, u64) {
        let mut total = 0u32;
        let mut until = u64::MAX;
        for &(s, u) in &self.roots {
            if now < u && s > 0 {
                total = total.saturating_add(s);
                until = until.min(u);
            }
        }
        (total, if total == 0 { 0 } else { until })
    }

    /// The agent's frequent poll (every few ms): samples what runs, for the demand, and
    /// publishes the total share into `permits`, valid until the first share ends (so an
    /// agent that stalls lets the share lapse, never overstay). Says whether the host
    /// should report before its next round ([`Due`]); `early_gap` (ns) is the least time
    /// between a round and an early one.
    ///
    /// A book that has taken no grant yet publishes nothing: an agent taking over from one
    /// that died leaves its predecessor's shares in force (they end with their own leases,
    /// which the roots still count) until its first answer, rather than refusing every
    /// request for a round trip.
    pub fn poll(&mut self, now: u64, permits: Permits<'_>, early_gap: u64) -> Due {
        let dt = now.saturating_sub(self.last_poll);
        let in_flight = permits.in_flight();
        self.busy += u128::from(in_flight) * u128::from(dt);
        self.last_poll = self.last_poll.max(now);
        let (total, until) = self.total(now);
        if self.granted_any() {
            permits.publish(total, until);
        }
        if self.over && in_flight <= total {
            self.over = false;
            return Due::Release;
        }
        if permits.refused() > 0 && now.saturating_sub(self.round_start) >= early_gap {
            return Due::Starving;
        }
        Due::No
    }

    /// [`round`](Self::round), unless the round began less than `min_span` ago and a
    /// demand was measured before: then that demand again, and the measuring goes on. A
    /// report that acknowledges a shrunk share goes out a few milliseconds after the last
    /// one, and a demand measured over so little time is mostly noise (a clump of retries,
    /// or none), which would move slots back and forth and leave them idle on the way.
    pub fn round_at_least(&mut self, now: u64, permits: Permits<'_>, min_span: u64) -> (u32, u32) {
        match self.last {
            Some(last) if now.saturating_sub(self.round_start) < min_span => {
                self.poll(now, permits, u64::MAX);
                last
            }
            _ => self.round(now, permits),
        }
    }

    /// Ends a measuring round at `now`: the concurrency offered since the last one in
    /// thousandths of a slot, and the acquires refused. Offered is what ran on average
    /// (Little's law: arrivals times how long each holds its slot) plus the refused
    /// arrivals times how long a request holds its slot (a host that has never admitted
    /// one counts a slot per refusal, so it is heard).
    pub fn round(&mut self, now: u64, permits: Permits<'_>) -> (u32, u32) {
        self.poll(now, permits, u64::MAX);
        let span = u128::from(now.saturating_sub(self.round_start).max(1));
        let (admitted, refused) = permits.take_round();
        let idle = admitted == 0 && refused == 0 && permits.in_flight() == 0;
        self.quiet = if idle { self.quiet.saturating_add(1) } else { 0 };
        if admitted > 0 {
            let hold = (self.busy / u128::from(admitted)).min(u128::from(u64::MAX)) as u64;
            self.hold = if self.hold == 0 { hold } else { (self.hold + hold) / 2 };
        }
        // Until a request has been seen through, count each refusal as a slot for the whole
        // round: loud, and corrected by the first round that admits any.
        let hold = if self.hold == 0 { span } else { u128::from(self.hold) };
        let milli = (self.busy * 1000 + u128::from(refused) * hold * 1000) / span;
        self.busy = 0;
        self.round_start = now;
        let measured = (milli.min(u128::from(u32::MAX)) as u32, refused);
        self.last = Some(measured);
        measured
    }

    /// The report for root `root`, with the round's `demand` and `refused` from
    /// [`round`](Self::round).
    pub fn report(
        &mut self,
        root: usize,
        now: u64,
        seq: u64,
        permits: Permits<'_>,
        demand: u32,
        refused: u32,
    ) -> Report {
        let in_flight = permits.in_flight();
        let (held, held_total) = if self.granted_any() {
            (self.held(root, now), self.total(now).0)
        } else {
            // Shares a predecessor published are still in force (see `poll`): claim them
            // whole to every root, which believes no more than it granted, so none hands
            // them to another host while this one may still admit on them.
            let inherited = permits.share(now);
            (inherited, inherited)
        };
        if in_flight > held_total {
            self.over = true;
        }
        Report { seq, held, held_total, in_flight, demand, refused }
    }

    /// Measured rounds in a row ([`round`](Self::round)) in which nothing was admitted,
    /// refused or running.
    pub fn quiet_rounds(&self) -> u32 {
        self.quiet
    }

    /// Whether any root's grant was applied to this book yet.
    fn granted_any(&self) -> bool {
        self.roots.iter().any(|&(_, until)| until != 0)
    }
}
