//! Configuration data: the http-level sync settings and the per-location rules, their
//! defaults, and how a location inherits from the levels around it.
//!
//! A leaf module: the directive setters that fill these types, and the command table that
//! names them, are in directives.rs.

use crate::parse::{self, LogLevel};
use core::ptr::NonNull;
use ngx::ffi::{
    ngx_http_complex_value_t, ngx_shm_zone_t, ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO,
    NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{Merge, MergeConfigError};
use std::path::PathBuf;
use std::time::Duration;

/// How often the agent syncs with the roots when `yarl_sync_interval` is absent.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// How long one sync call to one root may take when `yarl_sync_timeout` is absent; below
/// the default interval, so a round ends before the next one is due.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
/// The rejection status when `yarl_status` is absent: 429 Too Many Requests.
const DEFAULT_STATUS: u16 = 429;

/// `http`-level settings: the zone, and how its one sync agent syncs.
#[derive(Debug, Default)]
pub struct MainConf {
    /// `yarl_roots`, normalized: every root of every line.
    pub roots: Option<Vec<String>>,
    /// The `yarl_roots` lines, with their shards.
    pub root_map: parse::RootMap,
    /// `yarl_sync_interval`.
    pub interval: Option<Duration>,
    /// `yarl_sync_timeout`.
    pub timeout: Option<Duration>,
    /// `yarl_sync_token`.
    pub token: Option<String>,
    /// `yarl_sync_early`.
    pub early: Option<bool>,
    /// `yarl_sync_answers touched` (true) or `all`.
    pub interest: Option<bool>,
    /// `yarl_sync_ca`, the full path.
    pub ca: Option<PathBuf>,
    /// `yarl_zone`, bytes.
    pub zone_size: Option<usize>,
    /// `yarl_zone`'s `keys=`: keys (names under templates) its key table holds.
    pub zone_keys: Option<u32>,
    /// The shared-memory zone, once added (postconfiguration).
    pub shm_zone: Option<NonNull<ngx_shm_zone_t>>,
    /// Some directive of the module is used: only then is there a zone and an agent.
    pub used: bool,
}

impl MainConf {
    /// The sync interval in force.
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }

    /// The sync call timeout in force.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Whether early rounds are on (default on).
    pub fn early(&self) -> bool {
        self.early.unwrap_or(true)
    }

    /// Whether answers come by interest (`yarl_sync_answers touched`; default `all`).
    pub fn interest(&self) -> bool {
        self.interest.unwrap_or(false)
    }

    /// The zone size in force.
    pub fn zone_size(&self) -> usize {
        self.zone_size.unwrap_or(parse::DEFAULT_ZONE_SIZE)
    }

    /// The keys the zone holds: `keys=`, or its default share of the zone.
    pub fn zone_keys(&self) -> u32 {
        self.zone_keys.unwrap_or_else(|| parse::parse_keys(None, self.zone_size()).unwrap_or(0))
    }
}

/// Check-only or check-and-count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// `yarl_check`
    Check,
    /// `yarl_account`
    Account,
    /// `yarl_concurrency`: a slot of the quota's `max_in_flight` for the request's life.
    Concurrency,
}

/// The weight of a `yarl_account` rule.
#[derive(Debug, Clone, Copy)]
pub enum Weight {
    /// Known at configuration time.
    Fixed(u64),
    /// A complex value evaluated per request (e.g. `$content_length`).
    Variable(*mut ngx_http_complex_value_t),
}

/// One `yarl_check` / `yarl_account` line.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Which role.
    pub kind: RuleKind,
    /// The quota name, compiled; lives in the cycle pool like the rest of the configuration.
    pub name: *mut ngx_http_complex_value_t,
    /// `Fixed(0)` for checks.
    pub weight: Weight,
}

/// Per-location settings. Unset values stay `None` through merging, the accessors apply the
/// defaults.
#[derive(Debug, Default)]
pub struct LocConf {
    /// Rules of this level, or inherited whole from the nearest outer level that has any
    /// (the `limit_req` rule).
    pub rules: Vec<Rule>,
    /// `yarl_status`.
    pub status: Option<u16>,
    /// `yarl_dry_run`.
    pub dry_run: Option<bool>,
    /// `yarl_log_level`.
    pub log_level: Option<LogLevel>,
    /// `yarl_retry_after`.
    pub retry_after: Option<bool>,
    /// `yarl_headers`.
    pub headers: Option<bool>,
    /// `yarl_charge` lines of this level, or inherited whole like `rules`.
    pub charges: Vec<Charge>,
}

/// One `yarl_charge NAME WEIGHT` line.
#[derive(Debug, Clone, Copy)]
pub struct Charge {
    /// The quota name, compiled.
    pub name: *mut ngx_http_complex_value_t,
    /// The weight: a constant or a variable evaluated after the response.
    pub weight: Weight,
    /// Which `yarl_charge` line this is (counted from 0), for logging once per line.
    pub line: usize,
}

impl LocConf {
    /// Rejection status.
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(DEFAULT_STATUS)
    }

    /// Whether rejections are only logged.
    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }

    /// nginx log level of the rejection line.
    pub fn log_level(&self) -> ngx_uint_t {
        (match self.log_level.unwrap_or(LogLevel::Error) {
            LogLevel::Info => NGX_LOG_INFO,
            LogLevel::Notice => NGX_LOG_NOTICE,
            LogLevel::Warn => NGX_LOG_WARN,
            LogLevel::Error => NGX_LOG_ERR,
        }) as ngx_uint_t
    }

    /// Whether rejections carry `Retry-After`.
    pub fn retry_after(&self) -> bool {
        self.retry_after.unwrap_or(true)
    }

    /// Whether responses carry the `RateLimit-Policy` / `RateLimit` fields.
    pub fn headers(&self) -> bool {
        self.headers.unwrap_or(false)
    }
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), MergeConfigError> {
        // `yarl_check`/`yarl_account` lines and `yarl_concurrency` lines are inherited
        // apart, as `limit_req` and `limit_conn` are: a location with only a cap of its
        // own keeps the rate lines around it, and the other way round.
        for concurrency in [false, true] {
            let kind = |r: &Rule| (r.kind == RuleKind::Concurrency) == concurrency;
            if !self.rules.iter().any(kind) {
                self.rules.extend(prev.rules.iter().filter(|r| kind(r)).cloned());
            }
        }
        if self.charges.is_empty() {
            self.charges = prev.charges.clone();
        }
        self.headers = self.headers.or(prev.headers);
        self.status = self.status.or(prev.status);
        self.dry_run = self.dry_run.or(prev.dry_run);
        self.log_level = self.log_level.or(prev.log_level);
        self.retry_after = self.retry_after.or(prev.retry_after);
        Ok(())
    }
}
