//! The application through `oneshot`: the S3 routes, hostile input, and each handler's
//! quota with the bucket quota as its parent.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::Arc;
use tower::ServiceExt;
use yarl_core::{Limiter, Limits as QLimits, ManualClock, QuotaUpdate};
use yarl_s3_app::store::{Limits, Store};
use yarl_s3_app::AppState;
use yarl_tower::Yarl;

/// (name, limit/s, low_burst, high_burst, parent)
type Q<'a> = (&'a str, f64, f64, f64, Option<&'a str>);

struct App {
    yarl: Yarl,
    svc: axum::routing::RouterIntoService<Body>,
    state: AppState,
}

fn app(quotas: &[Q], limits: Limits) -> App {
    let clock = ManualClock::at(1_000_000_000);
    let l = Limiter::builder().clock(Arc::new(clock)).capacity(1000).build();
    let updates: Vec<QuotaUpdate> = quotas
        .iter()
        .enumerate()
        .map(|(i, &(name, limit, low, high, parent))| QuotaUpdate {
            reset_epoch: 0,
            id: i as u64 + 1,
            name: name.into(),
            epoch: i as u64 + 1,
            deleted: false,
            limits: QLimits::from_units(limit, low, high).unwrap(),
            parent: parent.map(Into::into),
        })
        .collect();
    l.apply_quotas(&updates);
    let yarl = Yarl::unsynced(Arc::new(l));
    let state = AppState { store: Arc::new(Store::new(limits)), yarl: yarl.clone() };
    let svc = yarl_s3_app::app(state.clone()).into_service();
    App { yarl, svc, state }
}

impl App {
    async fn send(&self, method: &str, path: &str, body: &[u8]) -> (StatusCode, String) {
        let mut req = Request::builder().method(method).uri(path);
        if method == "PUT" {
            req = req.header("content-length", body.len());
        }
        let req = req.body(Body::from(body.to_vec())).unwrap();
        let r = self.svc.clone().oneshot(req).await.unwrap();
        let status = r.status();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&b).into_owned())
    }

    fn fill(&self, name: &str) -> f64 {
        self.yarl.limiter().quota(name).unwrap().fill
    }
}

#[tokio::test]
async fn objects_and_buckets() {
    let a = app(&[], Limits::default());
    assert_eq!(a.send("GET", "/photos/cat.jpg", b"").await.0, StatusCode::NOT_FOUND);
    assert_eq!(a.send("PUT", "/photos", b"").await.0, StatusCode::OK);
    assert_eq!(a.send("PUT", "/photos", b"").await.0, StatusCode::CONFLICT);
    assert_eq!(a.send("PUT", "/photos/cat.jpg", b"meow").await.0, StatusCode::OK);
    assert_eq!(a.send("PUT", "/photos/dir/dog%20b.jpg", b"woof!").await.0, StatusCode::OK);
    assert_eq!(a.send("GET", "/photos/cat.jpg", b"").await, (StatusCode::OK, "meow".into()));
    let (s, body) = a.send("GET", "/photos/dir/dog%20b.jpg", b"").await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, "woof!"), "percent-decoded keys");
    let (s, body) = a.send("HEAD", "/photos/cat.jpg", b"").await;
    assert_eq!((s, body.as_str()), (StatusCode::OK, ""));
    let (s, body) = a.send("GET", "/photos", b"").await;
    assert_eq!(s, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["keys"][0]["key"], "cat.jpg");
    assert_eq!(v["keys"][1]["key"], "dir/dog b.jpg");
    assert_eq!(v["next"], serde_json::Value::Null);
    let (_, body) = a.send("GET", "/photos?prefix=dir/&max-keys=1", b"").await;
    assert!(body.contains("\"dir/dog b.jpg\""), "{body}");
    assert_eq!(a.send("DELETE", "/photos", b"").await.0, StatusCode::CONFLICT);
    assert_eq!(a.send("DELETE", "/photos/cat.jpg", b"").await.0, StatusCode::NO_CONTENT);
    assert_eq!(a.send("DELETE", "/photos/dir/dog%20b.jpg", b"").await.0, StatusCode::NO_CONTENT);
    assert_eq!(a.send("DELETE", "/photos", b"").await.0, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn virtual_host_requests_are_path_style_requests() {
    let a = app(&[], Limits::default());
    a.send("PUT", "/photos", b"").await;
    a.send("PUT", "/photos/cat.jpg", b"meow").await;
    let full = yarl_s3_app::service(a.state.clone(), "s3.example.net".into(), false);
    let vhost = |req: Request<Body>| full.clone().oneshot(req);
    let req = |path: &str, host: &str| {
        Request::get(path).header("host", host).body(Body::empty()).unwrap()
    };
    let r = vhost(req("/cat.jpg", "photos.s3.example.net")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = vhost(req("/cat.jpg", "PHOTOS.S3.Example.NET:8080")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "case-insensitive host, port ignored");
    let r = vhost(req("/?prefix=c", "photos.s3.example.net")).await.unwrap();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("cat.jpg"));
    let r = vhost(req("/photos/cat.jpg", "s3.example.net")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "path style on the bare domain");
    let r = vhost(req("/cat.jpg", "bad_name.s3.example.net")).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "not a bucket host: path style, no bucket cat.jpg"
    );
}

#[tokio::test]
async fn hostile_input_gets_a_4xx_that_says_why() {
    let limits =
        Limits { max_buckets: 2, max_objects: 2, max_object_bytes: 16, max_total_bytes: 1000 };
    let a = app(&[], limits);
    let expect = |(s, body): (StatusCode, String), status: StatusCode, code: &str| {
        assert_eq!(s, status, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], code, "{body}");
        assert!(!v["error"].as_str().unwrap().is_empty());
    };
    expect(a.send("PUT", "/Bad_Bucket", b"").await, StatusCode::BAD_REQUEST, "InvalidBucketName");
    expect(a.send("PUT", "/ab", b"").await, StatusCode::BAD_REQUEST, "InvalidBucketName");
    expect(a.send("GET", "/", b"").await, StatusCode::BAD_REQUEST, "InvalidBucketName");
    a.send("PUT", "/one", b"").await;
    a.send("PUT", "/two", b"").await;
    expect(a.send("PUT", "/three", b"").await, StatusCode::BAD_REQUEST, "TooManyBuckets");
    let long = format!("/one/{}", "k".repeat(1025));
    expect(a.send("PUT", &long, b"x").await, StatusCode::BAD_REQUEST, "InvalidKey");
    expect(a.send("PUT", "/one/a%0Ab", b"x").await, StatusCode::BAD_REQUEST, "InvalidKey");
    expect(
        a.send("PUT", "/one/big", &[0; 17]).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "EntityTooLarge",
    );
    a.send("PUT", "/one/a", b"1").await;
    a.send("PUT", "/one/b", b"2").await;
    expect(a.send("PUT", "/one/c", b"3").await, StatusCode::CONFLICT, "TooManyObjects");
    expect(a.send("GET", "/one?max-keys=0", b"").await, StatusCode::BAD_REQUEST, "InvalidArgument");
    expect(
        a.send("GET", "/one?max-keys=1001", b"").await,
        StatusCode::BAD_REQUEST,
        "InvalidArgument",
    );
    expect(a.send("GET", "/one?max-keys=x", b"").await, StatusCode::BAD_REQUEST, "InvalidArgument");
    let prefix = format!("/one?prefix={}", "p".repeat(1025));
    expect(a.send("GET", &prefix, b"").await, StatusCode::BAD_REQUEST, "InvalidArgument");
    expect(a.send("POST", "/one/a", b"").await, StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed");
    expect(a.send("GET", "/nope/a", b"").await, StatusCode::NOT_FOUND, "NoSuchBucket");
    expect(a.send("GET", "/one/zzz", b"").await, StatusCode::NOT_FOUND, "NoSuchKey");
    // A PUT without Content-Length (chunked): the byte quota could not be accounted.
    let r =
        a.svc.clone().oneshot(Request::put("/one/a").body(Body::from("x")).unwrap()).await.unwrap();
    assert_eq!(r.status(), StatusCode::LENGTH_REQUIRED);
    // A Content-Length over the limit is refused before the body is read.
    let r = a
        .svc
        .clone()
        .oneshot(
            Request::put("/one/a")
                .header("content-length", "1000000000")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn each_handler_accounts_its_quota_under_the_bucket_quota() {
    let a = app(
        &[
            ("s3_photos", 1000.0, 1000.0, 1000.0, None),
            ("s3_photos_read", 1.0, 20.0, 20.0, Some("s3_photos")),
            ("s3_photos_write", 1.0, 1e6, 1e6, Some("s3_photos")),
            ("s3_photos_get", 1000.0, 1000.0, 1000.0, Some("s3_photos_read")),
            ("s3_photos_list", 1000.0, 1000.0, 1000.0, Some("s3_photos_read")),
            ("s3_photos_put", 1000.0, 1000.0, 1000.0, Some("s3_photos_write")),
            ("s3_photos_bytes_in", 1.0, 1e6, 1e6, None),
            ("s3_photos_bytes_out", 1.0, 1e6, 1e6, None),
        ],
        Limits::default(),
    );
    a.send("PUT", "/photos", b"").await;
    for i in 0..30 {
        assert_eq!(
            a.send("PUT", &format!("/photos/{i:03}.jpg"), b"0123456789").await.0,
            StatusCode::OK
        );
    }
    assert_eq!(a.fill("s3_photos_put"), 30.0);
    assert_eq!(a.fill("s3_photos_bytes_in"), 300.0, "the declared lengths");
    assert_eq!(a.fill("s3_photos_write"), 30.0);
    assert_eq!(a.fill("s3_photos_read"), 0.0);
    // Five GETs cost 5 read units; their bytes are nginx's to charge (yarl_charge).
    for _ in 0..5 {
        assert_eq!(a.send("GET", "/photos/000.jpg", b"").await.0, StatusCode::OK);
    }
    assert_eq!(a.fill("s3_photos_get"), 5.0);
    assert_eq!(a.fill("s3_photos_bytes_out"), 0.0);
    assert_eq!(a.fill("s3_photos_read"), 5.0);
    // One listing of 30 objects costs 31: more than the five GETs together, six times over.
    let (s, _) = a.send("GET", "/photos", b"").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(a.fill("s3_photos_list"), 31.0);
    assert_eq!(a.fill("s3_photos_read"), 36.0);
    assert_eq!(a.fill("s3_photos"), 66.0);
    // The bucket's read quota is over its burst: every read handler refuses now, the
    // writes go on.
    let r = a
        .svc
        .clone()
        .oneshot(Request::get("/photos/001.jpg").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "16", "(36 - 20) / 1 per second");
    assert_eq!(
        r.headers()["ratelimit"],
        "\"s3_photos_get\";r=996;t=0, \"s3_photos_read\";r=0;t=16"
    );
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("SlowDown"));
    assert_eq!(a.send("GET", "/photos", b"").await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.send("PUT", "/photos/new.jpg", b"x").await.0, StatusCode::OK);
    assert_eq!(a.fill("s3_photos_read"), 36.0, "refused reads count nothing");
}
