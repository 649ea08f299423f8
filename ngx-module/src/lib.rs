//! # ngx_http_yarl_module
//!
//! YARL in nginx: cluster-wide quotas decided in every worker with no network call on the
//! request path. Workers decide from the counters in shared memory; a background agent, one
//! per nginx, syncs those counters with the roots once per interval.
//!
//! # Brief overview
//!
//! * `conf`: the configuration data (http-level settings, per-location rules), its
//!   defaults and merging; a leaf that imports no handler.
//! * `directives`: the command table (`yarl_roots`, `yarl_check`, `yarl_account`, ...) and
//!   the setters that fill `conf`.
//! * `handler`: the PREACCESS handler, `$yarl_status` and `$yarl_quota`.
//! * `zone`: the `yarl_zone` shared memory that holds this nginx's one limiter.
//! * `worker`: each worker's handle on it, the tick that elects one sync agent per nginx,
//!   and the agent's thread.
//! * `stats` / `report`: the `yarl_stats` JSON page.
//! * `metrics` / `prom`: the `yarl_metrics` Prometheus page.
//! * `parse`: directive values, without nginx (unit-tested in tests/).
//!
//! Layout follows ngx-rust's examples: a unit `Module` implementing `HttpModule`, the command
//! table (in `directives`) and module context as statics, and the exported
//! `ngx_http_yarl_module` plus the `ngx_modules` table that `load_module` looks up.
//!
//! Every `extern "C"` entry point catches panics: unwinding into nginx would abort the worker.

mod conf;
mod directives;
mod handler;
mod metrics;
mod parse;
mod prom;
mod report;
mod stats;
mod worker;
mod zone;

use conf::{LocConf, MainConf};
use core::ptr::{addr_of, addr_of_mut};
use ngx::core::Status;
use ngx::ffi::{
    ngx_array_push, ngx_conf_t, ngx_cycle_t, ngx_http_add_variable, ngx_http_handler_pt,
    ngx_http_module_t, ngx_http_phases_NGX_HTTP_LOG_PHASE,
    ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, ngx_int_t, ngx_module_t, ngx_process, ngx_str_t,
    ngx_uint_t, NGX_HTTP_MODULE, NGX_HTTP_VAR_NOCACHEABLE, NGX_LOG_ALERT, NGX_LOG_EMERG,
    NGX_LOG_NOTICE, NGX_PROCESS_SINGLE, NGX_PROCESS_WORKER,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_log_error, ngx_string};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The module's configuration hooks (ngx-rust's `HttpModule` supplies create/merge).
pub(crate) struct Module;

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        // SAFETY: nginx writes the module's indices once while loading it, before any of our
        // code reads them; we never write it.
        unsafe { &*addr_of!(ngx_http_yarl_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // Variables must exist before any directive (ours or log_format) names them.
        let vars: [(ngx_str_t, usize); 2] = [
            (ngx_string!("yarl_status"), handler::VAR_STATUS),
            (ngx_string!("yarl_quota"), handler::VAR_QUOTA),
        ];
        for (mut name, which) in vars {
            // SAFETY: `cf` is nginx's; ngx_http_add_variable copies the name into its pool.
            let v = unsafe {
                ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t)
            };
            if v.is_null() {
                return Status::NGX_ERROR.0;
            }
            // SAFETY: `v` was just returned by nginx and is not shared yet.
            unsafe {
                (*v).get_handler = Some(handler::variable_get);
                (*v).data = which;
            }
        }
        Status::NGX_OK.0
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes the http block's configuration context, which holds our
        // MainConf (create_main_conf ran).
        if let Some(mc) = unsafe { Module::main_conf_mut(&*cf) } {
            if let Err(e) = mc.root_map.check() {
                ngx::ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"yarl_roots\" directive: {}", e);
                return Status::NGX_ERROR.0;
            }
            if mc.used {
                // SAFETY: `cf` is postconfiguration's.
                if let Err(e) = unsafe { zone::add(cf, mc) } {
                    ngx::ngx_conf_log_error!(NGX_LOG_EMERG, cf, "yarl: {}", e);
                    return Status::NGX_ERROR.0;
                }
            }
        }
        // SAFETY: nginx passes the http block's configuration context.
        let Some(cmcf) = (unsafe { NgxHttpCoreModule::main_conf_mut(&*cf) }) else {
            return Status::NGX_ERROR.0;
        };
        let phase = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize];
        // SAFETY: the phase's handler array is an ngx_array_t of ngx_http_handler_pt.
        let h = unsafe { ngx_array_push(&mut phase.handlers) }.cast::<ngx_http_handler_pt>();
        if h.is_null() {
            return Status::NGX_ERROR.0;
        }
        // SAFETY: `h` is a fresh element of that array.
        unsafe { *h = Some(handler::access_handler) };
        // yarl_charge adds costs known only once the response is done.
        let log = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_LOG_PHASE as usize];
        // SAFETY: as above, the log phase's handler array.
        let h = unsafe { ngx_array_push(&mut log.handlers) }.cast::<ngx_http_handler_pt>();
        if h.is_null() {
            return Status::NGX_ERROR.0;
        }
        // SAFETY: `h` is a fresh element of that array.
        unsafe { *h = Some(handler::log_handler) };
        Status::NGX_OK.0
    }
}

// SAFETY: create_main_conf/create_loc_conf (ngx-rust defaults) allocate exactly these types.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

// SAFETY: as above.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}

static NGX_HTTP_YARL_MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(Module::preconfiguration),
    postconfiguration: Some(Module::postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(Module::create_loc_conf),
    merge_loc_conf: Some(Module::merge_loc_conf),
};

// `load_module` dlsym()s `ngx_modules`, `ngx_module_names` and `ngx_module_order`.
ngx::ngx_modules!(ngx_http_yarl_module);

/// The module, as nginx sees it.
#[used]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_http_yarl_module: ngx_module_t = ngx_module_t {
    ctx: addr_of!(NGX_HTTP_YARL_MODULE_CTX) as _,
    commands: addr_of_mut!(directives::NGX_HTTP_YARL_COMMANDS) as _,
    type_: NGX_HTTP_MODULE as _,
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

/// Attaches this worker to the zone and arms the tick that elects the sync agent. Never
/// fails the worker: returning an error would make it exit and the master respawn it in a
/// loop; without the zone the module only fails open.
unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: `ngx_process` is written by the master before forking, read-only here.
    let process = unsafe { ngx_process } as u32;
    // Cache manager/loader helpers run init_process too; they serve no requests.
    if process != NGX_PROCESS_WORKER && process != NGX_PROCESS_SINGLE {
        return Status::NGX_OK.0;
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: nginx passes the live cycle; its http conf context holds our MainConf.
        let Some(mc) = Module::main_conf(unsafe { &*cycle }) else { return Ok(()) };
        if !mc.used {
            return Ok(());
        }
        worker::start(mc, cycle)
    }));
    // SAFETY: the cycle's log is valid while the cycle lives.
    let log = unsafe { (*cycle).log };
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            ngx_log_error!(NGX_LOG_ALERT, log, "yarl: {}; requests pass unlimited", e);
        }
        Err(_) => {
            ngx_log_error!(NGX_LOG_ALERT, log, "yarl: internal error starting the worker");
        }
    }
    Status::NGX_OK.0
}

/// Stops and joins the sync thread before nginx frees the cycle and calls `exit()`.
unsafe extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    let r = catch_unwind(worker::stop);
    // SAFETY: the cycle and its log are still valid during exit_process.
    let log = unsafe { (*cycle).log };
    match r {
        Ok(true) => {
            ngx_log_error!(NGX_LOG_NOTICE, log, "yarl: sync thread joined");
        }
        Ok(false) => {}
        Err(_) => {
            ngx_log_error!(NGX_LOG_ALERT, log, "yarl: internal error stopping the sync thread");
        }
    }
}
