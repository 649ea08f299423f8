//! The `yarl_stats` content handler: the host's limiter and sync state as JSON
//! (see report.rs for the document). `?quota=NAME` adds one quota's numbers and live fill.

use crate::parse;
use crate::report::{self, Input, SyncSettings};
use crate::worker;
use ngx::core::{Buffer, Status};
use ngx::ffi::{
    ngx_chain_t, ngx_http_arg, ngx_http_request_t, ngx_int_t, ngx_str_t, NGX_HTTP_GET,
    NGX_HTTP_HEAD, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_ALLOWED, NGX_LOG_ERR, NGX_OK,
};
use ngx::http::{HTTPStatus, Request};
use ngx::ngx_log_error;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The content handler installed by `yarl_stats`.
pub(crate) unsafe extern "C" fn stats_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls content handlers with a valid request.
    let r = unsafe { Request::from_ngx_http_request(r) };
    match catch_unwind(AssertUnwindSafe(|| stats(r))) {
        Ok(s) => s.0,
        Err(_) => {
            ngx_log_error!(NGX_LOG_ERR, r.log(), "yarl: internal error in yarl_stats");
            NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t
        }
    }
}

/// The `quota` argument, decoded: `Ok(None)` without one, `Err` when an escape in it is
/// malformed (`%ZZ`, a `%` at the end).
fn quota_arg(r: &mut Request) -> Result<Option<Vec<u8>>, String> {
    let mut value = ngx_str_t::default();
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    // SAFETY: ngx_http_arg only reads the request's args and points `value` into them.
    let rc = unsafe { ngx_http_arg(raw, c"quota".as_ptr().cast_mut().cast(), 5, &mut value) };
    if rc != NGX_OK as ngx_int_t {
        return Ok(None);
    }
    match parse::percent_decode(value.as_bytes()) {
        Some(name) => Ok(Some(name)),
        None => Err(r#"{"error":"quota: a %XX escape is malformed"}"#.to_owned() + "\n"),
    }
}

fn stats(r: &mut Request) -> Status {
    respond(r, c"application/json", render)
}

/// Answers a GET or HEAD with `body(r)` as `content_type`, or a 400 with the JSON error
/// it returns; other methods get 405.
pub(crate) fn respond(
    r: &mut Request,
    content_type: &'static core::ffi::CStr,
    body: impl FnOnce(&mut Request) -> Result<String, String>,
) -> Status {
    let method = r.as_ref().method as u32;
    if method != NGX_HTTP_GET && method != NGX_HTTP_HEAD {
        return Status(NGX_HTTP_NOT_ALLOWED as ngx_int_t);
    }
    let rc = r.discard_request_body();
    if rc != Status::NGX_OK {
        return rc;
    }
    let (status, body, content_type) = match body(r) {
        Ok(body) => (HTTPStatus::OK, body, content_type),
        Err(error) => (HTTPStatus::BAD_REQUEST, error, c"application/json"),
    };

    r.set_status(status);
    r.set_content_length_n(body.len());
    let raw: &mut ngx_http_request_t = r.as_mut();
    let len = content_type.to_bytes().len();
    raw.headers_out.content_type = ngx_str_t { len, data: content_type.as_ptr().cast_mut().cast() };
    raw.headers_out.content_type_len = len;
    raw.headers_out.content_type_lowcase = core::ptr::null_mut();
    let rc = r.send_header();
    if rc == Status::NGX_ERROR || rc.0 > NGX_OK as ngx_int_t || r.header_only() {
        return rc;
    }
    let Some(mut buf) = r.pool().create_buffer_from_str(&body) else {
        return Status::NGX_ERROR;
    };
    buf.set_last_buf(r.is_main());
    buf.set_last_in_chain(true);
    let mut out = ngx_chain_t { buf: buf.as_ngx_buf_mut(), next: core::ptr::null_mut() };
    r.output_filter(&mut out)
}

fn render(r: &mut Request) -> Result<String, String> {
    let quota_name = quota_arg(r)?;
    let w = worker::worker();
    let status = w.map(|w| w.limiter.zone_status());
    let now_ns = w.map_or(0, |w| w.limiter.clock().now_nanos());
    let agent_alive = worker::agent_alive();
    let roots = worker::root_statuses();
    let sync = w.map_or(SyncSettings::default(), |w| SyncSettings {
        interval_ms: w.interval.as_millis() as u64,
        timeout_ms: w.timeout.as_millis() as u64,
        early: w.early,
        answers: if w.interest { "touched" } else { "all" },
    });
    let info = match (&quota_name, w) {
        (Some(n), Some(w)) => w.limiter.quota(n.as_slice()),
        _ => None,
    };
    let quota_name = quota_name.as_deref().map(yarl_core::display_name);
    let templates = w.map_or_else(Vec::new, |w| w.limiter.template_keys());
    let concurrency = w.map(|w| w.limiter.concurrency_status());
    Ok(report::render(&Input {
        concurrency: concurrency.as_ref(),
        templates: &templates,
        pid: std::process::id(),
        zone: status.as_ref(),
        agent_alive,
        now_ns,
        roots: &roots,
        sync,
        requests: worker::counters(),
        quota: quota_name.as_deref().map(|n| (n, info.as_ref())),
    }))
}
