//! The layer through `tower::ServiceExt::oneshot`, on a limiter whose quotas are set by hand
//! and whose clock only moves when told to.

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::header::HeaderValue;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use yarl_core::{Clock, Limiter, Limits, ManualClock, QuotaUpdate};
use yarl_tower::{Cost, Quotas, Yarl};

/// (name, limit/s, low_burst, high_burst, parent)
type Q<'a> = (&'a str, f64, f64, f64, Option<&'a str>);

fn limiter(quotas: &[Q]) -> (Yarl, ManualClock) {
    let clock = ManualClock::at(1_000_000_000);
    let l = Limiter::builder().clock(Arc::new(clock.clone())).capacity(1000).build();
    let updates: Vec<QuotaUpdate> = quotas
        .iter()
        .enumerate()
        .map(|(i, &(name, limit, low, high, parent))| QuotaUpdate {
            reset_epoch: 0,
            id: i as u64 + 1,
            name: name.into(),
            epoch: i as u64 + 1,
            deleted: false,
            limits: Limits::from_units(limit, low, high).unwrap(),
            parent: parent.map(Into::into),
        })
        .collect();
    let report = l.apply_quotas(&updates);
    assert_eq!(report.inserted, quotas.len());
    (Yarl::unsynced(Arc::new(l)), clock)
}

fn fill(yarl: &Yarl, name: &str) -> f64 {
    yarl.limiter().quota(name).unwrap().fill
}

async fn hello(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("hello")))
}

fn get_req(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

async fn body_of<B: http_body::Body>(r: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    r.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn account_passes_up_to_the_burst_then_rejects_with_retry_after() {
    let (yarl, clock) = limiter(&[("api", 2.0, 4.0, 4.0, None)]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.account("api", 1);
        })
        .layer(service_fn(hello));
    for i in 0..5 {
        let r = svc.clone().oneshot(get_req("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i} at {}", clock.now_nanos());
        assert!(r.headers().get("retry-after").is_none());
        assert_eq!(body_of(r).await, "hello");
    }
    assert_eq!(fill(&yarl, "api"), 5.0);
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // (5 - 4) / 2 per second, rounded up.
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
    assert!(r.headers().get("ratelimit").is_none(), "fields only with headers(true)");
    assert_eq!(body_of(r).await, "Too Many Requests\n");
    assert_eq!(fill(&yarl, "api"), 5.0, "a rejection adds nothing");
}

#[tokio::test]
async fn check_counts_nothing_and_unknown_or_empty_names_pass() {
    let (yarl, _clock) = limiter(&[("s3_photos_read", 1.0, 0.0, 0.0, None)]);
    let svc = yarl
        .layer(|p: &Parts, q: &mut Quotas| {
            let bucket = p.uri.path().trim_start_matches('/');
            q.check(format!("s3_{bucket}_read")).check("");
        })
        .layer(service_fn(hello));
    for _ in 0..20 {
        let r = svc.clone().oneshot(get_req("/photos")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let r = svc.clone().oneshot(get_req("/videos")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "no quota s3_videos_read: unlimited");
    }
    assert_eq!(fill(&yarl, "s3_photos_read"), 0.0, "checks never count");
}

#[tokio::test]
async fn several_quotas_pass_or_fail_together() {
    let (yarl, _clock) = limiter(&[
        ("s3_b", 1000.0, 1000.0, 1000.0, None),
        ("s3_b_put", 1000.0, 1000.0, 1000.0, Some("s3_b")),
        ("s3_b_bytes_in", 1.0, 10.0, 10.0, None),
    ]);
    let svc = yarl
        .layer(|p: &Parts, q: &mut Quotas| {
            let len = p
                .headers
                .get("content-length")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            q.account("s3_b_put", 1).account("s3_b_bytes_in", len);
        })
        .layer(service_fn(hello));
    let put = |n: usize| {
        Request::put("/b/k").header("content-length", n).body(Body::from(vec![b'x'; n])).unwrap()
    };
    assert_eq!(svc.clone().oneshot(put(8)).await.unwrap().status(), StatusCode::OK);
    assert_eq!(svc.clone().oneshot(put(8)).await.unwrap().status(), StatusCode::OK);
    assert_eq!((fill(&yarl, "s3_b_put"), fill(&yarl, "s3_b")), (2.0, 2.0));
    assert_eq!(fill(&yarl, "s3_b_bytes_in"), 16.0);
    // The byte quota is over its burst: the whole request is refused, the request count
    // and its parent included.
    let r = svc.clone().oneshot(put(8)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!((fill(&yarl, "s3_b_put"), fill(&yarl, "s3_b")), (2.0, 2.0));
    assert_eq!(fill(&yarl, "s3_b_bytes_in"), 16.0);
    // An account of weight 0 is a check: the empty PUT passes only if the bytes quota is
    // not over its burst (it is).
    let r = svc.clone().oneshot(put(0)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn ratelimit_fields_describe_the_chain_that_decided() {
    let (yarl, clock) = limiter(&[
        ("s3_photos", 20.0, 10.0, 20.0, None),
        ("s3_photos_read", 5.0, 5.0, 5.0, Some("s3_photos")),
    ]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.check("s3_unknown").account("s3_photos_read", 3);
        })
        .headers(true)
        .layer(service_fn(hello));
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The same figures as the module's (core/src/ratelimit.rs), taken once the request
    // was counted: fill 3 of low_burst 5 and 10 leaves 3 and 8 that pass for sure.
    assert_eq!(
        r.headers()["ratelimit-policy"],
        "\"s3_photos_read\";q=6;w=2, \"s3_photos\";q=11;w=1"
    );
    assert_eq!(r.headers()["ratelimit"], "\"s3_photos_read\";r=3;t=0, \"s3_photos\";r=8;t=0");
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "fill 3 <= 5 at {}", clock.now_nanos());
    assert_eq!(r.headers()["ratelimit"], "\"s3_photos_read\";r=0;t=1, \"s3_photos\";r=5;t=0");
    // s3_photos_read: 6 > 5, rejected at the first level.
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "at {}", clock.now_nanos());
    assert_eq!(r.headers()["retry-after"], "1", "(6 - 5) / 5 per second, rounded up");
    assert_eq!(r.headers()["ratelimit-policy"], "\"s3_photos_read\";q=6;w=2");
    assert_eq!(r.headers()["ratelimit"], "\"s3_photos_read\";r=0;t=1");
}

#[tokio::test]
async fn status_retry_after_body_and_dry_run_are_configurable() {
    let (yarl, _clock) = limiter(&[("q", 1.0, 0.0, 0.0, None)]);
    let rule = |_: &Parts, q: &mut Quotas| {
        q.account("q", 1);
    };
    let slow_down = yarl
        .layer(rule)
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .retry_after(false)
        .rejection_body(HeaderValue::from_static("application/json"), r#"{"error":"SlowDown"}"#)
        .layer(service_fn(hello));
    assert_eq!(slow_down.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    let r = slow_down.oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get("retry-after").is_none());
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(body_of(r).await, r#"{"error":"SlowDown"}"#);

    let dry = yarl.layer(rule).dry_run(true).headers(true).layer(service_fn(hello));
    let r = dry.oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "dry run: decided, not enforced");
    assert_eq!(r.headers()["ratelimit"], "\"q\";r=0;t=1", "the fields still tell the truth");
    assert_eq!(fill(&yarl, "q"), 1.0, "a rejected account adds nothing, dry run or not");
}

#[test]
#[should_panic(expected = "not in 400-599")]
fn a_rejection_status_must_be_an_error() {
    let (yarl, _clock) = limiter(&[]);
    let _ = yarl.layer(|_: &Parts, _: &mut Quotas| {}).status(StatusCode::OK);
}

#[test]
fn a_status_from_configuration_gets_an_error() {
    let (yarl, _clock) = limiter(&[]);
    for bad in [200, 302, 399, 600] {
        let status = StatusCode::from_u16(bad).unwrap();
        let err = yarl.layer(|_: &Parts, _: &mut Quotas| {}).try_status(status).unwrap_err();
        assert!(matches!(err, yarl_tower::Error::BadStatus(s) if s == bad), "{err}");
        assert_eq!(err.to_string(), format!("rejection status {bad} is not in 400-599"));
    }
    for good in [400, 429, 503, 599] {
        let status = StatusCode::from_u16(good).unwrap();
        assert!(yarl.layer(|_: &Parts, _: &mut Quotas| {}).try_status(status).is_ok());
    }
}

#[tokio::test]
async fn a_reported_cost_is_charged_after_the_response_and_limits_the_next_requests() {
    let (yarl, _clock) = limiter(&[
        ("s3_b_read", 1.0, 10.0, 10.0, None),
        ("s3_b_list", 1000.0, 1000.0, 1000.0, Some("s3_b_read")),
        ("s3_b_get", 1000.0, 1000.0, 1000.0, Some("s3_b_read")),
    ]);
    let app = Router::new()
        .route(
            "/list",
            get(|| async { (Extension(Cost(25)), "25 objects") }).layer(yarl.layer(
                |_: &Parts, q: &mut Quotas| {
                    q.account("s3_b_list", 1).charge_reported("s3_b_list");
                },
            )),
        )
        .route(
            "/get",
            get(|| async { "one object" }).layer(yarl.layer(|_: &Parts, q: &mut Quotas| {
                q.account("s3_b_get", 1).charge_reported("s3_b_get");
            })),
        );
    // A GET reports no cost: 1 unit.
    let r = app.clone().oneshot(get_req("/get")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(fill(&yarl, "s3_b_read"), 1.0);
    // The listing passes (fill 1 <= 10), then its 25 objects are charged to its chain.
    let r = app.clone().oneshot(get_req("/list")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(body_of(r).await, "25 objects");
    assert_eq!(fill(&yarl, "s3_b_list"), 26.0);
    assert_eq!(fill(&yarl, "s3_b_read"), 27.0, "the parent drained by the listing");
    assert_eq!(fill(&yarl, "s3_b_get"), 1.0);
    // The bucket's read quota is over its burst: GETs are refused now.
    let r = app.clone().oneshot(get_req("/get")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "17", "(27 - 10) / 1 per second");
}

/// A body of `n` chunks of 1,000 bytes.
struct Chunks(usize);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if self.0 == 0 {
            return std::task::Poll::Ready(None);
        }
        self.0 -= 1;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![b'a'; 1000])))))
    }
}

#[tokio::test]
async fn body_bytes_are_charged_when_the_body_ends_or_is_dropped() {
    let (yarl, _clock) = limiter(&[("bytes_out", 1.0, 1e9, 1e9, None)]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.charge_body("bytes_out").charge_body("unknown_quota");
        })
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Chunks(3)))
        }));
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(fill(&yarl, "bytes_out"), 0.0, "nothing before the body is sent");
    assert_eq!(body_of(r).await.len(), 3000);
    assert_eq!(fill(&yarl, "bytes_out"), 3000.0);
    // A client that reads one chunk and goes away: charged what was sent.
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    let mut body = r.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.data_ref().unwrap().len(), 1000);
    assert_eq!(fill(&yarl, "bytes_out"), 3000.0);
    drop(body);
    assert_eq!(fill(&yarl, "bytes_out"), 4000.0);
}

#[tokio::test]
async fn an_inner_error_passes_through_and_charges_nothing() {
    let (yarl, _clock) = limiter(&[("q", 1.0, 100.0, 100.0, None)]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.account("q", 1).charge_body("q").charge_reported("q");
        })
        .layer(service_fn(|_: Request<Body>| async { Err::<Response<Body>, _>("backend down") }));
    assert_eq!(svc.oneshot(get_req("/")).await.unwrap_err(), "backend down");
    assert_eq!(fill(&yarl, "q"), 1.0, "the account counted, no charge");
}

#[tokio::test]
async fn huge_weights_are_clamped_not_refused() {
    let (yarl, _clock) = limiter(&[("q", 1e12, 1e11, 1e11, None)]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.account("q", u64::MAX);
        })
        .layer(service_fn(hello));
    assert_eq!(svc.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(fill(&yarl, "q"), 1e12);
    assert_eq!(svc.oneshot(get_req("/")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn works_as_a_router_layer_with_the_matched_path() {
    let (yarl, _clock) = limiter(&[("items_get", 1.0, 1.0, 1.0, None)]);
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item" }))
        .route("/other", get(|| async { "other" }))
        .route_layer(yarl.layer(|p: &Parts, q: &mut Quotas| {
            // The handler from the route: axum puts the matched route in the extensions.
            match p.extensions.get::<axum::extract::MatchedPath>().map(|m| m.as_str()) {
                Some("/items/{id}") => q.account("items_get", 1),
                _ => q,
            };
        }));
    for id in 1..=2 {
        let r = app.clone().oneshot(get_req(&format!("/items/{id}"))).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = app.clone().oneshot(get_req("/items/3")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = app.clone().oneshot(get_req("/other")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(app.oneshot(get_req("/nope")).await.unwrap().status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn time_drains_what_a_sync_round_folded() {
    // Without a root the limiter limits on its own counts; they drain once a round folded
    // them (the task of a started Yarl does that every interval, see tests/sync.rs).
    let (yarl, clock) = limiter(&[("q", 1.0, 1.0, 1.0, None)]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.account("q", 1);
        })
        .layer(service_fn(hello));
    for _ in 0..2 {
        assert_eq!(svc.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut engine = yarl_core::SyncEngine::new(
        yarl.limiter().clone(),
        vec![],
        yarl_core::SyncConfig::default(),
    )
    .unwrap();
    assert!(engine.begin_round(clock.now_nanos()).is_empty());
    engine.end_round(clock.now_nanos());
    clock.advance(Duration::from_secs(1));
    assert!((fill(&yarl, "q") - 1.0).abs() < 1e-9, "2 units, 1 s at 1/s");
    assert_eq!(svc.oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
}

/// A template limits each client named from the request on its own bucket, and the fields
/// name the template with the key's id as `pk`.
#[tokio::test]
async fn a_template_gives_each_client_a_bucket_of_its_own() {
    let (yarl, _clock) = limiter(&[
        ("api_all", 100.0, 100.0, 100.0, None),
        ("api_key_*", 1.0, 1.0, 1.0, Some("api_all")),
    ]);
    let svc = yarl
        .layer(|req: &Parts, q: &mut Quotas| {
            let key = req.headers.get("x-api-key").and_then(|v| v.to_str().ok()).unwrap_or("");
            q.account(format!("api_key_{key}"), 1);
        })
        .headers(true)
        .layer(service_fn(hello));
    let call = |key: &'static str| {
        let svc = svc.clone();
        async move {
            let req = Request::get("/").header("x-api-key", key).body(Body::empty()).unwrap();
            svc.oneshot(req).await.unwrap()
        }
    };
    for key in ["alice", "bob"] {
        assert_eq!(call(key).await.status(), StatusCode::OK, "{key}: fill 0");
        assert_eq!(call(key).await.status(), StatusCode::OK, "{key}: fill 1 <= 1");
        let r = call(key).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{key}: fill 2");
        let policy = r.headers()["ratelimit-policy"].to_str().unwrap();
        assert!(policy.starts_with("\"api_key_*\";q=2;w=2;pk=:"), "{policy}");
        assert!(!policy.contains(key), "the key is not sent back: {policy}");
    }
    assert_eq!(fill(&yarl, "api_key_alice"), 2.0);
    assert_eq!(fill(&yarl, "api_all"), 4.0, "the parent sums both clients");
    let usage = yarl.limiter().zone_status().usage;
    assert_eq!((usage.templates, usage.keys), (1, 2));
}

#[tokio::test]
async fn a_quota_in_shadow_mode_is_decided_and_not_enforced() {
    let (yarl, _clock) = limiter(&[("q", 1.0, 0.0, 0.0, None)]);
    let shadow = QuotaUpdate {
        reset_epoch: 0,
        id: 1,
        name: "q".into(),
        epoch: 2,
        deleted: false,
        limits: Limits::from_units(1.0, 0.0, 0.0).unwrap().with_dry_run(true),
        parent: None,
    };
    yarl.limiter().apply_quotas(&[shadow]);
    let rule = |_: &Parts, q: &mut Quotas| {
        q.account("q", 1);
    };
    let svc = yarl.layer(rule).layer(service_fn(hello));
    for _ in 0..3 {
        assert_eq!(svc.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    }
    let q = yarl.limiter().quota("q").unwrap();
    assert_eq!((q.fill, q.rejections), (1.0, 2), "counted as enforcing it would, not enforced");
}

#[tokio::test]
async fn a_daily_quota_counts_its_window_and_says_so() {
    let (yarl, clock) = limiter(&[("daily", 1.0, 0.0, 0.0, None)]);
    let spec = yarl_core::QuotaSpec {
        limit: Some(3.0),
        per: Some("1d".into()),
        low_burst: None,
        high_burst: None,
        parent: None,
        dry_run: false,
        max_in_flight: None,
    };
    let daily = QuotaUpdate {
        reset_epoch: 0,
        id: 1,
        name: "daily".into(),
        epoch: 2,
        deleted: false,
        limits: spec.validate("daily").unwrap(),
        parent: None,
    };
    yarl.limiter().apply_quotas(&[daily]);
    let svc = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.account("daily", 1);
        })
        .headers(true)
        .layer(service_fn(hello));
    for i in 0..3 {
        let r = svc.clone().oneshot(get_req("/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        assert_eq!(r.headers()["ratelimit-policy"], "\"daily\";q=3;w=86400");
    }
    let r = svc.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // One unit drains in 86,400 / 3 s: eight hours, said in seconds.
    assert_eq!(r.headers()["retry-after"], "28800");
    assert_eq!(r.headers()["ratelimit"], "\"daily\";r=0;t=28800");
    clock.advance(Duration::from_secs(8 * 3600));
    assert_eq!(svc.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        svc.clone().oneshot(get_req("/")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A quota with only `max_in_flight`.
fn in_flight_only(id: u64, name: &str, cap: u32) -> QuotaUpdate {
    QuotaUpdate {
        reset_epoch: 0,
        id,
        name: name.into(),
        epoch: id,
        deleted: false,
        limits: Limits::in_flight_only(cap).unwrap(),
        parent: None,
    }
}

/// A body that yields nothing until it is dropped (a slow download).
struct Pending;

impl http_body::Body for Pending {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test]
async fn the_caps_join_the_ratelimit_fields_as_in_the_module() {
    let (yarl, clock) = limiter(&[("rated", 10.0, 5.0, 5.0, None)]);
    let l = yarl.limiter();
    l.apply_quotas(&[in_flight_only(9, "uploads", 2)]);
    l.permits(9).unwrap().publish(2, clock.now_nanos() + 60_000_000_000);
    let slow = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads").account("rated", 1);
        })
        .headers(true)
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Pending))
        }));
    let a = slow.clone().oneshot(get_req("/")).await.unwrap();
    let policy = a.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(policy.ends_with(r#", "uploads";q=2;qu="concurrent-requests""#), "{policy}");
    let state = a.headers()["ratelimit"].to_str().unwrap();
    assert!(state.ends_with(r#", "uploads";r=1"#), "{state}");
    let _b = slow.clone().oneshot(get_req("/")).await.unwrap();
    // Refused a slot: the cap that refused, nothing left and a second to wait.
    let r = slow.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["ratelimit"], r#""uploads";r=0;t=1"#);
}

#[tokio::test]
async fn concurrency_slots_are_held_until_the_body_ends_or_is_dropped() {
    let (yarl, clock) = limiter(&[("rated", 1.0, 0.0, 0.0, None)]);
    let l = yarl.limiter();
    l.apply_quotas(&[in_flight_only(9, "uploads", 2)]);
    // The share a root would grant.
    l.permits(9).unwrap().publish(2, clock.now_nanos() + 60_000_000_000);
    let in_flight = || yarl.limiter().permits(9).unwrap().in_flight();
    let slow = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads");
        })
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Pending))
        }));
    let a = slow.clone().oneshot(get_req("/")).await.unwrap();
    let b = slow.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!((a.status(), b.status(), in_flight()), (StatusCode::OK, StatusCode::OK, 2));
    let r = slow.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "a third while two run");
    assert_eq!(r.headers()["retry-after"], "1");
    // A client that goes away (the server drops the body): its slot is back.
    drop(a);
    assert_eq!(in_flight(), 1);
    // A body read to its end gives the slot back at the end, before it is dropped.
    let fast = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads");
        })
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Chunks(2)))
        }));
    let r = fast.clone().oneshot(get_req("/")).await.unwrap();
    assert_eq!(in_flight(), 2);
    let mut body = r.into_body();
    while body.frame().await.is_some() {}
    assert_eq!(in_flight(), 1, "given back at the end of the body");
    drop(body);
    assert_eq!(in_flight(), 1);
    // A request the rates reject gives its slot back; so does an inner error.
    let rated = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads").account("rated", 1);
        })
        .layer(service_fn(hello));
    assert_eq!(rated.clone().oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(rated.oneshot(get_req("/")).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(in_flight(), 1);
    let failing = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads");
        })
        .layer(service_fn(|_: Request<Body>| async { Err::<Response<Body>, _>("backend down") }));
    assert!(failing.oneshot(get_req("/")).await.is_err());
    assert_eq!(in_flight(), 1);
    drop(b);
    assert_eq!(in_flight(), 0);
    // Dry run: a refused request goes on without a slot.
    l.permits(9).unwrap().publish(0, clock.now_nanos() + 60_000_000_000);
    let dry = yarl
        .layer(|_: &Parts, q: &mut Quotas| {
            q.concurrency("uploads");
        })
        .dry_run(true)
        .layer(service_fn(hello));
    assert_eq!(dry.oneshot(get_req("/")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(in_flight(), 0);
}

/// A template with `max_in_flight` caps each key (here the path) on its own: a key new to
/// the host runs on the template's own slots until a root answers for it, then on its own.
#[tokio::test]
async fn each_key_under_a_capped_template_has_its_own_slots() {
    let (yarl, clock) = limiter(&[]);
    let l = yarl.limiter();
    l.apply_quotas(&[in_flight_only(10, "gen_*", 1)]);
    let until = clock.now_nanos() + 60_000_000_000;
    l.permits(10).unwrap().publish(1, until);
    let svc = yarl
        .layer(|p: &Parts, q: &mut Quotas| {
            q.concurrency(format!("gen_{}", p.uri.path().trim_start_matches('/')));
        })
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Pending))
        }));
    let ids =
        || -> Vec<u64> { l.permit_entries().iter().map(|e| e.0).filter(|&i| i != 10).collect() };
    let a = svc.clone().oneshot(get_req("/alice")).await.unwrap();
    assert_eq!(a.status(), StatusCode::OK, "a new key runs at once, on the template's slot");
    let alice = ids()[0];
    let again = svc.clone().oneshot(get_req("/alice")).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS, "alice is at her cap of 1");
    let refused = svc.clone().oneshot(get_req("/bob")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "bob waits for his grant");
    let bob = ids().into_iter().find(|&i| i != alice).unwrap();
    // A root grants bob a slot of his own.
    l.permits(bob).unwrap().publish(1, until);
    let b = svc.clone().oneshot(get_req("/bob")).await.unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    assert_eq!(l.permits(bob).unwrap().in_flight(), 1);
    drop((a, b));
    assert_eq!(l.permits(alice).unwrap().in_flight() + l.permits(bob).unwrap().in_flight(), 0);
    assert_eq!(l.permits(10).unwrap().in_flight(), 0, "the template's slot is back");
}
