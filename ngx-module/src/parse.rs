//! Directive values and per-request weights, parsed without nginx so they can be tested with
//! `cargo test` (tests/parse.rs includes this file).
//!
//! Everything here returns `None`/`Err` with a reason; the directive setters turn that into an
//! `[emerg]` that names the directive and the value, as nginx's own slots do.

/// The share of a `yarl_zone` its key table takes unless `keys=` says otherwise, percent.
pub const DEFAULT_KEY_SHARE: usize = 25;

/// How many keys (names under templates) a zone of `size` bytes keeps when `keys` is
/// `Some(spec)` (`keys=N` with an optional `k` or `m` for thousands or millions, or
/// `keys=P%` of the zone) or the default share.
pub fn parse_keys(spec: Option<&str>, size: usize) -> Result<u32, String> {
    let bytes = usable_zone_bytes(size);
    let share = |p: usize| (bytes / 100 * p / yarl_core::zone::BYTES_PER_KEY) as u32;
    let Some(spec) = spec else { return Ok(share(DEFAULT_KEY_SHARE)) };
    let bad =
        || format!("keys must be a number (k and m allowed) or a share such as 25%, got {spec:?}");
    let keys = if let Some(p) = spec.strip_suffix('%') {
        let p: usize = p.parse().map_err(|_| bad())?;
        if p > 90 {
            return Err(format!(
                "keys={spec} leaves too little of the zone for quotas (at most 90%)"
            ));
        }
        share(p)
    } else {
        let (digits, mult) = match spec.as_bytes().last() {
            Some(b'k' | b'K') => (&spec[..spec.len() - 1], 1_000u64),
            Some(b'm' | b'M') => (&spec[..spec.len() - 1], 1_000_000),
            _ => (spec, 1),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        let n = n.checked_mul(mult).ok_or_else(bad)?;
        if n > u64::from(yarl_core::zone::MAX_KEYS) {
            return Err(format!("keys={spec} is more than {}", yarl_core::zone::MAX_KEYS));
        }
        n as u32
    };
    Ok(keys)
}

/// `yarl_zone`'s size when the directive is absent: 32 MiB, about 200,000 quotas.
pub const DEFAULT_ZONE_SIZE: usize = 32 << 20;

/// Bytes of a shared-memory zone of `size` bytes that the slab allocator hands out: its
/// pool header and one page descriptor per 4 KiB page take the rest (an estimate from
/// below, for sizing messages).
pub fn usable_zone_bytes(size: usize) -> usize {
    size.saturating_sub(8192) / (4096 + 32) * 4096
}

/// The largest useful `yarl_zone` for its quotas: the first whole megabyte that holds
/// [`yarl_core::zone::MAX_QUOTAS`] (about 2.6 GiB) besides its keys.
pub fn max_zone_size(keys: u32) -> usize {
    let need = yarl_core::zone::bytes_for(yarl_core::zone::MAX_QUOTAS, keys);
    let mut size = (need / 4096 * (4096 + 32) + 8192).next_multiple_of(1 << 20);
    while usable_zone_bytes(size) < need {
        size += 1 << 20;
    }
    size
}

/// Checks a `yarl_zone` size with `keys` keys; `Ok` with the number of quotas it holds
/// (names up to 23 bytes). Refuses a size past [`max_zone_size`]: the rest would be
/// reserved and never used.
pub fn check_zone_size(size: usize, keys: u32) -> Result<u32, String> {
    let min = 256 << 10;
    let max = max_zone_size(keys);
    if size > max {
        return Err(format!(
            "the zone holds at most {} quotas, which {}m is enough for",
            yarl_core::zone::MAX_QUOTAS,
            max >> 20
        ));
    }
    match yarl_core::zone::quotas_for_bytes(usable_zone_bytes(size), keys) {
        Some(q) if size >= min => Ok(q),
        _ if size >= min => Err(format!(
            "{keys} keys leave no room for quotas in {}k; give the zone more room or fewer keys",
            size >> 10
        )),
        _ => Err(format!("the zone must be at least 256k (about {} quotas)", {
            yarl_core::zone::quotas_for_bytes(usable_zone_bytes(min), 0).unwrap_or(0)
        })),
    }
}

/// Largest weight one request may add, the core's `MAX_WEIGHT_UNITS`: weights go up to 1e12,
/// as limits do, which the core's exact integer counters carry without overflow.
pub const MAX_WEIGHT: u64 = 1_000_000_000_000;

/// `on` / `off`, as `ngx_conf_set_flag_slot` accepts them (case-insensitive).
pub fn parse_flag(s: &str) -> Option<bool> {
    if s.eq_ignore_ascii_case("on") {
        Some(true)
    } else if s.eq_ignore_ascii_case("off") {
        Some(false)
    } else {
        None
    }
}

/// A rejection status: 400–599, the bounds `limit_req_status` uses.
pub fn parse_status(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|c| (400..=599).contains(c))
}

/// The levels `yarl_log_level` accepts, the same set as `limit_req_log_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `info`
    Info,
    /// `notice`
    Notice,
    /// `warn`
    Warn,
    /// `error`
    Error,
}

/// `info`, `notice`, `warn` or `error`.
pub fn parse_log_level(s: &str) -> Option<LogLevel> {
    match s {
        "info" => Some(LogLevel::Info),
        "notice" => Some(LogLevel::Notice),
        "warn" => Some(LogLevel::Warn),
        "error" => Some(LogLevel::Error),
        _ => None,
    }
}

/// A constant `yarl_account` weight: a decimal integer from 0 to [`MAX_WEIGHT`].
pub fn parse_weight(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 13 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok().filter(|&w| w <= MAX_WEIGHT)
}

/// What a weight variable evaluated to on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeWeight {
    /// Empty or unset (e.g. `$content_length` of a GET): nothing to count, weight 0.
    Empty,
    /// A usable weight.
    Value(u64),
    /// A number above [`MAX_WEIGHT`]: counted as [`MAX_WEIGHT`], which rejects on any
    /// realistic quota rather than letting a huge request through uncounted.
    Clamped(u64),
    /// Not a number: counted as 0, and the handler logs it.
    Invalid,
}

impl RuntimeWeight {
    /// The weight to account.
    pub fn units(self) -> u64 {
        match self {
            RuntimeWeight::Empty | RuntimeWeight::Invalid => 0,
            RuntimeWeight::Value(w) | RuntimeWeight::Clamped(w) => w,
        }
    }
}

/// Parses an evaluated weight variable; surrounding blanks are tolerated because header
/// values may carry them. A list is summed: nginx writes one value per upstream tried, apart
/// by `", "` (and `" : "` across internal redirects), in `$upstream_response_length` and
/// `$upstream_bytes_received` after `proxy_next_upstream`, and joins a repeated request
/// header's values with `", "`; every element must be a number (or the whole is not one).
pub fn runtime_weight(raw: &[u8]) -> RuntimeWeight {
    let s = raw.trim_ascii();
    if s.is_empty() {
        return RuntimeWeight::Empty;
    }
    let mut sum: u64 = 0;
    for part in s.split(|&b| b == b',' || b == b':') {
        let part = part.trim_ascii();
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return RuntimeWeight::Invalid;
        }
        // Past the maximum the digits no longer matter (capped one above it, so the sum
        // cannot wrap), but the rest must still be numbers: "99999999999999, x" is not one.
        let v = part.iter().fold(0u64, |v, &b| (v * 10 + u64::from(b - b'0')).min(MAX_WEIGHT + 1));
        sum = (sum + v).min(MAX_WEIGHT + 1);
    }
    if sum > MAX_WEIGHT {
        return RuntimeWeight::Clamped(MAX_WEIGHT);
    }
    RuntimeWeight::Value(sum)
}

/// The parent pid in a `/proc/PID/stat` line: the fourth field, after the command name in
/// parentheses (which may hold spaces and parentheses itself, so it ends at the last `)`).
pub fn ppid_of_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// `yarl_roots` URLs follow the agent's rules (the transport that calls them lives there):
/// `http://` or `https://`, no credentials, query or fragment, returned without a trailing
/// slash.
pub use yarl_agent::parse_root_url;

/// Decodes `%XX` escapes of a query argument (`yarl_stats?quota=a%3Ab`); `None` when the
/// an escape is malformed. Any bytes come out: a key under a template may hold any.
pub fn percent_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

/// The `yarl_roots` lines of an `http` block: one line of roots that all aggregate every
/// counter, or one line per shard, each ending in `shard=INDEX/COUNT` (the roots of that
/// shard, each run with `--shard INDEX/COUNT`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RootMap {
    /// Each line's shard (`None`: unsharded) and roots.
    pub lines: Vec<(Option<yarl_core::Shard>, Vec<String>)>,
}

impl RootMap {
    /// Adds one line; refuses a second unsharded line, a mix of both kinds, two lines for
    /// one shard, lines that disagree on the count, and a root listed twice.
    pub fn add(
        &mut self,
        shard: Option<yarl_core::Shard>,
        urls: Vec<String>,
    ) -> Result<(), String> {
        if let Some((first, _)) = self.lines.first() {
            match (first, shard) {
                (None, _) | (Some(_), None) => {
                    return Err(if first.is_none() && shard.is_none() {
                        "is duplicate".to_owned()
                    } else {
                        "lines must all have shard=INDEX/COUNT, or there must be one line \
                         without it"
                            .to_owned()
                    })
                }
                (Some(f), Some(s)) if f.count != s.count => {
                    return Err(format!(
                        "shard={s} does not match shard={f} of an earlier line: every line \
                         names the same COUNT"
                    ))
                }
                (Some(_), Some(s)) if self.lines.iter().any(|(l, _)| *l == Some(s)) => {
                    return Err(format!("shard={s} is given twice"))
                }
                _ => {}
            }
        }
        if let Some(u) = urls.iter().find(|u| self.all().contains(u)) {
            return Err(format!("the root {u} is listed twice"));
        }
        let total = self.all().len() + urls.len();
        if total > MAX_ROOTS {
            return Err(format!("{total} roots, at most {MAX_ROOTS} are possible"));
        }
        self.lines.push((shard, urls));
        Ok(())
    }

    /// Once every line is read: every shard of the count must have its line.
    pub fn check(&self) -> Result<(), String> {
        let Some((Some(first), _)) = self.lines.first() else { return Ok(()) };
        for index in 0..first.count {
            if !self.lines.iter().any(|(s, _)| s.is_some_and(|s| s.index == index)) {
                return Err(format!(
                    "no \"yarl_roots ... shard={index}/{}\" line: every shard needs its roots",
                    first.count
                ));
            }
        }
        Ok(())
    }

    /// Every root, in the order given.
    pub fn all(&self) -> Vec<String> {
        self.lines.iter().flat_map(|(_, u)| u.iter().cloned()).collect()
    }

    /// The roots of each shard by index, when sharded.
    pub fn shards(&self) -> Option<Vec<Vec<String>>> {
        let (Some(first), _) = self.lines.first()? else { return None };
        let mut out = vec![Vec::new(); first.count as usize];
        for (s, urls) in &self.lines {
            if let Some(s) = s {
                out[s.index as usize].clone_from(urls);
            }
        }
        Some(out)
    }
}

/// Roots a limiter syncs with at most (the zone keeps a session per root).
pub const MAX_ROOTS: usize = 64;

/// `shard=INDEX/COUNT`, the last argument of a sharded `yarl_roots` line; `None` when
/// the argument is not a `shard=` one.
pub fn parse_shard_arg(s: &str) -> Option<Result<yarl_core::Shard, String>> {
    let v = s.strip_prefix("shard=")?;
    Some(v.parse().map_err(|e: yarl_core::shard::ShardError| e.to_string()))
}
