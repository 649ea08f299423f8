//! Protocol v2 through the real router: negotiated by content type, answers in the
//! request's encoding, hostile bodies refused with a 4xx naming what is wrong.

mod common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::*;
use http_body_util::BodyExt;
use tower::ServiceExt;
use yarl_core::proto::v2;
use yarl_core::proto::{DeltaBatch, SyncRequest, SyncResponse, PROTOCOL_VERSION};
use yarl_root::app;

const V2: &str = "application/x-yarl-sync+v2";

async fn post(st: &yarl_root::AppState, ct: &str, body: Vec<u8>) -> (StatusCode, String, Vec<u8>) {
    let req = Request::builder()
        .method(Method::POST)
        .uri("/v1/sync")
        .header("content-type", ct)
        .body(Body::from(body))
        .unwrap();
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

fn request(seq: u64, root_instance: Option<u64>, since: u64) -> SyncRequest {
    SyncRequest {
        v: PROTOCOL_VERSION,
        limiter: "l1".into(),
        root_instance,
        since,
        epoch: 0,
        batches: vec![DeltaBatch {
            seq,
            deltas: vec![(1, 5000, 0), (2, 1000, 2000)],
            epoch: Some(0),
            drained: Vec::new(),
        }],
        hints: vec![],
        seen_epoch: Some(0),
        interest: false,
        watch: Vec::new(),
        key_templates: Vec::new(),
        hinted_seq: None,
        in_flight: Vec::new(),
        view_age_ns: None,
    }
}

#[tokio::test]
async fn v2_and_v1_answer_the_same() {
    let (store, _url, _dir) = sqlite_store().await;
    let st = state(store, short_poll()).await;
    for name in ["a", "b"] {
        let (s, _) = call(
            &st,
            Method::PUT,
            &format!("/v1/quotas/{name}"),
            Some(&quota(1.0, 100.0, 200.0, None)),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    let (s, ct, body) = post(&st, V2, v2::encode_request(&request(1, None, 0))).await;
    assert_eq!((s, ct.as_str()), (StatusCode::OK, V2));
    let a = v2::decode_response(&body, usize::MAX).unwrap();
    assert_eq!((a.acked_seq, a.quotas.len(), a.counters.len()), (1, 2, 2));
    assert_eq!(a.quotas[1].name, "b");
    assert!((4990..=5000).contains(&a.counters[0].1), "{a:?}");

    // The same state asked in JSON: the same counters, quotas and numbers.
    let (s, ct, body) =
        post(&st, "application/json", serde_json::to_vec(&request(2, None, 0)).unwrap()).await;
    assert_eq!((s, ct.as_str()), (StatusCode::OK, "application/json"));
    let mut j: SyncResponse = serde_json::from_slice(&body).unwrap();
    j.counters.sort_unstable_by_key(|c| c.0);
    assert_eq!(j.quotas, a.quotas);
    assert_eq!(j.acked_seq, 2);
    assert_eq!(j.counters.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2]);
    let json_len = serde_json::to_vec(&j).unwrap().len();
    let v2_len = v2::encode_response(&j).len();
    assert!(v2_len * 2 < json_len, "v2 {v2_len} bytes, JSON {json_len}");
}

#[tokio::test]
async fn hostile_v2_bodies() {
    let (store, _url, _dir) = sqlite_store().await;
    let st = state(store, short_poll()).await;
    let good = v2::encode_request(&request(1, None, 0));
    let error = |b: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(b).unwrap()["error"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    let (s, _, b) = post(&st, V2, good[..good.len() - 2].to_vec()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(error(&b), "bad v2 body at batch_epochs: truncated");

    let (s, _, b) = post(&st, V2, b"{\"v\":1,\"limiter\":\"l\"}".to_vec()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error(&b).contains("unsupported v2 wire version 123"), "{}", error(&b));

    // A varint that never ends (since).
    let mut over = good[..5].to_vec();
    over.extend([0x80; 12]);
    let (s, _, b) = post(&st, V2, over).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(error(&b), "bad v2 body at since: varint longer than its type");

    // A list declaring four billion deltas in a few bytes.
    let mut huge = good[..9].to_vec();
    huge.extend([0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0]);
    let (s, _, b) = post(&st, V2, huge).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(error(&b), "bad v2 body at batches[].deltas: list longer than the rest of the body");

    // More entries than a root takes: 413, before they are built.
    let many = SyncRequest {
        batches: vec![DeltaBatch {
            seq: 1,
            deltas: vec![(1, 1, 0); 2_000_001],
            epoch: None,
            drained: Vec::new(),
        }],
        ..request(1, None, 0)
    };
    let (s, _, b) = post(&st, V2, v2::encode_request(&many)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error(&b).contains("the maximum is 2000000"), "{}", error(&b));

    let (s, _, b) = post(&st, "application/x-protobuf", good).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(error(&b).contains("application/x-yarl-sync+v2"), "{}", error(&b));
}

/// Concurrency reports in, grants out, in both encodings, through the router; the
/// root's escrow in `/metrics`. Replica 1 of 2 owns half of the cap.
#[tokio::test]
async fn in_flight_reports_get_grants_of_this_roots_part() {
    use yarl_core::concurrency::Report;
    use yarl_core::proto::InFlightReport;
    let (store, _url, _dir) = sqlite_store().await;
    let mut settings = short_poll();
    settings.root.replica = (1, 2);
    let st = state(store, settings).await;
    let body = serde_json::json!({"max_in_flight": 21}).to_string();
    let (s, v) = call(&st, Method::PUT, "/v1/quotas/db", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let id = v["id"].as_u64().unwrap();
    let report = |limiter: &str, seq| SyncRequest {
        limiter: limiter.into(),
        batches: Vec::new(),
        in_flight: vec![InFlightReport {
            id,
            report: Report { seq, demand: 50_000, ..Report::default() },
        }],
        ..request(1, None, 0)
    };
    let (s, _, body) = post(&st, V2, v2::encode_request(&report("l1", 1))).await;
    assert_eq!(s, StatusCode::OK);
    let a = v2::decode_response(&body, usize::MAX).unwrap();
    assert_eq!(a.grants.len(), 1, "{a:?}");
    assert_eq!((a.grants[0].id, a.grants[0].grant.share), (id, 10), "replica 1 of 2 owns 10 of 21");
    assert_eq!(a.grants[0].grant.lease_ns, 3_000_000_000);
    // In JSON, another limiter: nothing is free (the first may be using all of it).
    let (s, _, body) =
        post(&st, "application/json", serde_json::to_vec(&report("l2", 1)).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    let j: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        j["grants"],
        serde_json::json!([{"id": id, "share": 0, "lease_ns": 3_000_000_000u64}])
    );
    let (_, m) = call(&st, Method::GET, "/metrics", None, None).await;
    let m = m.as_str().unwrap();
    for line in [
        "yarl_root_in_flight_part{quota=\"db\"} 10",
        "yarl_root_in_flight_granted{quota=\"db\"} 10",
        "yarl_root_in_flight_holders{quota=\"db\"} 2",
        "yarl_root_in_flight_demand{quota=\"db\"} 100",
    ] {
        assert!(m.contains(line), "{line} in:\n{m}");
    }
}
