//! The PREACCESS handler, its per-request state, and `$yarl_status` / `$yarl_quota`.
//!
//! # Why PREACCESS
//! It is where `limit_req` and `limit_conn` run: rate limiting happens before `allow`/`deny`
//! and authentication, is not affected by `satisfy any` (which only changes how ACCESS-phase
//! verdicts combine), and costs nothing but a table lookup. A pass is `NGX_DECLINED` (next
//! handler of the phase, so `limit_req` after us still runs), never `NGX_OK`, which would
//! skip the rest of the phase.
//!
//! # Order and all-or-nothing
//! Check rules are decided first, in configuration order (they count nothing); then all
//! account rules together with `Limiter::account_many`: the request is counted on every quota
//! of every account chain, or, if any of them rejects, on none (a request refused by one limit
//! takes nothing from the others).
//!
//! # Decided once per request
//! The decision is stored in a request-pool cleanup entry, not only in the module context:
//! an internal redirect (`error_page`, `try_files`) zeroes module contexts and runs the phases
//! again, and must neither count the request twice nor reject its error page. The entry is
//! found again by its cleanup handler, the pattern `ngx_http_realip_module` uses.
//!
//! # Requests in flight
//! `yarl_concurrency` lines take a slot of their quota's `max_in_flight` first (one
//! compare-and-swap per capped level, on the shares this nginx holds), all of them or none;
//! the rate rules decide after, and a rejection gives the slots back at once. A request
//! that passes keeps them in its [`Ctx`], which the request pool's cleanup drops when the
//! request ends, however it ends (a normal end, a client abort, an upstream error; an
//! internal redirect keeps the pool and the slots): dropping it gives them back.

use crate::conf::{LocConf, RuleKind, Weight};
use crate::parse::{self, RuntimeWeight};
use crate::worker::{self, Counted};
use crate::Module;
use core::ffi::c_void;
use ngx::core::Status;
use ngx::ffi::{
    ngx_http_request_t, ngx_int_t, ngx_pool_cleanup_add, ngx_variable_value_t, NGX_LOG_ERR,
    NGX_LOG_INFO,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, Request};
use ngx::ngx_log_error;
use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use yarl_core::{display_name, Acquired, Limiter, Outcome, Permit, QuotaId};

/// The value of `$yarl_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YarlStatus {
    /// Every matched quota passed.
    Passed,
    /// Rejected with `yarl_status`.
    Rejected,
    /// Would have been rejected; passed because of `yarl_dry_run on`, or because the quota
    /// that would have rejected is in shadow mode (`"dry_run": true`).
    RejectedDryRun,
    /// No rule matched a quota.
    Unlimited,
}

impl YarlStatus {
    fn as_str(self) -> &'static str {
        match self {
            YarlStatus::Passed => "PASSED",
            YarlStatus::Rejected => "REJECTED",
            YarlStatus::RejectedDryRun => "REJECTED_DRY_RUN",
            YarlStatus::Unlimited => "UNLIMITED",
        }
    }
}

/// What the handler decided for one request. Lives in the request pool (see module docs).
#[derive(Debug)]
pub struct Ctx {
    /// `None` until a location with rules decided (a location with `yarl_charge` lines
    /// only stores a Ctx for `charges` alone).
    status: Option<YarlStatus>,
    /// The rejecting quota, else the last name that matched a quota.
    quota: Option<QuotaName>,
    /// `yarl_account` lines whose weight was empty when the request was decided, charged
    /// once it is done (see [`Deferred`]); empty for nearly every request.
    deferred: Vec<Deferred>,
    /// Slots of `yarl_concurrency` quotas this request holds until it ends: kept for its
    /// drop, which gives them back when the request's pool is freed.
    #[allow(dead_code)]
    permits: Held,
    /// The location whose `yarl_charge` lines the request is charged by: the first it
    /// reached the access phase in, not the one it ends in (after `try_files … @app`,
    /// `error_page`, `X-Accel-Redirect`), whose lines may be none or others. Location
    /// configurations live in the cycle's pool, as long as any request of the cycle.
    charges: *const LocConf,
}

/// Slots taken for a request, given back when dropped: from the moment they are taken, so
/// that a panic before the request's state is stored (caught at the handler's edge) does
/// not leave them taken until the worker exits.
#[derive(Debug, Default)]
struct Held(Vec<Permit>);

impl Drop for Held {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        if let Some(limiter) = worker::limiter() {
            for p in &self.0 {
                limiter.release(p);
            }
        }
    }
}

/// A `yarl_account` line whose weight variable was empty at the access phase, such as
/// `$content_length` of a chunked upload or an HTTP/2 body without a length: the request was
/// decided with weight 0 (a full quota still rejects it) and, if it passed, the variable is
/// evaluated again in the log phase, when nginx knows how long the body it read was, and
/// that weight is charged to the chain.
#[derive(Debug)]
struct Deferred {
    /// The evaluated name's bytes (request pool, as [`QuotaName::Evaluated`]).
    name: (*const u8, usize),
    /// The line's weight, compiled in the cycle pool.
    weight: *mut ngx::ffi::ngx_http_complex_value_t,
}

/// A quota name kept for the rest of the request (`$yarl_quota`).
#[derive(Debug)]
enum QuotaName {
    /// A rule's evaluated name, not copied: its bytes are in the request pool (or in the
    /// configuration, for a name without variables), and both outlive the pool cleanup that
    /// drops the [`Ctx`] holding this. A pass allocates nothing.
    Evaluated(*const u8, usize),
    /// The rejecting quota's name (the leaf's or an ancestor's), read from the table.
    Owned(Box<str>),
}

impl QuotaName {
    fn of(name: Cow<'_, str>) -> Self {
        match name {
            Cow::Borrowed(s) => QuotaName::Evaluated(s.as_ptr(), s.len()),
            Cow::Owned(s) => QuotaName::Owned(s.into_boxed_str()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            // SAFETY: the bytes of an evaluated name live as long as the request (see the
            // variant), and a Ctx is only reachable through its request.
            QuotaName::Evaluated(p, n) => unsafe { core::slice::from_raw_parts(*p, *n) },
            QuotaName::Owned(s) => s.as_bytes(),
        }
    }
}

/// The pool cleanup that owns a [`Ctx`]: drops it with the request pool. Its address also
/// identifies our entry among the pool's cleanups.
unsafe extern "C" fn ctx_cleanup(data: *mut c_void) {
    // Dropping a Ctx gives back its slots (`Limiter::release`): nothing may unwind into
    // nginx, so a panic there is caught and the slots stay taken.
    let drop = AssertUnwindSafe(|| {
        // SAFETY: `data` is the Ctx written by `store_ctx`; the pool runs each cleanup once.
        unsafe { core::ptr::drop_in_place(data.cast::<Ctx>()) };
    });
    let _ = catch_unwind(drop);
}

fn is_ctx_cleanup(h: Option<unsafe extern "C" fn(*mut c_void)>) -> bool {
    h.is_some_and(|f| core::ptr::eq(f as *const (), ctx_cleanup as *const ()))
}

/// The decision already made for this request, if any.
fn find_ctx(r: &Request) -> Option<&Ctx> {
    if let Some(c) = r.get_module_ctx::<Ctx>(Module::module()) {
        return Some(c);
    }
    let raw: &ngx_http_request_t = r.as_ref();
    // SAFETY: `r->pool` is the request's live pool; its cleanup list is a well-formed,
    // null-terminated list owned by that pool, and only our handler's entries are read as Ctx.
    unsafe {
        let mut c = (*raw.pool).cleanup;
        while !c.is_null() {
            if is_ctx_cleanup((*c).handler) && !(*c).data.is_null() {
                let ctx = (*c).data.cast::<Ctx>();
                r.set_module_ctx(ctx.cast(), Module::module());
                return Some(&*ctx);
            }
            c = (*c).next;
        }
    }
    None
}

fn store_ctx(r: &Request, ctx: Ctx) -> bool {
    let raw: &ngx_http_request_t = r.as_ref();
    // SAFETY: ngx_pool_cleanup_add allocates `size` bytes aligned to NGX_ALIGNMENT (8, enough
    // for Ctx) in the live request pool; the Ctx is written before the handler is set, and
    // dropped by `ctx_cleanup` when the pool is destroyed.
    unsafe {
        let cln = ngx_pool_cleanup_add(raw.pool, core::mem::size_of::<Ctx>());
        if cln.is_null() || (*cln).data.is_null() {
            return false;
        }
        let p = (*cln).data.cast::<Ctx>();
        debug_assert!(p.is_aligned());
        p.write(ctx);
        (*cln).handler = Some(ctx_cleanup);
        r.set_module_ctx(p.cast(), Module::module());
    }
    true
}

/// The handler registered in the PREACCESS phase.
pub(crate) unsafe extern "C" fn access_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    match catch_unwind(AssertUnwindSafe(|| access(r))) {
        Ok(s) => s.0,
        Err(_) => {
            // Fail open: a bug in the module must not fail the request.
            ngx_log_error!(
                NGX_LOG_ERR,
                r.log(),
                "yarl: internal error in the access handler, request passed"
            );
            Status::NGX_DECLINED.0
        }
    }
}

/// Borrows the request's evaluated names: a pass allocates nothing (a rejection reads the
/// rejecting quota's name from the table).
struct Verdict<'a> {
    status: YarlStatus,
    quota: Option<Cow<'a, str>>,
    fill: f64,
    retry_after: Option<u32>,
    /// The name whose chain decided (the rule's name, its bytes as the request gave them):
    /// what the RateLimit fields describe.
    chain: Option<&'a [u8]>,
    /// Account lines to charge after the response (see [`Deferred`]).
    deferred: Vec<Deferred>,
    /// The concurrency counter that refused the request a slot.
    refused_slot: Option<QuotaId>,
}

fn access(r: &mut Request) -> Status {
    if !r.is_main() {
        return Status::NGX_DECLINED;
    }
    let Some(lc) = Module::location_conf(r) else { return Status::NGX_DECLINED };
    let found = find_ctx(r);
    if found.is_some_and(|c| c.status.is_some()) {
        return Status::NGX_DECLINED;
    }
    let charges = found.map_or(core::ptr::from_ref(lc), |c| c.charges);
    if lc.rules.is_empty() {
        if found.is_none() && !lc.charges.is_empty() {
            let ctx = Ctx {
                status: None,
                quota: None,
                deferred: Vec::new(),
                permits: Held::default(),
                charges,
            };
            if !store_ctx(r, ctx) {
                ngx_log_error!(NGX_LOG_ERR, r.log(), "yarl: cannot store the request state");
            }
        }
        return Status::NGX_DECLINED;
    }
    let Some(limiter) = worker::limiter() else {
        // No limiter in this process (start failed, logged at init): fail open.
        return Status::NGX_DECLINED;
    };
    let dry = lc.dry_run();
    let (mut v, permits, would) = match acquire(r, lc, limiter, dry) {
        Ok((permits, would)) => (decide(r, lc, limiter, dry), permits, would),
        Err(v) => (v, Held::default(), None),
    };
    // A request that holds a slot was limited, if only by its concurrency quota.
    if v.status == YarlStatus::Unlimited && !permits.0.is_empty() {
        v.status = YarlStatus::Passed;
    }
    // The account lines left to weigh after the response go with a request that goes on:
    // passed, or passed by everything enforced (a quota in shadow mode would have refused
    // it: its enforced parents still want the weight; the shadow quota takes it too, as
    // `yarl_charge` would). A slot refused in a dry run, or by a quota in shadow mode, is
    // what it reports unless a rate rejected it.
    let deferred = match v.status {
        YarlStatus::Rejected => Vec::new(),
        _ => std::mem::take(&mut v.deferred),
    };
    if let (Some((quota, id)), YarlStatus::Passed | YarlStatus::Unlimited) = (would, v.status) {
        v.status = YarlStatus::RejectedDryRun;
        v.quota = Some(quota);
        v.fill = 0.0;
        v.refused_slot = Some(id);
    }
    // Slots are held only by a request that goes on.
    let permits = if v.status == YarlStatus::Rejected { Held::default() } else { permits };
    let log = r.log();
    if let (YarlStatus::Rejected | YarlStatus::RejectedDryRun, Some(q)) = (v.status, &v.quota) {
        ngx_log_error!(
            lc.log_level(),
            log,
            "limiting requests by quota \"{}\", fill {:.3}{}",
            q,
            v.fill,
            if dry {
                ", dry run"
            } else if v.status == YarlStatus::RejectedDryRun {
                ", dry run (the quota is in shadow mode)"
            } else {
                ""
            }
        );
    }
    worker::count(match v.status {
        YarlStatus::Passed => Counted::Passed,
        YarlStatus::Unlimited => Counted::Unlimited,
        YarlStatus::Rejected => Counted::Rejected,
        YarlStatus::RejectedDryRun => Counted::RejectedDryRun,
    });
    let status = v.status;
    let retry_after = v.retry_after;
    let fields = match v.chain {
        Some(chain) if lc.headers() => {
            ratelimit_fields(limiter, chain, status, v.quota.as_deref(), retry_after)
        }
        _ => None,
    };
    let fields = if lc.headers() {
        limiter.with_slot_fields(fields, &permits.0, v.refused_slot)
    } else {
        fields
    };
    let quota = v.quota.map(QuotaName::of);
    if let Some((policy, state)) = fields {
        if r.add_header_out("RateLimit-Policy", &policy).is_none()
            || r.add_header_out("RateLimit", &state).is_none()
        {
            ngx_log_error!(NGX_LOG_ERR, log, "yarl: cannot add the RateLimit header fields");
        }
    }
    if !store_ctx(r, Ctx { status: Some(status), quota, deferred, permits, charges }) {
        // The Ctx was dropped with its slots, so they are given back.
        ngx_log_error!(NGX_LOG_ERR, log, "yarl: cannot store the request state, request passed");
        return Status::NGX_DECLINED;
    }
    if status != YarlStatus::Rejected {
        return Status::NGX_DECLINED;
    }
    if lc.retry_after() {
        let secs = retry_after.unwrap_or(1).to_string();
        if r.add_header_out("Retry-After", &secs).is_none() {
            ngx_log_error!(NGX_LOG_ERR, log, "yarl: cannot add the Retry-After header");
        }
    }
    Status(lc.status() as ngx_int_t)
}

/// A slot the request goes on without: the quota that would have refused it, and its id.
type WouldRefuse<'a> = Option<(Cow<'a, str>, QuotaId)>;

/// Takes a slot of every `yarl_concurrency` line's quota, all or none: the slots, or the
/// verdict of the refusal. With `yarl_dry_run on`, or from a quota in shadow mode, a
/// refusal lets the request on without the slot; the first such is returned beside the
/// slots, to be reported as `REJECTED_DRY_RUN` unless a rate rule rejects the request.
fn acquire<'a>(
    r: &'a Request,
    lc: &LocConf,
    limiter: &Limiter,
    dry: bool,
) -> Result<(Held, WouldRefuse<'a>), Verdict<'a>> {
    let mut permits = Held::default();
    let mut would: WouldRefuse<'a> = None;
    for rule in lc.rules.iter().filter(|rule| rule.kind == RuleKind::Concurrency) {
        // SAFETY: as in `decide`.
        let Some(name) = r.get_complex_value(unsafe { &*rule.name }) else { continue };
        let name = name.as_bytes();
        if name.is_empty() {
            continue;
        }
        match limiter.acquire(name) {
            Acquired::Admitted(p) if p.is_empty() => {}
            Acquired::Admitted(p) => permits.0.push(p),
            Acquired::WouldRefuse(p, id) => {
                if !p.is_empty() {
                    permits.0.push(p);
                }
                would = would.or_else(|| Some((display_name(name), id)));
            }
            Acquired::Refused(id) if dry => {
                would = would.or_else(|| Some((display_name(name), id)));
            }
            // The slots taken at the lines before go back as `permits` is dropped.
            Acquired::Refused(id) => {
                return Err(Verdict {
                    status: YarlStatus::Rejected,
                    quota: Some(display_name(name)),
                    fill: 0.0,
                    retry_after: Some(1),
                    chain: None,
                    deferred: Vec::new(),
                    refused_slot: Some(id),
                });
            }
        }
    }
    Ok((permits, would))
}

fn decide<'a>(r: &'a Request, lc: &LocConf, limiter: &Limiter, dry: bool) -> Verdict<'a> {
    let rejected = |d: yarl_core::Decision, name: &'a [u8]| Verdict {
        status: if dry || d.outcome == Outcome::RejectedDryRun {
            YarlStatus::RejectedDryRun
        } else {
            YarlStatus::Rejected
        },
        quota: Some(d.quota.map_or(display_name(name), |q| Cow::Owned(q.into_string()))),
        fill: d.fill,
        retry_after: d.retry_after,
        chain: Some(name),
        deferred: Vec::new(),
        refused_slot: None,
    };
    let mut matched: Option<&[u8]> = None;
    // The first rejection of a quota in shadow mode: the request goes on, and is reported as
    // REJECTED_DRY_RUN if nothing enforced rejects it.
    let mut shadowed: Option<(yarl_core::Decision, &[u8])> = None;
    // Account lines stay on the stack: a location rarely has more than a few.
    let mut inline: [(&[u8], u64); 4] = [(b"", 0); 4];
    let mut spill: Vec<(&[u8], u64)> = Vec::new();
    let mut deferred = Vec::new();
    let mut n = 0;
    for rule in &lc.rules {
        // SAFETY: rule names are compiled complex values in the cycle pool, alive as long as
        // the configuration this request runs under.
        let Some(name) = r.get_complex_value(unsafe { &*rule.name }) else { continue };
        // Names are bytes (a key under a template may be a binary address); an empty one
        // matches nothing, the way an empty `limit_req_zone` key does not limit.
        let name = name.as_bytes();
        if name.is_empty() {
            continue;
        }
        match (rule.kind, rule.weight) {
            // Taken before the rate rules (`acquire`).
            (RuleKind::Concurrency, _) => {}
            (RuleKind::Check, _) => {
                let d = limiter.check(name);
                match d.outcome {
                    Outcome::Unlimited => {}
                    Outcome::Passed => matched = Some(name),
                    Outcome::RejectedDryRun => {
                        matched = Some(name);
                        shadowed.get_or_insert((d, name));
                    }
                    Outcome::Rejected => return rejected(d, name),
                }
            }
            (RuleKind::Account, w) => {
                let units = match w {
                    Weight::Fixed(n) => n,
                    Weight::Variable(cv) => weight_of(r, cv, name).unwrap_or_else(|| {
                        deferred.push(Deferred { name: (name.as_ptr(), name.len()), weight: cv });
                        0
                    }),
                };
                if n < inline.len() {
                    inline[n] = (name, units);
                } else {
                    if spill.is_empty() {
                        spill.extend_from_slice(&inline);
                    }
                    spill.push((name, units));
                }
                n += 1;
            }
        }
    }
    let accounts = if n <= inline.len() { &inline[..n] } else { &spill[..] };
    if !accounts.is_empty() {
        // All account lines of the location count together or not at all.
        match limiter.account_many_matched(accounts) {
            Ok((d, Some(k))) if d.outcome == Outcome::Rejected => {
                return rejected(d, accounts[k].0);
            }
            Ok((d, Some(k))) if d.outcome == Outcome::Passed => {
                matched = Some(accounts[k].0);
            }
            Ok((d, Some(k))) if d.outcome == Outcome::RejectedDryRun => {
                matched = Some(accounts[k].0);
                shadowed.get_or_insert((d, accounts[k].0));
            }
            // Unlimited; or weights above the maximum, which runtime_weight and the directive
            // parser already clamp: never worth failing a request over.
            _ => {}
        }
    }
    if let Some((d, name)) = shadowed {
        return Verdict { deferred, ..rejected(d, name) };
    }
    let status = if matched.is_some() { YarlStatus::Passed } else { YarlStatus::Unlimited };
    Verdict {
        status,
        chain: matched,
        quota: matched.map(display_name),
        fill: 0.0,
        retry_after: None,
        deferred,
        refused_slot: None,
    }
}

/// `RateLimit-Policy` and `RateLimit` for `chain` (yarl_headers on): every level on a
/// pass, the levels up to the rejecting quota on a rejection, whose `t` is `Retry-After`.
fn ratelimit_fields(
    limiter: &Limiter,
    chain: &[u8],
    status: YarlStatus,
    rejecting: Option<&str>,
    retry_after: Option<u32>,
) -> Option<(String, String)> {
    let mut levels = limiter.levels(chain);
    let mut rejected = None;
    if status == YarlStatus::Rejected || status == YarlStatus::RejectedDryRun {
        if let Some(k) = rejecting.and_then(|q| levels.iter().position(|l| l.name == q)) {
            levels.truncate(k + 1);
            rejected = Some((k, retry_after.unwrap_or(1)));
        }
    }
    yarl_core::ratelimit::fields(&levels, rejected)
}

/// The LOG-phase handler: `yarl_charge` adds each line's weight to its quota's chain once
/// the response is done, whatever it was (passed, rejected by yarl or anything else, or an
/// error), without deciding anything.
pub(crate) unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    if catch_unwind(AssertUnwindSafe(|| charge(r))).is_err() {
        ngx_log_error!(NGX_LOG_ERR, r.log(), "yarl: internal error in the log phase handler");
    }
    Status::NGX_OK.0
}

/// `yarl_charge` lines whose weight was empty or not a number, logged once per worker each.
static BAD_WEIGHT_LOGGED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Whether a deferred account weight still empty after the response was logged (once per
/// worker: a GET on a `$content_length` line has no body, and that is no news).
static EMPTY_AFTER_LOGGED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

fn charge(r: &mut Request) {
    if !r.is_main() {
        return;
    }
    charge_deferred(r);
    let lc = match find_ctx(r) {
        // SAFETY: the location's configuration outlives the request (see `Ctx::charges`).
        Some(c) => unsafe { &*c.charges },
        None => {
            let Some(lc) = Module::location_conf(r) else { return };
            lc
        }
    };
    if lc.charges.is_empty() {
        return;
    }
    let Some(limiter) = worker::limiter() else { return };
    for c in &lc.charges {
        // SAFETY: compiled complex values in the cycle pool (see `decide`).
        let Some(name) = r.get_complex_value(unsafe { &*c.name }) else { continue };
        let name = name.as_bytes();
        if name.is_empty() {
            continue;
        }
        let units = match c.weight {
            Weight::Fixed(n) => n,
            Weight::Variable(cv) => {
                // SAFETY: as above.
                let raw =
                    r.get_complex_value(unsafe { &*cv }).map(|s| s.as_bytes()).unwrap_or_default();
                let w = parse::runtime_weight(raw);
                if matches!(w, RuntimeWeight::Empty | RuntimeWeight::Invalid) {
                    let mut logged = BAD_WEIGHT_LOGGED.lock().unwrap_or_else(|e| e.into_inner());
                    if !logged.contains(&c.line) {
                        logged.push(c.line);
                        ngx_log_error!(
                            NGX_LOG_INFO,
                            r.log(),
                            "yarl: charge weight \"{}\" for quota \"{}\" is {}, counted as 0 \
                             (logged once per worker for this yarl_charge line)",
                            raw.escape_ascii(),
                            display_name(name),
                            if raw.trim_ascii().is_empty() { "empty" } else { "not a number" }
                        );
                    }
                }
                w.units()
            }
        };
        if units > 0 {
            let _ = limiter.charge(name, units);
        }
    }
}

/// Charges the account lines whose weight was empty when the request passed, with their
/// weight now (see [`Deferred`]).
fn charge_deferred(r: &Request) {
    let Some(ctx) = find_ctx(r) else { return };
    if ctx.deferred.is_empty() {
        return;
    }
    let Some(limiter) = worker::limiter() else { return };
    for d in &ctx.deferred {
        // SAFETY: the name's bytes are in the request pool (or the configuration), alive
        // until the pool is freed, after this phase; see `QuotaName::Evaluated`.
        let name = unsafe { core::slice::from_raw_parts(d.name.0, d.name.1) };
        match weight_of(r, d.weight, name) {
            Some(units) if units > 0 => {
                let _ = limiter.charge(name, units);
            }
            Some(_) => {}
            None => {
                if !EMPTY_AFTER_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    ngx_log_error!(
                        NGX_LOG_INFO,
                        r.log(),
                        "yarl: the weight for quota \"{}\" was empty before and after the \
                         request, counted as 0 (logged once per worker)",
                        display_name(name)
                    );
                }
            }
        }
    }
}

/// The weight of an account line's variable; `None` when it is empty (the line is then
/// charged after the response, see [`Deferred`]).
fn weight_of(r: &Request, cv: *mut ngx::ffi::ngx_http_complex_value_t, name: &[u8]) -> Option<u64> {
    let name = display_name(name);
    // SAFETY: `cv` is a compiled complex value in the cycle pool (see `decide`).
    let raw = r.get_complex_value(unsafe { &*cv }).map(|s| s.as_bytes()).unwrap_or_default();
    let w = parse::runtime_weight(raw);
    // At `info`, as nginx logs what a client got wrong: the weight may come from request
    // data (`$http_x_cost`), and a line per request at `warn` let a client fill the log.
    match w {
        RuntimeWeight::Invalid => {
            ngx_log_error!(
                NGX_LOG_INFO,
                r.log(),
                "yarl: weight \"{}\" for quota \"{}\" is not a number, counted as 0",
                raw.escape_ascii(),
                name
            );
        }
        RuntimeWeight::Clamped(m) => {
            ngx_log_error!(
                NGX_LOG_INFO,
                r.log(),
                "yarl: weight \"{}\" for quota \"{}\" is too large, counted as {}",
                raw.escape_ascii(),
                name,
                m
            );
        }
        RuntimeWeight::Empty => return None,
        RuntimeWeight::Value(_) => {}
    }
    Some(w.units())
}

/// Fills `v` with `bytes`, which must outlive the request.
///
/// # Safety
/// `v` must be the variable value nginx passed to a getter.
unsafe fn set_value(v: *mut ngx_variable_value_t, bytes: &[u8]) {
    // SAFETY: per the caller; nginx only reads `data` for `len` bytes.
    unsafe {
        let v = &mut *v;
        v.data = bytes.as_ptr().cast_mut();
        v.set_len(bytes.len() as u32);
        v.set_valid(1);
        v.set_no_cacheable(0);
        v.set_not_found(0);
    }
}

/// # Safety
/// As [`set_value`].
unsafe fn set_not_found(v: *mut ngx_variable_value_t) {
    // SAFETY: per the caller.
    unsafe { (*v).set_not_found(1) };
}

/// Which variable a getter serves.
pub(crate) const VAR_STATUS: usize = 0;
/// Which variable a getter serves.
pub(crate) const VAR_QUOTA: usize = 1;

/// Getter of `$yarl_status` and `$yarl_quota` (`data` says which). Not found when no rule
/// decided this request, like `$limit_req_status`.
pub(crate) unsafe extern "C" fn variable_get(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls variable getters with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    let ok = catch_unwind(AssertUnwindSafe(|| {
        let value: Option<&[u8]> = match (find_ctx(r), data) {
            (Some(c), VAR_STATUS) => c.status.map(|s| s.as_str().as_bytes()),
            (Some(c), VAR_QUOTA) => c.quota.as_ref().map(QuotaName::as_bytes),
            _ => None,
        };
        // SAFETY: `v` is nginx's; the bytes are 'static or owned by the Ctx, which lives in
        // the request pool until the request is freed, after logging.
        unsafe {
            match value {
                Some(b) => set_value(v, b),
                None => set_not_found(v),
            }
        }
    }));
    if ok.is_err() {
        // SAFETY: as above.
        unsafe { set_not_found(v) };
    }
    Status::NGX_OK.0
}
