//! The module's directives: the command table nginx reads, and the setters that fill the
//! configuration data of conf.rs from the directives' arguments.
//!
//! Every setter is a thin `extern "C"` shell around a Rust function returning
//! `Result<(), ConfError>`; the shell logs the error at `[emerg]` (naming the directive and the
//! value, the way nginx's own slots word it) and catches panics. `yarl_stats` and
//! `yarl_metrics` install their content handlers here, which is why this module, and not
//! conf.rs, depends on the handlers.

use crate::conf::{Charge, LocConf, MainConf, Rule, RuleKind, Weight};
use crate::parse;
use crate::Module;
use core::ffi::{c_char, c_void};
use core::ptr;
use ngx::core::{Pool, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_full_name, ngx_conf_t, ngx_http_compile_complex_value,
    ngx_http_compile_complex_value_t, ngx_http_complex_value_t, ngx_parse_size, ngx_parse_time,
    ngx_str_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_CONF_TAKE12,
    NGX_CONF_TAKE2, NGX_ERROR, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF,
    NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_SRV_CONF, NGX_LOG_EMERG, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_conf_log_error, ngx_string};
use std::path::PathBuf;
use std::time::Duration;

/// Allowed in `http`, `server` and `location` (the per-location directives).
const HTTP_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

/// The command table of `ngx_http_yarl_module` (lib.rs), ended by an empty entry. `static
/// mut` because nginx takes it as `*mut`; it only reads it.
pub(crate) static mut NGX_HTTP_YARL_COMMANDS: [ngx_command_t; 20] = [
    command(
        ngx_string!("yarl_roots"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE,
        set_roots,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_interval"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_interval,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_timeout"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_timeout,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_token"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_token,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_early"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_early,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_answers"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_answers,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_sync_ca"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        set_sync_ca,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_zone"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE12,
        set_zone,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_check"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_check,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_account"),
        HTTP_ANY | NGX_CONF_TAKE12,
        set_account,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_concurrency"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_concurrency,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_status"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_status,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_dry_run"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_dry_run,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_log_level"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_log_level,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_retry_after"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_retry_after,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_headers"),
        HTTP_ANY | NGX_CONF_TAKE1,
        set_headers,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_charge"),
        HTTP_ANY | NGX_CONF_TAKE2,
        set_charge,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_metrics"),
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        set_metrics,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("yarl_stats"),
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        set_stats,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    ngx_command_t::empty(),
];

/// One entry of the table above (the terminating one is `ngx_command_t::empty()`).
const fn command(
    name: ngx_str_t,
    type_: u32,
    set: extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char,
    conf: usize,
) -> ngx_command_t {
    ngx_command_t {
        name,
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf,
        offset: 0,
        post: ptr::null_mut(),
    }
}

/// A directive error.
enum ConfError {
    /// Logged here at `[emerg]`.
    Message(String),
    /// nginx already logged it (e.g. a bad variable in a complex value).
    Logged,
}

impl From<String> for ConfError {
    fn from(s: String) -> Self {
        ConfError::Message(s)
    }
}

type ConfResult = Result<(), ConfError>;

/// The arguments of the directive being parsed; `[0]` is its name.
///
/// # Safety
/// `cf` must be the `ngx_conf_t` nginx passed to a directive setter.
unsafe fn args<'a>(cf: *mut ngx_conf_t) -> &'a mut [ngx_str_t] {
    // SAFETY: while a setter runs, `cf->args` is an array of `ngx_str_t` holding the
    // directive name and its arguments (nginx checked their count against the TAKE flags).
    unsafe { (*(*cf).args).as_slice_mut() }
}

fn text(s: &ngx_str_t) -> String {
    String::from_utf8_lossy(s.as_bytes()).into_owned()
}

fn invalid(args: &[ngx_str_t], i: usize, why: &str) -> ConfError {
    ConfError::Message(format!(
        "invalid value \"{}\" in \"{}\" directive, {}",
        text(&args[i]),
        text(&args[0]),
        why
    ))
}

fn duplicate(args: &[ngx_str_t]) -> ConfError {
    ConfError::Message(format!("\"{}\" directive is duplicate", text(&args[0])))
}

/// Runs a setter body: logs its error at `[emerg]`, never lets a panic reach nginx.
fn run_setter(cf: *mut ngx_conf_t, body: impl FnOnce() -> ConfResult) -> *mut c_char {
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|_| {
            Err(ConfError::Message("yarl: internal error while parsing the directive".into()))
        });
    match result {
        Ok(()) => NGX_CONF_OK,
        Err(ConfError::Logged) => NGX_CONF_ERROR,
        Err(ConfError::Message(m)) => {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{}", m);
            NGX_CONF_ERROR
        }
    }
}

/// # Safety
/// `cf` must be a directive setter's `ngx_conf_t` inside the `http` block.
unsafe fn main_conf<'a>(cf: *mut ngx_conf_t) -> Result<&'a mut MainConf, ConfError> {
    // SAFETY: the caller guarantees `cf` is valid; inside `http {}` its ctx is an
    // `ngx_http_conf_ctx_t` whose main_conf holds our `MainConf` (created by create_main_conf).
    unsafe { Module::main_conf_mut(&*cf) }
        .ok_or_else(|| ConfError::Message("yarl: no http configuration".into()))
}

fn time_arg(args: &mut [ngx_str_t], i: usize) -> Result<Duration, ConfError> {
    // SAFETY: `args[i]` is a valid nginx string from the configuration parser;
    // ngx_parse_time only reads it.
    let ms = unsafe { ngx_parse_time(&mut args[i], 0) };
    let t = Duration::from_millis(ms.max(0) as u64);
    if ms == NGX_ERROR as isize || ms <= 0 || t > yarl_core::sync::MAX_SYNC_TIME {
        return Err(invalid(
            args,
            i,
            "it must be a positive time of at most an hour, such as \"500ms\" or \"1s\"",
        ));
    }
    Ok(t)
}

/// Compiles a complex value (an argument that may contain variables) into the cycle pool.
///
/// # Safety
/// `cf` must be a directive setter's `ngx_conf_t`; `value` an element of its `args`.
unsafe fn compile(
    cf: *mut ngx_conf_t,
    value: *mut ngx_str_t,
) -> Result<*mut ngx_http_complex_value_t, ConfError> {
    // SAFETY: `cf->pool` is the cycle's configuration pool, valid while parsing.
    let pool = unsafe { Pool::from_ngx_pool((*cf).pool) };
    let cv = pool.calloc_type::<ngx_http_complex_value_t>();
    if cv.is_null() {
        return Err(ConfError::Message("yarl: out of memory".into()));
    }
    // SAFETY: an all-zero ngx_http_compile_complex_value_t is its documented initial state
    // (nginx's own modules ngx_memzero it); the fields set below are the required ones.
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { core::mem::zeroed() };
    ccv.cf = cf;
    ccv.value = value;
    ccv.complex_value = cv;
    // SAFETY: ccv is initialized as ngx_http_compile_complex_value expects; on failure nginx
    // has logged the reason itself.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != NGX_OK as isize {
        return Err(ConfError::Logged);
    }
    Ok(cv)
}

/// Whether a compiled complex value has no variables (its text is `(*cv).value`).
fn is_constant(cv: *mut ngx_http_complex_value_t) -> bool {
    // SAFETY: `cv` was just filled by ngx_http_compile_complex_value.
    unsafe { (*cv).lengths.is_null() }
}

macro_rules! setter {
    ($name:ident, $body:ident) => {
        extern "C" fn $name(
            cf: *mut ngx_conf_t,
            _cmd: *mut ngx_command_t,
            conf: *mut c_void,
        ) -> *mut c_char {
            run_setter(cf, || $body(cf, conf))
        }
    };
}

setter!(set_roots, roots);
setter!(set_sync_interval, sync_interval);
setter!(set_sync_timeout, sync_timeout);
setter!(set_sync_token, sync_token);
setter!(set_check, check);
setter!(set_account, account);
setter!(set_concurrency, concurrency);
setter!(set_status, status);
setter!(set_dry_run, dry_run);
setter!(set_log_level, log_level);
setter!(set_retry_after, retry_after);
setter!(set_stats, stats);
setter!(set_zone, zone);
setter!(set_headers, headers);
setter!(set_charge, charge);
setter!(set_metrics, metrics);
setter!(set_sync_ca, sync_ca);
setter!(set_sync_early, sync_early);
setter!(set_sync_answers, sync_answers);

fn roots(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET, so `conf` is our MainConf.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    // `yarl_roots URL ... [shard=INDEX/COUNT];`, once, or once per shard.
    let mut end = args.len();
    let mut shard = None;
    if let Some(s) = parse::parse_shard_arg(args[end - 1].to_str().unwrap_or("")) {
        shard = Some(s.map_err(|why| invalid(args, end - 1, &why))?);
        end -= 1;
        if end == 1 {
            return Err(invalid(args, end, "the shard has no roots"));
        }
    }
    let mut list: Vec<String> = Vec::with_capacity(end - 1);
    for i in 1..end {
        let url = args[i].to_str().map_err(|_| invalid(args, i, "it must be UTF-8"))?;
        let url = parse::parse_root_url(url).map_err(|why| invalid(args, i, why))?;
        if list.contains(&url) {
            return Err(invalid(args, i, "the root is listed twice"));
        }
        list.push(url);
    }
    mc.root_map.add(shard, list).map_err(|why| {
        if why == "is duplicate" {
            duplicate(args)
        } else {
            ConfError::Message(format!("\"{}\" directive: {why}", text(&args[0])))
        }
    })?;
    mc.roots = Some(mc.root_map.all());
    mc.used = true;
    Ok(())
}

fn sync_interval(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if mc.interval.is_some() {
        return Err(duplicate(args));
    }
    mc.interval = Some(time_arg(args, 1)?);
    Ok(())
}

fn sync_early(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    main_choice(cf, conf, |mc| &mut mc.early, ("on", "off"))
}

fn sync_answers(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    main_choice(cf, conf, |mc| &mut mc.interest, ("touched", "all"))
}

/// An http-level directive with one of two words: `yes` sets the field to true, `no` to
/// false, anything else (or a second occurrence) is an error naming the directive.
fn main_choice(
    cf: *mut ngx_conf_t,
    conf: *mut c_void,
    field: fn(&mut MainConf) -> &mut Option<bool>,
    (yes, no): (&str, &str),
) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    let slot = field(mc);
    if slot.is_some() {
        return Err(duplicate(args));
    }
    *slot = Some(match args[1].as_bytes() {
        v if v == yes.as_bytes() => true,
        v if v == no.as_bytes() => false,
        _ => return Err(invalid(args, 1, &format!("it must be \"{yes}\" or \"{no}\""))),
    });
    Ok(())
}

fn sync_timeout(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if mc.timeout.is_some() {
        return Err(duplicate(args));
    }
    mc.timeout = Some(time_arg(args, 1)?);
    Ok(())
}

fn sync_token(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if mc.token.is_some() {
        return Err(duplicate(args));
    }
    let token = args[1].to_str().map_err(|_| invalid(args, 1, "it must be UTF-8"))?;
    // The token goes into an HTTP header: refuse what a header cannot carry.
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfError::Message(format!(
            "invalid value in \"{}\" directive, the token must be non-empty printable ASCII \
             without blanks",
            text(&args[0])
        )));
    }
    mc.token = Some(token.to_owned());
    Ok(())
}

fn zone(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if mc.zone_size.is_some() {
        return Err(duplicate(args));
    }
    // SAFETY: `args[1]` is a valid nginx string; ngx_parse_size only reads it.
    let size = unsafe { ngx_parse_size(&mut args[1]) };
    let size = usize::try_from(size)
        .map_err(|_| invalid(args, 1, "it must be a size such as \"32m\" or \"1g\""))?;
    let spec = match args.get(2) {
        None => None,
        Some(a) => Some(
            a.to_str()
                .ok()
                .and_then(|s| s.strip_prefix("keys="))
                .ok_or_else(|| invalid(args, 2, "the second parameter is keys=N or keys=P%"))?,
        ),
    };
    let keys = parse::parse_keys(spec, size).map_err(|why| invalid(args, 2, &why))?;
    parse::check_zone_size(size, keys).map_err(|why| invalid(args, 1, &why))?;
    mc.zone_size = Some(size);
    mc.zone_keys = Some(keys);
    Ok(())
}

fn sync_ca(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_MAIN_CONF_OFFSET.
    let mc = unsafe { &mut *conf.cast::<MainConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if mc.ca.is_some() {
        return Err(duplicate(args));
    }
    if args[1].is_empty() {
        return Err(invalid(args, 1, "the file name is empty"));
    }
    // Relative to the configuration prefix, like ssl_trusted_certificate.
    // SAFETY: `cf->cycle` is the cycle being configured; ngx_conf_full_name rewrites
    // `args[1]` in place with a string from the cycle pool.
    if unsafe { ngx_conf_full_name((*cf).cycle, &mut args[1], 1) } != NGX_OK as isize {
        return Err(ConfError::Message("yarl: out of memory".into()));
    }
    let path = PathBuf::from(
        args[1].to_str().map_err(|_| invalid(args, 1, "the file name must be UTF-8"))?,
    );
    yarl_agent::load_ca(&path).map_err(|e| invalid(args, 1, &e.to_string()))?;
    mc.ca = Some(path);
    Ok(())
}

/// Compiles a quota-name argument; a constant name is validated now, one with variables on
/// every request (an invalid evaluated name simply matches no quota).
fn quota_name(
    cf: *mut ngx_conf_t,
    args: &mut [ngx_str_t],
) -> Result<*mut ngx_http_complex_value_t, ConfError> {
    if args[1].is_empty() {
        return Err(invalid(args, 1, "the quota name is empty"));
    }
    let value: *mut ngx_str_t = &mut args[1];
    // SAFETY: `cf` is nginx's, `value` an element of its args.
    let cv = unsafe { compile(cf, value)? };
    if is_constant(cv) {
        let name = args[1].to_str().map_err(|_| invalid(args, 1, "it must be UTF-8"))?;
        if let Err(e) = yarl_core::validate_name(name) {
            return Err(invalid(args, 1, &format!("invalid quota name: {e}")));
        }
        if yarl_core::is_template(name) {
            return Err(invalid(
                args,
                1,
                "it names a template, which has a bucket per key: name a key of it, \
                 such as \"api_key_$http_x_api_key\" for \"api_key_*\"",
            ));
        }
        // Written as the admin API writes it (`%XX` for a byte outside the charset),
        // matched as the bytes it stands for, as a name from request data is.
        let raw = yarl_core::raw_name(name);
        if raw != name.as_bytes() {
            // SAFETY: `cf->pool` is the cycle's configuration pool, valid while parsing
            // and for the cycle's life, as the complex value compiled into it.
            let pool = unsafe { Pool::from_ngx_pool((*cf).pool) };
            let data = pool.alloc_unaligned(raw.len()).cast::<u8>();
            if data.is_null() {
                return Err(ConfError::Message("yarl: out of memory".into()));
            }
            // SAFETY: `data` holds `raw.len()` bytes just allocated; a constant complex
            // value is its `value` alone (no lengths or values codes), which nginx reads
            // as `len` bytes at `data`.
            unsafe {
                core::ptr::copy_nonoverlapping(raw.as_ptr(), data, raw.len());
                (*cv).value.data = data;
                (*cv).value.len = raw.len();
            }
        }
    }
    Ok(cv)
}

fn mark_used(cf: *mut ngx_conf_t) -> ConfResult {
    // SAFETY: called from a setter inside `http {}`.
    unsafe { main_conf(cf) }?.used = true;
    Ok(())
}

fn check(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET, so `conf` is our LocConf.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    let name = quota_name(cf, args)?;
    lc.rules.push(Rule { kind: RuleKind::Check, name, weight: Weight::Fixed(0) });
    mark_used(cf)
}

fn concurrency(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET, so `conf` is our LocConf.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    let name = quota_name(cf, args)?;
    lc.rules.push(Rule { kind: RuleKind::Concurrency, name, weight: Weight::Fixed(0) });
    mark_used(cf)
}

fn account(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    let name = quota_name(cf, args)?;
    let weight = if args.len() < 3 { Weight::Fixed(1) } else { weight_arg(cf, args, 2)? };
    lc.rules.push(Rule { kind: RuleKind::Account, name, weight });
    mark_used(cf)
}

/// A weight argument: a constant checked now, or a variable evaluated per request.
fn weight_arg(cf: *mut ngx_conf_t, args: &mut [ngx_str_t], i: usize) -> Result<Weight, ConfError> {
    let value: *mut ngx_str_t = &mut args[i];
    // SAFETY: `cf` is nginx's, `value` an element of its args.
    let cv = unsafe { compile(cf, value)? };
    if is_constant(cv) {
        let w = args[i].to_str().ok().and_then(parse::parse_weight).ok_or_else(|| {
            invalid(args, i, "the weight must be an integer from 0 to 1000000000000")
        })?;
        Ok(Weight::Fixed(w))
    } else {
        Ok(Weight::Variable(cv))
    }
}

/// Lines of `yarl_charge` seen so far in this configuration (numbers them for logging).
static CHARGE_LINES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn charge(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    let name = quota_name(cf, args)?;
    let weight = weight_arg(cf, args, 2)?;
    let line = CHARGE_LINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    lc.charges.push(Charge { name, weight, line });
    mark_used(cf)
}

fn headers(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    flag(cf, &mut lc.headers)
}

fn metrics(cf: *mut ngx_conf_t, _conf: *mut c_void) -> ConfResult {
    content_handler(cf, Some(crate::metrics::metrics_handler))
}

fn status(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if lc.status.is_some() {
        return Err(duplicate(args));
    }
    let code = args[1].to_str().ok().and_then(parse::parse_status);
    lc.status = Some(code.ok_or_else(|| invalid(args, 1, "it must be between 400 and 599"))?);
    Ok(())
}

fn flag(cf: *mut ngx_conf_t, slot: &mut Option<bool>) -> ConfResult {
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if slot.is_some() {
        return Err(duplicate(args));
    }
    let v = args[1].to_str().ok().and_then(parse::parse_flag);
    *slot = Some(v.ok_or_else(|| invalid(args, 1, "it must be \"on\" or \"off\""))?);
    Ok(())
}

fn dry_run(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    flag(cf, &mut lc.dry_run)
}

fn retry_after(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    flag(cf, &mut lc.retry_after)
}

fn log_level(cf: *mut ngx_conf_t, conf: *mut c_void) -> ConfResult {
    // SAFETY: registered with NGX_HTTP_LOC_CONF_OFFSET.
    let lc = unsafe { &mut *conf.cast::<LocConf>() };
    // SAFETY: called from a setter with nginx's `cf`.
    let args = unsafe { args(cf) };
    if lc.log_level.is_some() {
        return Err(duplicate(args));
    }
    let v = args[1].to_str().ok().and_then(parse::parse_log_level);
    lc.log_level = Some(v.ok_or_else(|| {
        invalid(args, 1, "it must be \"info\", \"notice\", \"warn\" or \"error\"")
    })?);
    Ok(())
}

fn stats(cf: *mut ngx_conf_t, _conf: *mut c_void) -> ConfResult {
    content_handler(cf, Some(crate::stats::stats_handler))
}

/// Installs a content handler for the location (as stub_status does).
fn content_handler(cf: *mut ngx_conf_t, handler: ngx::ffi::ngx_http_handler_pt) -> ConfResult {
    // SAFETY: `cf` is a location-level setter's: its ctx holds the core module's location
    // configuration, which is where content handlers are installed.
    let clcf = unsafe { NgxHttpCoreModule::location_conf_mut(&*cf) }
        .ok_or_else(|| ConfError::Message("yarl: no location configuration".into()))?;
    if clcf.handler.is_some() {
        // SAFETY: called from a setter with nginx's `cf`.
        let args = unsafe { args(cf) };
        return Err(ConfError::Message(format!(
            "\"{}\" directive conflicts with another content handler in this location",
            text(&args[0])
        )));
    }
    clcf.handler = handler;
    mark_used(cf)
}
