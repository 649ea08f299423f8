//! The `yarl_metrics` content handler: the host's state in the Prometheus text format (see
//! prom.rs for the page).

use crate::prom::{self, Input, TOP_QUOTAS, TOP_WINDOW_SECS};
use crate::stats::respond;
use crate::worker;
use ngx::ffi::{ngx_http_request_t, ngx_int_t, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_LOG_ERR};
use ngx::http::Request;
use ngx::ngx_log_error;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The content handler installed by `yarl_metrics`.
pub(crate) unsafe extern "C" fn metrics_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls content handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    match catch_unwind(AssertUnwindSafe(|| {
        respond(r, c"text/plain; version=0.0.4; charset=utf-8", |_| Ok(render()))
    })) {
        Ok(s) => s.0,
        Err(_) => {
            ngx_log_error!(NGX_LOG_ERR, r.log(), "yarl: internal error in yarl_metrics");
            NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t
        }
    }
}

fn render() -> String {
    let w = worker::worker();
    let zone = w.map(|w| w.limiter.zone_status());
    let top = w.map_or_else(Vec::new, |w| w.limiter.top_rejections(TOP_QUOTAS, TOP_WINDOW_SECS));
    let roots = worker::root_statuses();
    let templates = w.map_or_else(Vec::new, |w| w.limiter.template_keys());
    let concurrency = w.map(|w| w.limiter.concurrency_status());
    prom::render(&Input {
        concurrency: concurrency.as_ref(),
        templates: &templates,
        requests: worker::counters(),
        zone: zone.as_ref(),
        top: &top,
        roots: &roots,
        agent_alive: worker::agent_alive(),
        now_ns: w.map_or(0, |w| w.limiter.clock().now_nanos()),
    })
}
