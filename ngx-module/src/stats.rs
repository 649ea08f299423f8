//! The `yarl_stats` content handler: this worker's limiter and sync state as JSON
//! (see report.rs for the document). `?quota=NAME` adds one quota's numbers and live fill.

use crate::parse;
use crate::report::{self, Input, Live, SyncSettings};
use crate::worker::{self, COUNTERS};
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

fn quota_arg(r: &mut Request) -> Option<String> {
    let mut value = ngx_str_t::default();
    let raw: *mut ngx_http_request_t = (&mut *r).into();
    // SAFETY: ngx_http_arg only reads the request's args and points `value` into them.
    let rc = unsafe { ngx_http_arg(raw, c"quota".as_ptr().cast_mut().cast(), 5, &mut value) };
    if rc != NGX_OK as ngx_int_t {
        return None;
    }
    parse::percent_decode(value.as_bytes())
}

fn stats(r: &mut Request) -> Status {
    let method = r.as_ref().method as u32;
    if method != NGX_HTTP_GET && method != NGX_HTTP_HEAD {
        return Status(NGX_HTTP_NOT_ALLOWED as ngx_int_t);
    }
    let rc = r.discard_request_body();
    if rc != Status::NGX_OK {
        return rc;
    }
    let body = render(r);

    r.set_status(HTTPStatus::OK);
    r.set_content_length_n(body.len());
    let raw: &mut ngx_http_request_t = r.as_mut();
    raw.headers_out.content_type =
        ngx_str_t { len: 16, data: c"application/json".as_ptr().cast_mut().cast() };
    raw.headers_out.content_type_len = 16;
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

fn render(r: &mut Request) -> String {
    let quota_name = quota_arg(r);
    let status = worker::status();
    let limiter = worker::limiter();
    let live = limiter.map_or(Live::default(), |l| Live {
        now_ns: l.clock().now_nanos(),
        epoch: l.epoch(),
        quotas: l.quota_count(),
        rejections: l.rejections(),
    });
    let sync = worker::settings().map_or(SyncSettings::default(), |(i, t)| SyncSettings {
        interval_ms: i.as_millis() as u64,
        timeout_ms: t.as_millis() as u64,
    });
    let info = match (&quota_name, limiter) {
        (Some(n), Some(l)) => l.quota(n),
        _ => None,
    };
    report::render(&Input {
        pid: std::process::id(),
        status: status.as_ref(),
        live,
        sync,
        requests: COUNTERS.snapshot(),
        quota: quota_name.as_deref().map(|n| (n, info.as_ref())),
    })
}
