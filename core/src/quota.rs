//! The quota model and its validation (the rules are in docs/behaviour.md).
//!
//! A quota is a leaky bucket: `limit` units/s drain it, accounted requests fill it by their
//! weight, and `low_burst`/`high_burst` bound the zone where requests are dropped with rising
//! probability. Every rule has its own [`QuotaError`] variant so the admin API and the nginx
//! module can say exactly what is wrong.

use crate::units::{
    milli_to_units, parse_window, units_to_milli, Rate, MAX_BURST_UNITS, MAX_LIMIT_UNITS,
    MIN_LIMIT_UNITS,
};
use serde::{Deserialize, Serialize};

/// Longest quota name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The largest `max_in_flight` a quota may have. Shares of it are whole slots handed to
/// hosts and counted in 32 bits; a million requests in flight is beyond any one service.
pub const MAX_IN_FLIGHT: u32 = 1_000_000;

/// Database id of a quota. Ids are never reused, so they also key the counters on the wire.
pub type QuotaId = u64;

/// The quota database's change counter: every write gets an epoch above all others.
pub type Epoch = u64;

/// Why a quota or a quota name was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The name is empty.
    #[error("name must not be empty")]
    EmptyName,
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("name is {len} bytes long, the maximum is 255")]
    NameTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name has a character outside `[A-Za-z0-9._:@-]` (and not in a `%XX` escape).
    #[error(
        "name has {ch:?} at byte {pos}; allowed are A-Z a-z 0-9 . _ : @ -, %XX for any other \
         byte, and a final * for a template"
    )]
    NameInvalidChar {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        pos: usize,
    },
    /// `limit` is not within [0.001, 1e12] units per window.
    #[error("limit must be a number from 0.001 to 1e12 (units per window, per second unless `per` says), got {0}")]
    LimitOutOfRange(f64),
    /// A burst left out of a quota without `per`.
    #[error("{0} is required unless the quota has a window (per)")]
    MissingBurst(&'static str),
    /// `per` is not a window a quota can have.
    #[error("{0}")]
    Window(String),
    /// A burst is negative, not a number, or above 1e15 units.
    #[error("{field} must be a number from 0 to 1e15 (units), got {value}")]
    BurstOutOfRange {
        /// `low_burst` or `high_burst`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `low_burst > high_burst`.
    #[error("low_burst ({low}) must not be greater than high_burst ({high})")]
    BurstOrder {
        /// The given low burst.
        low: f64,
        /// The given high burst.
        high: f64,
    },
    /// A `%` not followed by two upper-case hex digits.
    #[error(
        "name has a bad escape at byte {pos}: % must be followed by two upper-case hex digits"
    )]
    NameBadEscape {
        /// Its byte offset.
        pos: usize,
    },
    /// A `%XX` escape of a byte that needs none, or of a final `*` (a template's mark).
    #[error(
        "name escapes {ch:?} at byte {pos}; write it as it is (a final * makes a template, \
         and no other name may end in one)"
    )]
    NameNotCanonical {
        /// Its byte offset.
        pos: usize,
        /// The byte escaped.
        ch: char,
    },
    /// The parent named is a template, which has no counter of its own to share.
    #[error("the parent must be a quota, not the template {0:?}")]
    ParentTemplate(String),
    /// The quota names itself as its parent.
    #[error("quota cannot be its own parent")]
    SelfParent,
    /// `max_in_flight` is not a whole number from 1 to [`MAX_IN_FLIGHT`].
    #[error(
        "max_in_flight must be a whole number from 1 to 1000000 (requests in flight), got {0}"
    )]
    InFlightOutOfRange(f64),
    /// Neither a rate (`limit`) nor a concurrency (`max_in_flight`): nothing to limit.
    #[error("limit is required unless the quota has max_in_flight")]
    MissingLimit,
    /// A field of the rate (`per`, a burst) on a quota without `limit`.
    #[error("{0} needs a limit: a quota with only max_in_flight has no rate")]
    RateFieldWithoutLimit(&'static str),
    /// The parent's name is invalid.
    #[error("parent: {0}")]
    Parent(Box<QuotaError>),
}

/// Checks a quota name as the admin API and the database write it: 1–255 bytes (once
/// unescaped) of `[A-Za-z0-9._:@-]`, where `%XX` (two upper-case hex digits) stands for any byte
/// outside that set (`%25` for `%` itself), and a trailing `*` makes the quota a template
/// (see [`is_template`]). Escapes are canonical: escaping a byte of the set is refused, so
/// one key has one name.
pub fn validate_name(name: &str) -> Result<(), QuotaError> {
    if name.is_empty() {
        return Err(QuotaError::EmptyName);
    }
    let body = name.strip_suffix('*').unwrap_or(name);
    if body.is_empty() {
        return Err(QuotaError::EmptyName);
    }
    let b = body.as_bytes();
    let mut raw = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let byte = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    // Upper case only: `%2f` and `%2F` would be two names of one key.
                    .filter(|h| h.bytes().all(|c| matches!(c, b'0'..=b'9' | b'A'..=b'F')))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(QuotaError::NameBadEscape { pos: i })?;
                if is_name_char(byte as char) {
                    return Err(QuotaError::NameNotCanonical { pos: i, ch: byte as char });
                }
                i += 3;
            }
            c if c.is_ascii() && is_name_char(c as char) => i += 1,
            _ => {
                let ch = body[i..].chars().next().unwrap_or('\u{fffd}');
                return Err(QuotaError::NameInvalidChar { ch, pos: i });
            }
        }
        raw += 1;
    }
    if body.len() == name.len() && body.ends_with("%2A") {
        // Its bytes would be those of the template of the same prefix.
        return Err(QuotaError::NameNotCanonical { pos: body.len() - 3, ch: '*' });
    }
    let raw = raw + usize::from(body.len() < name.len());
    if raw > MAX_NAME_LEN {
        return Err(QuotaError::NameTooLong { len: raw });
    }
    Ok(())
}

/// Whether `name` is a template: a quota whose name ends in `*`, limiting every name that
/// starts with the rest (its prefix) and has no quota of its own, each with a bucket of
/// its own.
pub fn is_template(name: &str) -> bool {
    name.len() > 1 && name.ends_with('*')
}

impl QuotaUpdate {
    /// A reset of one key (a name under a template, with no quota of its own): keys have no
    /// row of their own, so the admin API records the reset as a tombstone of the key's
    /// name whose `reset_epoch` is its own epoch. Everyone who applies it empties the key's
    /// counter, and the key stays under its template. A plain delete keeps the older
    /// `reset_epoch`, so it is never taken for one.
    pub fn is_key_reset(&self) -> bool {
        self.deleted
            && self.reset_epoch != 0
            && self.reset_epoch == self.epoch
            && !is_template(&self.name)
    }
}

/// The bytes a name stands for: `%XX` escapes decoded (a template keeps its `*`). Limiters
/// match these against the names requests give, which may hold any bytes. Call it on
/// names [`validate_name`] accepted; anything else is decoded as far as it can be.
pub fn raw_name(name: &str) -> Vec<u8> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%')
            .then(|| b.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// `raw` as a printable name: itself when it holds only bytes of the name set (no copy),
/// else [`escape_name`]'s form. For logs, variables and header fields, which must never
/// carry a request's raw bytes.
pub fn display_name(raw: &[u8]) -> std::borrow::Cow<'_, str> {
    if raw.iter().all(|&c| c.is_ascii() && is_name_char(c as char)) {
        // All ASCII: valid UTF-8.
        std::borrow::Cow::Borrowed(std::str::from_utf8(raw).unwrap_or_default())
    } else {
        std::borrow::Cow::Owned(escape_name(raw))
    }
}

/// The name the admin API uses for the bytes `raw`: bytes outside the name set escaped as
/// `%XX` (upper-case hex), the inverse of [`raw_name`].
pub fn escape_name(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for &c in raw {
        if c.is_ascii() && is_name_char(c as char) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')
}

/// The numbers of a quota, validated and in fixed point (see [`crate::units`]). Only the
/// constructors make one, so a `Limits` always holds a limit from 1 to 1e15 milli-units per
/// window of 1 s to 30 days and bursts from 0 to 1e18 milli-units with
/// `low_burst <= high_burst`; whatever arrives from the wire or a database goes through
/// [`Limits::from_milli_per`] or [`Limits::from_rate_word`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawLimits", into = "RawLimits")]
pub struct Limits {
    limit: Rate,
    low_burst: u64,
    high_burst: u64,
    /// Shadow mode: decided and counted as rejections, never enforced.
    dry_run: bool,
    /// Requests in flight at once across the cluster; 0: no such cap.
    max_in_flight: u32,
}

/// [`Limits`] as they travel: checked on the way in. `dry_run` only when set and `per` only
/// when not 1 s, so that a quota without them is byte for byte what it was before.
#[derive(Serialize, Deserialize)]
struct RawLimits {
    /// Milli-units per `per`.
    limit: u64,
    /// The window, seconds.
    #[serde(default = "one_second", skip_serializing_if = "is_one_second")]
    per: u64,
    low_burst: u64,
    high_burst: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dry_run: bool,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    max_in_flight: u32,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn one_second() -> u64 {
    1
}

fn is_one_second(s: &u64) -> bool {
    *s == 1
}

impl TryFrom<RawLimits> for Limits {
    type Error = QuotaError;

    fn try_from(r: RawLimits) -> Result<Limits, QuotaError> {
        Limits::from_milli_per(r.limit, r.per, r.low_burst, r.high_burst)?
            .with_dry_run(r.dry_run)
            .with_max_in_flight(r.max_in_flight)
    }
}

impl From<Limits> for RawLimits {
    fn from(l: Limits) -> RawLimits {
        RawLimits {
            limit: l.limit.milli(),
            per: l.limit.window_secs(),
            low_burst: l.low_burst,
            high_burst: l.high_burst,
            dry_run: l.dry_run,
            max_in_flight: l.max_in_flight,
        }
    }
}

impl Limits {
    /// The smallest limit with no bursts: what a tombstone carries (its numbers mean nothing).
    pub const NONE: Limits = Limits {
        limit: Rate::per_second(1),
        low_burst: 0,
        high_burst: 0,
        dry_run: false,
        max_in_flight: 0,
    };

    /// A quota with only `max_in_flight`: its rate is the largest there is, with the
    /// largest bursts (1e12 units/s, 1e15 units), which nothing a service sends fills, so
    /// its bucket never refuses while limiters and roots count it like any other.
    pub fn in_flight_only(max_in_flight: u32) -> Result<Limits, QuotaError> {
        let max_burst = units_to_milli(MAX_BURST_UNITS);
        Limits::from_milli_per(units_to_milli(MAX_LIMIT_UNITS), 1, max_burst, max_burst)?
            .with_max_in_flight(max_in_flight)
    }

    /// Validates a quota's numbers given in units, `limit` per second.
    pub fn from_units(limit: f64, low_burst: f64, high_burst: f64) -> Result<Limits, QuotaError> {
        Limits::from_units_per(limit, 1, low_burst, high_burst)
    }

    /// Validates a quota's numbers given in units (as the admin API takes them): `limit`
    /// per window of `per` seconds.
    pub fn from_units_per(
        limit: f64,
        per: u64,
        low_burst: f64,
        high_burst: f64,
    ) -> Result<Limits, QuotaError> {
        // `!(a <= x)` also catches NaN.
        if !(MIN_LIMIT_UNITS..=MAX_LIMIT_UNITS).contains(&limit) {
            return Err(QuotaError::LimitOutOfRange(limit));
        }
        for (field, value) in [("low_burst", low_burst), ("high_burst", high_burst)] {
            if !(0.0..=MAX_BURST_UNITS).contains(&value) {
                return Err(QuotaError::BurstOutOfRange { field, value });
            }
        }
        if low_burst > high_burst {
            return Err(QuotaError::BurstOrder { low: low_burst, high: high_burst });
        }
        Limits::from_milli_per(
            units_to_milli(limit).max(1),
            per,
            units_to_milli(low_burst),
            units_to_milli(high_burst),
        )
    }

    /// Validates numbers that arrived in fixed point, `limit` milli-units per second.
    pub fn from_milli(limit: u64, low_burst: u64, high_burst: u64) -> Result<Limits, QuotaError> {
        Limits::from_milli_per(limit, 1, low_burst, high_burst)
    }

    /// Validates a limit that arrived as a [`Rate`] word (the v2 wire's `limit`).
    pub fn from_rate_word(
        word: u64,
        low_burst: u64,
        high_burst: u64,
    ) -> Result<Limits, QuotaError> {
        let rate = Rate::from_word(word)
            .ok_or_else(|| QuotaError::Window(format!("no window has the code of {word:#x}")))?;
        Limits::from_milli_per(rate.milli(), rate.window_secs(), low_burst, high_burst)
    }

    /// Validates numbers that arrived in fixed point (from the wire or a database): `limit`
    /// milli-units per window of `per` seconds.
    pub fn from_milli_per(
        limit: u64,
        per: u64,
        low_burst: u64,
        high_burst: u64,
    ) -> Result<Limits, QuotaError> {
        let max_limit = units_to_milli(MAX_LIMIT_UNITS);
        if !(1..=max_limit).contains(&limit) {
            return Err(QuotaError::LimitOutOfRange(milli_to_units(limit)));
        }
        let limit = Rate::new(limit, per).map_err(|e| QuotaError::Window(format!("per: {e}")))?;
        let max_burst = units_to_milli(MAX_BURST_UNITS);
        for (field, value) in [("low_burst", low_burst), ("high_burst", high_burst)] {
            if value > max_burst {
                return Err(QuotaError::BurstOutOfRange { field, value: milli_to_units(value) });
            }
        }
        if low_burst > high_burst {
            return Err(QuotaError::BurstOrder {
                low: milli_to_units(low_burst),
                high: milli_to_units(high_burst),
            });
        }
        Ok(Limits { limit, low_burst, high_burst, dry_run: false, max_in_flight: 0 })
    }

    /// The same numbers with at most `max_in_flight` requests in flight (0: no such cap).
    pub fn with_max_in_flight(self, max_in_flight: u32) -> Result<Limits, QuotaError> {
        if max_in_flight > MAX_IN_FLIGHT {
            return Err(QuotaError::InFlightOutOfRange(f64::from(max_in_flight)));
        }
        Ok(Limits { max_in_flight, ..self })
    }

    /// Requests of this quota in flight at once across the cluster, 0 when it has no such
    /// cap (see `docs/concurrency.md`).
    #[inline]
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// Whether the quota limits a rate: `false` for a quota with only `max_in_flight`
    /// (made by [`Limits::in_flight_only`]), whose bucket never refuses.
    pub fn has_rate(&self) -> bool {
        let max_burst = units_to_milli(MAX_BURST_UNITS);
        !(self.max_in_flight > 0
            && self.limit == Rate::per_second(units_to_milli(MAX_LIMIT_UNITS))
            && self.low_burst == max_burst
            && self.high_burst == max_burst)
    }

    /// The same numbers in shadow mode (`true`) or enforced (`false`).
    #[must_use]
    pub fn with_dry_run(self, dry_run: bool) -> Limits {
        Limits { dry_run, ..self }
    }

    /// Shadow mode: every limiter decides and counts what this quota would reject (as
    /// [`crate::Outcome::RejectedDryRun`]) but lets it through, and does not count it on this
    /// quota, so the rejections it reports are the ones enforcing it would make.
    #[inline]
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Drain rate: 1 to 1e15 milli-units per window.
    #[inline]
    pub fn limit(&self) -> Rate {
        self.limit
    }

    /// The window `limit` counts in, seconds (1 for a per-second quota).
    #[inline]
    pub fn window_secs(&self) -> u64 {
        self.limit.window_secs()
    }

    /// Fill up to which everything passes, milli-units.
    #[inline]
    pub fn low_burst(&self) -> u64 {
        self.low_burst
    }

    /// Fill from which everything is rejected, milli-units.
    #[inline]
    pub fn high_burst(&self) -> u64 {
        self.high_burst
    }

    /// `limit` in units per window.
    pub fn limit_units(&self) -> f64 {
        milli_to_units(self.limit.milli())
    }

    /// `low_burst` in units.
    pub fn low_burst_units(&self) -> f64 {
        milli_to_units(self.low_burst)
    }

    /// `high_burst` in units.
    pub fn high_burst_units(&self) -> f64 {
        milli_to_units(self.high_burst)
    }
}

/// A quota as the admin API describes it (numbers in units), before it gets an id and epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaSpec {
    /// Units per window (`per`, one second when absent); `None` only with
    /// `max_in_flight` (a quota that caps concurrency alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// The window: a whole number and a unit, `s`, `m`, `h` or `d` (`"1h"`; a month is
    /// `"30d"`); `None` is one second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<String>,
    /// Units; `None` only with `per`: see [`QuotaSpec::validate`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_burst: Option<f64>,
    /// Units; as `low_burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_burst: Option<f64>,
    /// Parent quota's name.
    #[serde(default)]
    pub parent: Option<String>,
    /// Shadow mode (see [`Limits::dry_run`]).
    #[serde(default)]
    pub dry_run: bool,
    /// Requests in flight at once across the cluster, 1 to [`MAX_IN_FLIGHT`] (see
    /// [`Limits::max_in_flight`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

/// `max_in_flight` as a JSON number arrives (a float): a whole number from 1 to
/// [`MAX_IN_FLIGHT`], or the error that says so.
pub fn in_flight_from_number(value: f64) -> Result<u32, QuotaError> {
    if value.fract() == 0.0 && (1.0..=f64::from(MAX_IN_FLIGHT)).contains(&value) {
        Ok(value as u32)
    } else {
        Err(QuotaError::InFlightOutOfRange(value))
    }
}

impl QuotaSpec {
    /// Validates the spec for a quota called `name`.
    ///
    /// A quota with a window (`per`) may leave its bursts out: `high_burst` defaults to
    /// `limit` (the bucket holds one window) and `low_burst` to `limit - 1` (at least 0), so
    /// an idle client gets exactly `limit` requests of one unit at once (a request passes
    /// for sure while the fill is at or below `low_burst`, never once it reaches
    /// `high_burst`), and after that one more each `per / limit`, the leaky bucket's smooth
    /// refill. Without `per` the bursts are required: a per-second quota's bursts depend on
    /// the sync interval.
    ///
    /// `max_in_flight` caps the requests in flight beside the rate; alone (no `limit`), the
    /// quota caps only them ([`Limits::in_flight_only`]), and `per` and the bursts, which
    /// belong to a rate, are refused.
    pub fn validate(&self, name: &str) -> Result<Limits, QuotaError> {
        validate_name(name)?;
        let in_flight = match self.max_in_flight {
            None => 0,
            Some(c) => in_flight_from_number(f64::from(c))?,
        };
        let Some(limit) = self.limit else {
            if in_flight == 0 {
                return Err(QuotaError::MissingLimit);
            }
            let given = [
                ("per", self.per.is_some()),
                ("low_burst", self.low_burst.is_some()),
                ("high_burst", self.high_burst.is_some()),
            ];
            if let Some((field, _)) = given.iter().find(|(_, is)| *is) {
                return Err(QuotaError::RateFieldWithoutLimit(field));
            }
            let limits = Limits::in_flight_only(in_flight)?.with_dry_run(self.dry_run);
            self.validate_parent(name)?;
            return Ok(limits);
        };
        let per = match &self.per {
            None => 1,
            Some(text) => parse_window(text).map_err(QuotaError::Window)?,
        };
        let windowed = self.per.is_some() && limit.is_finite();
        let burst = |v: Option<f64>, default: f64, field| {
            v.or(windowed.then_some(default)).ok_or(QuotaError::MissingBurst(field))
        };
        let low = burst(self.low_burst, (limit - 1.0).max(0.0), "low_burst")?;
        let high = burst(self.high_burst, limit.max(low), "high_burst")?;
        let limits = Limits::from_units_per(limit, per, low, high)?
            .with_dry_run(self.dry_run)
            .with_max_in_flight(in_flight)?;
        self.validate_parent(name)?;
        Ok(limits)
    }

    fn validate_parent(&self, name: &str) -> Result<(), QuotaError> {
        if let Some(parent) = &self.parent {
            validate_name(parent).map_err(|e| QuotaError::Parent(Box::new(e)))?;
            if is_template(parent) {
                return Err(QuotaError::ParentTemplate(parent.clone()));
            }
            if parent == name {
                return Err(QuotaError::SelfParent);
            }
        }
        Ok(())
    }
}

fn is_zero(e: &Epoch) -> bool {
    *e == 0
}

/// A stored quota or its tombstone, as the root hands it to limiters: everything a limiter
/// needs to apply the change on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUpdate {
    /// Database id; never reused.
    pub id: QuotaId,
    /// Unique name.
    pub name: String,
    /// The write's epoch.
    pub epoch: Epoch,
    /// `true` for a tombstone: the quota was deleted at `epoch`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// The epoch of the quota's last cluster-wide reset (`POST /v1/quotas/{name}:reset`), 0
    /// if never: whoever applies a version with a newer reset empties the counter, and counts
    /// made before it learned of the reset are dropped (docs/sync-protocol.md, "Resets").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reset_epoch: Epoch,
    /// The numbers (ignored on tombstones).
    #[serde(flatten)]
    pub limits: Limits,
    /// Parent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(validate_name(""), Err(QuotaError::EmptyName));
        assert!(validate_name("s3_bucket-1.read:x@y").is_ok());
        assert_eq!(validate_name(&"a".repeat(255)), Ok(()));
        assert_eq!(validate_name(&"a".repeat(256)), Err(QuotaError::NameTooLong { len: 256 }));
        assert_eq!(validate_name("a b"), Err(QuotaError::NameInvalidChar { ch: ' ', pos: 1 }));
        assert_eq!(validate_name("ä"), Err(QuotaError::NameInvalidChar { ch: 'ä', pos: 0 }));
        assert_eq!(validate_name("a/b"), Err(QuotaError::NameInvalidChar { ch: '/', pos: 1 }));
    }

    #[test]
    fn templates_and_escapes() {
        assert!(validate_name("api_key_*").is_ok() && is_template("api_key_*"));
        assert!(!is_template("api_key_") && !is_template("*"));
        assert_eq!(validate_name("*"), Err(QuotaError::EmptyName));
        assert!(matches!(validate_name("a*b"), Err(QuotaError::NameInvalidChar { ch: '*', .. })));
        assert!(matches!(validate_name("a**"), Err(QuotaError::NameInvalidChar { ch: '*', .. })));
        // Any byte through %XX; canonical only.
        assert!(validate_name("ip_%7F%00%00%01").is_ok());
        assert_eq!(raw_name("ip_%7F%00%00%01"), b"ip_\x7f\x00\x00\x01");
        assert_eq!(raw_name("api_key_*"), b"api_key_*");
        assert_eq!(escape_name(b"ip_\x7f\x00\x00\x01"), "ip_%7F%00%00%01");
        assert_eq!(escape_name("k_é%".as_bytes()), "k_%C3%A9%25");
        assert_eq!(raw_name(&escape_name("k_é%".as_bytes())), "k_é%".as_bytes());
        assert_eq!(validate_name("a%4"), Err(QuotaError::NameBadEscape { pos: 1 }));
        assert_eq!(validate_name("a%zz"), Err(QuotaError::NameBadEscape { pos: 1 }));
        assert_eq!(validate_name("a%2f"), Err(QuotaError::NameBadEscape { pos: 1 }));
        assert_eq!(
            validate_name("api_key_%2A"),
            Err(QuotaError::NameNotCanonical { pos: 8, ch: '*' }),
            "the bytes of the template api_key_*"
        );
        assert!(validate_name("api_key_%2Ax").is_ok());
        assert_eq!(
            validate_name("a%41"),
            Err(QuotaError::NameNotCanonical { pos: 1, ch: 'A' }),
            "A needs no escape"
        );
        // 255 bytes once unescaped, whatever the escapes' length.
        assert!(validate_name(&"%00".repeat(255)).is_ok());
        assert_eq!(validate_name(&"%00".repeat(256)), Err(QuotaError::NameTooLong { len: 256 }));
        assert_eq!(
            validate_name(&format!("{}*", "a".repeat(255))),
            Err(QuotaError::NameTooLong { len: 256 })
        );
        // A template cannot be a parent.
        let spec = QuotaSpec {
            limit: Some(1.0),
            per: None,
            low_burst: Some(1.0),
            high_burst: Some(2.0),
            parent: Some("t*".into()),
            dry_run: false,
            max_in_flight: None,
        };
        assert_eq!(spec.validate("a"), Err(QuotaError::ParentTemplate("t*".into())));
    }

    proptest::proptest! {
        /// Escaping any bytes gives a valid name that decodes to them (but for a final `*`,
        /// which only a template's name ends in).
        #[test]
        fn escapes_round_trip(raw in proptest::collection::vec(proptest::num::u8::ANY, 1..200)) {
            proptest::prop_assume!(raw.last() != Some(&b'*'));
            let name = escape_name(&raw);
            proptest::prop_assert_eq!(validate_name(&name), Ok(()));
            proptest::prop_assert_eq!(raw_name(&name), raw);
        }
    }

    #[test]
    fn limit_range() {
        assert!(Limits::from_units(0.001, 0.0, 0.0).is_ok());
        assert!(Limits::from_units(1e12, 0.0, 0.0).is_ok());
        for bad in [0.0, 0.0009, 1.1e12, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(Limits::from_units(bad, 0.0, 0.0), Err(QuotaError::LimitOutOfRange(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn bursts() {
        assert_eq!(
            Limits::from_units(1.0, -1.0, 2.0),
            Err(QuotaError::BurstOutOfRange { field: "low_burst", value: -1.0 })
        );
        assert!(matches!(
            Limits::from_units(1.0, 0.0, f64::NAN),
            Err(QuotaError::BurstOutOfRange { field: "high_burst", .. })
        ));
        assert!(matches!(
            Limits::from_units(1.0, 0.0, 2e15),
            Err(QuotaError::BurstOutOfRange { field: "high_burst", .. })
        ));
        assert_eq!(
            Limits::from_units(1.0, 3.0, 2.0),
            Err(QuotaError::BurstOrder { low: 3.0, high: 2.0 })
        );
        let l = Limits::from_units(2.5, 10.0, 10.0).unwrap();
        assert_eq!(l, Limits::from_milli(2_500, 10_000, 10_000).unwrap());
    }

    #[test]
    fn fixed_point_limits_are_checked_wherever_they_come_from() {
        let ok = Limits::from_milli(1, 0, 0).unwrap();
        assert_eq!((ok.limit().word(), ok.low_burst(), ok.high_burst()), (1, 0, 0));
        assert_eq!(Limits::from_milli(0, 0, 0), Err(QuotaError::LimitOutOfRange(0.0)));
        assert!(Limits::from_milli(1_000_000_000_000_001, 0, 0).is_err(), "above 1e12/s");
        assert!(Limits::from_milli(1, 0, 1_000_000_000_000_000_001).is_err(), "above 1e15");
        assert!(matches!(Limits::from_milli(1, 5, 4), Err(QuotaError::BurstOrder { .. })));
        // Through serde (the v1 wire, JSON) as well.
        let json = r#"{"limit":0,"low_burst":0,"high_burst":0}"#;
        let e = serde_json::from_str::<Limits>(json).unwrap_err().to_string();
        assert!(e.contains("limit must be"), "{e}");
        let back: Limits = serde_json::from_str(&serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
    }

    #[test]
    fn spec_parent_rules() {
        let mut s = QuotaSpec {
            limit: Some(1.0),
            per: None,
            low_burst: Some(1.0),
            high_burst: Some(2.0),
            parent: None,
            dry_run: false,
            max_in_flight: None,
        };
        assert!(s.validate("a").is_ok());
        s.parent = Some("a".into());
        assert_eq!(s.validate("a"), Err(QuotaError::SelfParent));
        s.parent = Some("b c".into());
        assert!(matches!(s.validate("a"), Err(QuotaError::Parent(_))));
        assert!(s.validate("a").unwrap_err().to_string().starts_with("parent: name has"));
    }

    #[test]
    fn max_in_flight_rules() {
        let spec = |limit: Option<f64>, max_in_flight| QuotaSpec {
            limit,
            per: None,
            low_burst: limit.map(|_| 1.0),
            high_burst: limit.map(|_| 2.0),
            parent: None,
            dry_run: false,
            max_in_flight,
        };
        // Beside a rate.
        let both = spec(Some(10.0), Some(8)).validate("gen").unwrap();
        assert_eq!((both.max_in_flight(), both.has_rate()), (8, true));
        assert_eq!(both.limit_units(), 10.0);
        // Alone: a bucket that never refuses, shown as no rate.
        let alone = spec(None, Some(50)).validate("db").unwrap();
        assert_eq!((alone.max_in_flight(), alone.has_rate()), (50, false));
        assert_eq!(alone.high_burst_units(), 1e15);
        // A rate alone is a rate, even at the largest numbers.
        let big = Limits::from_units(1e12, 1e15, 1e15).unwrap();
        assert!(big.has_rate() && big.max_in_flight() == 0);
        // Nothing to limit; rate fields without a rate; out of range.
        assert_eq!(spec(None, None).validate("x"), Err(QuotaError::MissingLimit));
        let mut windowed = spec(None, Some(5));
        windowed.per = Some("1h".into());
        assert_eq!(windowed.validate("x"), Err(QuotaError::RateFieldWithoutLimit("per")));
        let mut burst = spec(None, Some(5));
        burst.high_burst = Some(3.0);
        assert_eq!(burst.validate("x"), Err(QuotaError::RateFieldWithoutLimit("high_burst")));
        for bad in [0, MAX_IN_FLIGHT + 1, u32::MAX] {
            assert_eq!(
                spec(Some(1.0), Some(bad)).validate("x"),
                Err(QuotaError::InFlightOutOfRange(f64::from(bad)))
            );
        }
        assert_eq!(in_flight_from_number(2.5), Err(QuotaError::InFlightOutOfRange(2.5)));
        assert!(in_flight_from_number(f64::NAN).is_err() && in_flight_from_number(-1.0).is_err());
        assert_eq!(in_flight_from_number(1e6), Ok(MAX_IN_FLIGHT));
        // Templates may cap each key's concurrency.
        assert_eq!(spec(None, Some(8)).validate("api_key_*").unwrap().max_in_flight(), 8);
        // Through serde, as the v1 wire carries it; absent when 0.
        let j = serde_json::to_string(&alone).unwrap();
        assert!(j.ends_with(r#""max_in_flight":50}"#), "{j}");
        assert_eq!(serde_json::from_str::<Limits>(&j).unwrap(), alone);
        assert!(!serde_json::to_string(&big).unwrap().contains("max_in_flight"));
        let over = r#"{"limit":1,"low_burst":0,"high_burst":0,"max_in_flight":1000001}"#;
        assert!(serde_json::from_str::<Limits>(over).is_err());
    }

    #[test]
    fn error_messages_name_the_field() {
        let e = Limits::from_units(1.0, 5.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("low_burst") && e.contains("high_burst"), "{e}");
        let e = Limits::from_units(0.0, 5.0, 1.0).unwrap_err().to_string();
        assert!(e.starts_with("limit must be"), "{e}");
    }

    #[test]
    fn update_wire_format() {
        let u = QuotaUpdate {
            id: 7,
            name: "a".into(),
            epoch: 3,
            deleted: false,
            reset_epoch: 0,
            limits: Limits::from_milli(1000, 0, 5000).unwrap(),
            parent: Some("p".into()),
        };
        let j = serde_json::to_string(&u).unwrap();
        assert_eq!(
            j,
            r#"{"id":7,"name":"a","epoch":3,"limit":1000,"low_burst":0,"high_burst":5000,"parent":"p"}"#
        );
        assert_eq!(serde_json::from_str::<QuotaUpdate>(&j).unwrap(), u);
    }
}
