//! The HTTP API through `app(...).oneshot(...)` over a real SQLite file: every route and
//! every error the README's error table names.

mod common;

use axum::http::{Method, StatusCode};
use common::{call, err, quota, sqlite_store, state};
use serde_json::{json, Value};
use yarl_root::Settings;

const GET: Method = Method::GET;
const PUT: Method = Method::PUT;
const POST: Method = Method::POST;
const DELETE: Method = Method::DELETE;

async fn root() -> (yarl_root::AppState, tempfile::TempDir) {
    let (store, _, dir) = sqlite_store().await;
    (state(store, Settings::default()).await, dir)
}

#[tokio::test]
async fn create_read_list_delete() {
    let (st, _d) = root().await;
    let (s, v) = call(&st, PUT, "/v1/quotas/api", Some(&quota(10.0, 5.0, 10.0, None)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"name":"api","id":1,"epoch":1,"limit":10.0,"low_burst":5.0,"high_burst":10.0,"parent":null})
    );
    let child = quota(0.5, 1.0, 2.0, Some("api"));
    let (s, v) = call(&st, PUT, "/v1/quotas/api:user@1", Some(&child), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["id"].as_u64(), v["epoch"].as_u64()), (Some(2), Some(2)));
    assert_eq!(v["parent"], "api");

    // Replacing keeps the id and takes a new epoch.
    let (s, v) = call(&st, PUT, "/v1/quotas/api", Some(&quota(20.0, 5.0, 10.0, None)), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["id"].as_u64(), v["epoch"].as_u64(), v["limit"].as_f64()),
        (Some(1), Some(3), Some(20.0))
    );

    let (s, v) = call(&st, GET, "/v1/quotas/api", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["limit"], 20.0);
    assert_eq!(v["counter"], json!({"fill":0.0,"rate":0.0,"drop_probability":0.0}));

    let (s, v) = call(&st, GET, "/v1/quotas", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> =
        v["quotas"].as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["api", "api:user@1"]);
    assert_eq!(v["next"], Value::Null);

    let (s, v) = call(&st, DELETE, "/v1/quotas/api", None, None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(err(&v).contains("parent of \"api:user@1\""), "{v}");

    let (s, v) = call(&st, DELETE, "/v1/quotas/api:user@1", None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["deleted"].as_bool(), v["epoch"].as_u64()), (Some(true), Some(4)));
    let (s, v) = call(&st, GET, "/v1/quotas/api:user@1", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(err(&v).contains("\"api:user@1\" does not exist"), "{v}");
    let (s, v) = call(&st, DELETE, "/v1/quotas/api:user@1", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

    // Now childless, the parent can go; the memory followed every write.
    let (s, _) = call(&st, DELETE, "/v1/quotas/api", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(st.epoch(), 5);
}

#[tokio::test]
async fn live_counter_follows_syncs() {
    let (st, _d) = root().await;
    call(&st, PUT, "/v1/quotas/api", Some(&quota(1.0, 10.0, 20.0, None)), None).await;
    let sync =
        json!({"v":1,"limiter":"l1","batches":[{"seq":1,"deltas":[[1,15000,0]]}]}).to_string();
    let (s, v) = call(&st, POST, "/v1/sync", Some(&sync), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api", None, None).await;
    let fill = v["counter"]["fill"].as_f64().unwrap();
    assert!((14.0..=15.0).contains(&fill), "{v}");
    let p = v["counter"]["drop_probability"].as_f64().unwrap();
    assert!((0.4..=0.5).contains(&p), "{v}");
    assert!(v["counter"]["rate"].as_f64().unwrap() > 0.0, "{v}");
}

#[tokio::test]
async fn quota_errors_name_the_problem() {
    let (st, _d) = root().await;
    call(&st, PUT, "/v1/quotas/p", Some(&quota(1.0, 1.0, 2.0, None)), None).await;
    call(&st, PUT, "/v1/quotas/c", Some(&quota(1.0, 1.0, 2.0, Some("p"))), None).await;
    let cases: &[(&str, String, StatusCode, &str)] = &[
        ("/v1/quotas/x", "{\"limit\": 1,".into(), StatusCode::BAD_REQUEST, "bad JSON"),
        ("/v1/quotas/x", "[1,2]".into(), StatusCode::BAD_REQUEST, "bad JSON"),
        (
            "/v1/quotas/x",
            r#"{"limit":1,"low_burst":1}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "high_burst is required unless the quota has a window (per)",
        ),
        (
            "/v1/quotas/x",
            r#"{"limit":1,"low_burst":1,"high_burst":2,"lowburst":3}"#.into(),
            StatusCode::BAD_REQUEST,
            "unknown field `lowburst`",
        ),
        (
            "/v1/quotas/x",
            quota(1.0, 3.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "low_burst (3) must not be greater than high_burst (2)",
        ),
        (
            "/v1/quotas/x",
            quota(0.0, 1.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit must be",
        ),
        (
            "/v1/quotas/x",
            quota(1.0, -1.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "low_burst must be",
        ),
        (
            "/v1/quotas/x",
            quota(1.0, 1.0, 2.0, Some("nope")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "parent \"nope\" of quota \"x\" does not exist",
        ),
        (
            "/v1/quotas/x",
            quota(1.0, 1.0, 2.0, Some("bad parent")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "parent: name has ' '",
        ),
        (
            "/v1/quotas/x",
            quota(1.0, 1.0, 2.0, Some("x")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "its own parent",
        ),
        (
            "/v1/quotas/p",
            quota(1.0, 1.0, 2.0, Some("c")),
            StatusCode::CONFLICT,
            "cycle: p -> c -> p",
        ),
        (
            "/v1/quotas/a%20b",
            quota(1.0, 1.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name has ' ' at byte 1",
        ),
        (
            "/v1/quotas/%C3%A4",
            quota(1.0, 1.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "name has 'ä'",
        ),
        (
            &*Box::leak(format!("/v1/quotas/{}", "a".repeat(256)).into_boxed_str()),
            quota(1.0, 1.0, 2.0, None),
            StatusCode::UNPROCESSABLE_ENTITY,
            "256 bytes long",
        ),
        (
            "/v1/quotas/x",
            r#"{"name":"y","limit":1,"low_burst":1,"high_burst":2}"#.into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "body names \"y\" but the path names \"x\"",
        ),
    ];
    for (uri, body, status, msg) in cases {
        let (s, v) = call(&st, PUT, uri, Some(body), None).await;
        assert_eq!(s, *status, "{uri} {body}: {v}");
        assert!(err(&v).contains(msg), "{uri} {body}: {v} should mention {msg:?}");
    }
    // Nothing was written by any of them.
    assert_eq!(st.epoch(), 2);
    let (s, v) = call(&st, GET, "/v1/quotas/a%20b", None, None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
}

#[tokio::test]
async fn too_large_bodies() {
    let (st, _d) = root().await;
    let big = format!(
        "{{\"limit\":1,\"low_burst\":1,\"high_burst\":2,\"parent\":\"{}\"}}",
        "a".repeat(2 << 20)
    );
    let (s, v) = call(&st, PUT, "/v1/quotas/x", Some(&big), None).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(err(&v).contains("too large") && err(&v).contains("1048576"), "{v}");
    // The batch route takes far more than 1 MiB.
    let items: Vec<Value> = (0..40_000)
        .map(|i| json!({"name": format!("bulk.{i:06}"), "limit": 1, "low_burst": 0, "high_burst": 1}))
        .collect();
    let body = serde_json::to_string(&items).unwrap();
    assert!(body.len() > 2 << 20);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"count": 40_000, "first_epoch": 1, "last_epoch": 40_000}));
}

#[tokio::test]
async fn tokens() {
    let (store, _, _d) = sqlite_store().await;
    let settings = Settings {
        admin_token: Some("adm-secret".into()),
        sync_token: Some("sync-secret".into()),
        ..Settings::default()
    };
    let st = state(store, settings).await;
    let body = quota(1.0, 1.0, 2.0, None);
    let sync = json!({"v":1,"limiter":"l1"}).to_string();
    for (m, uri, b) in [
        (PUT, "/v1/quotas/x", Some(body.as_str())),
        (GET, "/v1/quotas/x", None),
        (DELETE, "/v1/quotas/x", None),
        (GET, "/v1/quotas", None),
        (POST, "/v1/quotas:batch", Some("[]")),
    ] {
        let (s, v) = call(&st, m.clone(), uri, b, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {uri}");
        assert!(err(&v).contains("missing bearer token"), "{v}");
        let (s, v) = call(&st, m.clone(), uri, b, Some("adm-secreT")).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {uri}");
        assert_eq!(err(&v), "wrong bearer token");
        // The sync token does not open admin routes.
        let (s, _) = call(&st, m.clone(), uri, b, Some("sync-secret")).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{m} {uri}");
    }
    let (s, v) = call(&st, PUT, "/v1/quotas/x", Some(&body), Some("adm-secret")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call(&st, POST, "/v1/sync", Some(&sync), None).await;
    assert_eq!(
        (s, err(&v)),
        (StatusCode::UNAUTHORIZED, "missing bearer token: send \"Authorization: Bearer <token>\"")
    );
    let (s, _) = call(&st, POST, "/v1/sync", Some(&sync), Some("adm-secret")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = call(&st, POST, "/v1/sync", Some(&sync), Some("sync-secret")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["quotas"][0]["name"], "x");
    // Health and metrics stay open for probes and scrapers.
    assert_eq!(call(&st, GET, "/healthz", None, None).await.0, StatusCode::OK);
    assert_eq!(call(&st, GET, "/metrics", None, None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn batch_is_all_or_nothing() {
    let (st, _d) = root().await;
    call(&st, PUT, "/v1/quotas/root", Some(&quota(100.0, 10.0, 20.0, None)), None).await;
    let item = |n: &str, p: Option<&str>| json!({"name": n, "limit": 1, "low_burst": 1, "high_burst": 2, "parent": p});
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!([item("a", Some("root")), item("b", Some("ghost"))]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: parent \"ghost\" of quota \"b\" does not exist",
        ),
        (
            json!([item("a", None), item("a", None)]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"a\" appears twice (items 0 and 1)",
        ),
        (
            json!([item("a", Some("b")), item("b", Some("a"))]),
            StatusCode::CONFLICT,
            "item 0: quota \"a\" would close a parent cycle: a -> b -> a",
        ),
        (
            json!([item("a", None), {"name": "b", "limit": 1, "low_burst": 5, "high_burst": 2}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"b\": low_burst (5) must not be greater than high_burst (2)",
        ),
        (
            json!([item("a", None), item("b c", None)]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"b c\": name has ' '",
        ),
        (
            json!([item("a", None), {"name": "b", "limit": 1}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"b\": low_burst is required unless the quota has a window",
        ),
        (json!({"name": "a"}), StatusCode::BAD_REQUEST, "bad JSON"),
    ];
    for (body, status, msg) in cases {
        let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&body.to_string()), None).await;
        assert_eq!(s, status, "{body}: {v}");
        assert!(err(&v).contains(msg), "{body}: {v} should mention {msg:?}");
    }
    let (_, v) = call(&st, GET, "/v1/quotas", None, None).await;
    assert_eq!(v["quotas"].as_array().unwrap().len(), 1, "a failed batch wrote something: {v}");
    assert_eq!(st.epoch(), 1);

    // Parents may come later in the same batch; the whole batch lands with one epoch each.
    let good = json!([item("c", Some("b")), item("b", Some("root")), item("root", None)]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&good.to_string()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!({"count": 3, "first_epoch": 2, "last_epoch": 4}));
    let (_, v) = call(&st, GET, "/v1/quotas/root", None, None).await;
    assert_eq!((v["id"].as_u64(), v["epoch"].as_u64()), (Some(1), Some(4)), "{v}");
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some("[]"), None).await;
    assert_eq!(
        (s, v),
        (StatusCode::OK, json!({"count": 0, "first_epoch": null, "last_epoch": null}))
    );
}

#[tokio::test]
async fn batch_deletes_all_or_nothing() {
    let (st, _d) = root().await;
    let item = |n: &str, p: Option<&str>| json!({"name": n, "limit": 1, "low_burst": 1, "high_burst": 2, "parent": p});
    let del = |n: &str| json!({"name": n, "delete": true});
    let setup = json!([item("p", None), item("c", Some("p")), item("o", None)]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&setup.to_string()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!([item("n", None), del("o"), del("ghost")]),
            StatusCode::NOT_FOUND,
            "item 2: quota \"ghost\" does not exist",
        ),
        (
            json!([del("o"), del("p")]),
            StatusCode::CONFLICT,
            "item 1: quota \"p\" is the parent of \"c\"",
        ),
        (
            json!([del("o"), {"name": "c", "delete": true, "limit": 1}]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"c\": a delete takes only \"name\" and \"delete\", not limit",
        ),
        (
            json!([item("o", None), del("o")]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: quota \"o\" appears twice (items 0 and 1)",
        ),
        (
            json!([del("o"), item("x", Some("ghost"))]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 1: parent \"ghost\"",
        ),
        (
            json!([{"name": "o", "delete": true, "force": true}]),
            StatusCode::BAD_REQUEST,
            "unknown field `force`",
        ),
        (
            json!([del("b c")]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "item 0: quota \"b c\": name has ' '",
        ),
    ];
    for (body, status, msg) in cases {
        let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&body.to_string()), None).await;
        assert_eq!(s, status, "{body}: {v}");
        assert!(err(&v).contains(msg), "{body}: {v} should mention {msg:?}");
        // The item at fault by its index too, as the OpenAPI document says.
        let index: u64 = msg
            .strip_prefix("item ")
            .and_then(|m| m.split(':').next())
            .map_or(u64::MAX, |i| i.parse().unwrap());
        assert_eq!(v["index"].as_u64(), (index != u64::MAX).then_some(index), "{body}: {v}");
    }
    assert_eq!(st.epoch(), 3, "a refused batch wrote something");
    let (_, v) = call(&st, GET, "/v1/quotas", None, None).await;
    assert_eq!(v["quotas"].as_array().unwrap().len(), 3, "{v}");

    // Writes and deletes in one transaction; the root sees the deletes as single deletes do.
    let body = json!([del("p"), item("n", None), del("c")]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&body.to_string()), None).await;
    assert_eq!((s, &v), (StatusCode::OK, &json!({"count": 3, "first_epoch": 4, "last_epoch": 6})));
    assert_eq!(st.epoch(), 6);
    let (s, v) = call(&st, GET, "/v1/quotas/p", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas", None, None).await;
    let names: Vec<&str> =
        v["quotas"].as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n", "o"]);
    let (s, v) = call(&st, GET, "/metrics", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(v.as_str().unwrap().contains("yarl_root_quotas 2"), "{v}");
}

#[tokio::test]
async fn batch_errors_quote_a_long_name_in_part() {
    // A name is checked after the item is read: an error quoting it whole would be as large
    // as the body (256 MiB), in the answer and in the log line.
    let (st, _d) = root().await;
    let long = "a".repeat(300_000);
    for item in [
        json!({"name": long, "limit": 1, "low_burst": 0, "high_burst": 0}),
        json!({"name": long, "delete": true}),
        json!({"name": long, "delete": true, "limit": 1}),
        json!({"name": long, "max_in_flight": 0.5}),
    ] {
        let body = json!([item]).to_string();
        let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&body), None).await;
        assert_eq!((s, v["index"].as_u64()), (StatusCode::UNPROCESSABLE_ENTITY, Some(0)));
        let e = err(&v);
        assert!(e.len() < 2048 && e.contains("aaa…"), "{} bytes: {}", e.len(), &e[..100]);
    }
}

#[tokio::test]
async fn list_pages_in_name_order() {
    let (st, _d) = root().await;
    let names = ["B", "a", "a_b", "a.c", "ab", "b:1", "b@2", "s3_x", "s3_y", "s3_z"];
    let items: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "limit": 1, "low_burst": 0, "high_burst": 0}))
        .collect();
    let (s, _) =
        call(&st, POST, "/v1/quotas:batch", Some(&serde_json::to_string(&items).unwrap()), None)
            .await;
    assert_eq!(s, StatusCode::OK);
    let mut all = Vec::new();
    let mut uri = "/v1/quotas?limit=3".to_owned();
    loop {
        let (s, v) = call(&st, GET, &uri, None, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let page: Vec<String> = v["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["name"].as_str().unwrap().to_owned())
            .collect();
        assert!(page.len() <= 3);
        all.extend(page);
        match v["next"].as_str() {
            Some(n) => uri = format!("/v1/quotas?limit=3&after={n}"),
            None => break,
        }
    }
    let mut sorted: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    sorted.sort(); // bytewise
    assert_eq!(all, sorted);

    let (_, v) = call(&st, GET, "/v1/quotas?prefix=s3_&limit=2", None, None).await;
    assert_eq!(v["quotas"].as_array().unwrap().len(), 2);
    assert_eq!(v["next"], "s3_y");
    let (_, v) = call(&st, GET, "/v1/quotas?prefix=s3_&after=s3_y", None, None).await;
    assert_eq!(v["quotas"][0]["name"], "s3_z");
    assert_eq!(v["next"], Value::Null);
    // `_` is literal, not a wildcard.
    let (_, v) = call(&st, GET, "/v1/quotas?prefix=a_", None, None).await;
    assert_eq!(v["quotas"].as_array().unwrap().len(), 1, "{v}");

    for (q, msg) in [
        ("limit=0", "limit must be from 1 to 1000"),
        ("limit=1001", "limit must be from 1 to 1000"),
        ("limit=x", "limit"),
        ("prefix=a%20", "prefix: name has ' '"),
        ("after=%2F", "after: name has '/'"),
    ] {
        let (s, v) = call(&st, GET, &format!("/v1/quotas?{q}"), None, None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
        assert!(err(&v).contains(msg), "{q}: {v}");
    }
}

#[tokio::test]
async fn batch_route_does_not_shadow_names_with_colons() {
    let (st, _d) = root().await;
    let (s, v) =
        call(&st, PUT, "/v1/quotas/quotas:batch", Some(&quota(1.0, 1.0, 1.0, None)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["name"], "quotas:batch");
    let (s, v) = call(&st, GET, "/v1/quotas/quotas:batch", None, None).await;
    assert_eq!((s, &v["name"]), (StatusCode::OK, &json!("quotas:batch")));
    let (s, v) = call(&st, PUT, "/v1/quotas:batch", Some("[]"), None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{v}");
    assert!(err(&v).contains("method not allowed"));
    let (s, v) = call(&st, GET, "/v1/nothing", None, None).await;
    assert_eq!((s, err(&v)), (StatusCode::NOT_FOUND, "no route for /v1/nothing"));
}

#[tokio::test]
async fn sync_route() {
    let (st, _d) = root().await;
    call(&st, PUT, "/v1/quotas/a", Some(&quota(1.0, 100.0, 200.0, None)), None).await;
    let req = |seq: u64, since: Value| {
        json!({"v":1,"limiter":"l1","root_instance":since,"batches":[{"seq":seq,"deltas":[[1,5000,0],[99,1000,0]]}]}).to_string()
    };
    let (s, v) = call(&st, POST, "/v1/sync", Some(&req(1, Value::Null)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["v"].as_u64(), v["acked_seq"].as_u64(), v["epoch"].as_u64()),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(v["quotas"][0]["name"], "a");
    assert_eq!(v["quotas"][0]["limit"], 1000, "wire amounts are milli-units");
    let fill = v["counters"][0][1].as_u64().unwrap();
    assert!((4990..=5000).contains(&fill), "{v}");
    // The same batch again (a retry after a lost answer) is not counted twice.
    let inst = v["root_instance"].clone();
    let (s, v) = call(&st, POST, "/v1/sync", Some(&req(1, inst.clone())), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["acked_seq"], 1);
    let (_, m) = call(&st, GET, "/metrics", None, None).await;
    let m = m.as_str().unwrap();
    for line in [
        "yarl_root_sync_requests_total{result=\"ok\"} 2",
        "yarl_root_duplicate_batches_total 1",
        "yarl_root_deltas_applied_total 1",
        // Quota 99 is above every id this root read: held for its next poll, not dropped.
        "yarl_root_deltas_unknown_total 0",
        "yarl_root_deltas_held_total 1",
        "yarl_root_limiters 1",
        "yarl_root_quotas 1",
        "yarl_root_counters 1",
        "yarl_root_db_errors_total 0",
        "yarl_root_sync_duration_seconds_count 2",
        "yarl_root_sync_wait_seconds_count 2",
        "yarl_root_sync_wait_seconds_bucket{le=\"+Inf\"} 2",
        "yarl_root_info{db=\"sqlite\"} 1",
    ] {
        assert!(m.contains(line), "metrics lack {line:?}:\n{m}");
    }
    // The syncs held the root's lock for some time (a counter that only grows).
    let held = |m: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix("yarl_root_state_lock_held_seconds_total "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no lock time in the metrics:\n{m}"))
    };
    let before = held(m);
    assert!(before > 0.0, "{m}");
    assert!(m.contains("yarl_root_state_lock_wait_seconds_total "), "{m}");
    let (s, _) = call(&st, POST, "/v1/sync", Some(&req(2, inst.clone())), None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, m2) = call(&st, GET, "/metrics", None, None).await;
    assert!(held(m2.as_str().unwrap()) > before);

    for (body, status, msg) in [
        ("{\"v\":1,", StatusCode::BAD_REQUEST, "bad JSON"),
        (r#"{"v":2,"limiter":"l"}"#, StatusCode::BAD_REQUEST, "unsupported protocol version 2"),
        (r#"{"v":1,"limiter":""}"#, StatusCode::BAD_REQUEST, "limiter id"),
        (
            r#"{"v":1,"limiter":"l","batches":[{"seq":1,"deltas":[[1,-5,0]]}]}"#,
            StatusCode::BAD_REQUEST,
            "bad JSON: batches[0].deltas[0]",
        ),
        // A v1 body's type errors name the field, as the admin routes' do.
        (
            r#"{"v":1,"limiter":"l","batches":[{"seq":"1","deltas":[]}]}"#,
            StatusCode::BAD_REQUEST,
            "bad JSON: batches[0].seq: invalid type: string \"1\"",
        ),
        (r#"{"v":1,"limiter":7}"#, StatusCode::BAD_REQUEST, "bad JSON: limiter: invalid type"),
        // What drained of each delta: none, or one per delta.
        (
            r#"{"v":1,"limiter":"l","batches":[{"seq":1,"deltas":[[1,5,0],[2,5,0]],"drained":[5]}]}"#,
            StatusCode::BAD_REQUEST,
            "batches[0].drained has 1 amounts for 2 deltas",
        ),
    ] {
        let (s, v) = call(&st, POST, "/v1/sync", Some(body), None).await;
        assert_eq!(s, status, "{body}: {v}");
        assert!(err(&v).contains(msg), "{body}: {v}");
    }
    // serde quotes the body's strings whole: the message is cut at 1 KiB.
    let long =
        format!(r#"{{"v":1,"limiter":"l","batches":[{{"seq":"{}"}}]}}"#, "x".repeat(100_000));
    let (s, v) = call(&st, POST, "/v1/sync", Some(&long), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(err(&v).starts_with("bad JSON: batches[0].seq: invalid type: string \"xxx"), "{v}");
    assert!(err(&v).len() < 1100 && err(&v).ends_with('…'), "{} bytes", err(&v).len());
    let (s, v) = call(&st, GET, "/healthz", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v, json!({"status": "ok", "database": "up", "epoch": 1}));
}

#[tokio::test]
async fn reset_empties_the_counter_and_keeps_the_quota() {
    let (st, _d) = root().await;
    call(&st, PUT, "/v1/quotas/a", Some(&quota(1.0, 100.0, 200.0, None)), None).await;
    call(&st, PUT, "/v1/quotas/a:reset", Some(&quota(1.0, 100.0, 200.0, None)), None).await;
    let sync = |seq: u64, epoch: u64| {
        json!({"v":1,"limiter":"l1","seen_epoch":epoch,
               "batches":[{"seq":seq,"epoch":epoch,"deltas":[[1,50000,0]]}]})
        .to_string()
    };
    let (s, v) = call(&st, POST, "/v1/sync", Some(&sync(1, 2)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/a", None, None).await;
    assert!(v["counter"]["fill"].as_f64().unwrap() > 49.0, "{v}");

    let (s, v) = call(&st, POST, "/v1/quotas/a:reset", None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["name"].as_str(), v["epoch"].as_u64(), v["reset_epoch"].as_u64(), v["limit"].as_f64()),
        (Some("a"), Some(3), Some(3), Some(1.0)),
        "a new epoch for the row, the numbers unchanged"
    );
    let (_, v) = call(&st, GET, "/v1/quotas/a", None, None).await;
    assert_eq!(v["counter"]["fill"], 0.0, "{v}");
    assert_eq!(v["reset_epoch"], 3);

    // A batch counted before the limiter saw the reset does not bring the count back;
    // one counted after it does count.
    let (_, v) = call(&st, POST, "/v1/sync", Some(&sync(2, 2)), None).await;
    assert_eq!(v["acked_seq"], 2, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/a", None, None).await;
    assert_eq!(v["counter"]["fill"], 0.0, "the late batch was dropped: {v}");
    call(&st, POST, "/v1/sync", Some(&sync(3, 3)), None).await;
    let (_, v) = call(&st, GET, "/v1/quotas/a", None, None).await;
    assert!(v["counter"]["fill"].as_f64().unwrap() > 49.0, "{v}");

    // A replace keeps the last reset (so roots that read it back agree).
    let (_, v) = call(&st, PUT, "/v1/quotas/a", Some(&quota(2.0, 100.0, 200.0, None)), None).await;
    assert_eq!((v["epoch"].as_u64(), v["reset_epoch"].as_u64()), (Some(4), Some(3)), "{v}");

    // The quota literally named "a:reset" is reset with one more suffix.
    let (s, v) = call(&st, POST, "/v1/quotas/a:reset:reset", None, None).await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("a:reset")), "{v}");

    for (path, status, msg) in [
        ("/v1/quotas/nope:reset", StatusCode::NOT_FOUND, "\"nope\" does not exist"),
        ("/v1/quotas/a", StatusCode::METHOD_NOT_ALLOWED, "the only action is :reset"),
        ("/v1/quotas/a:drain", StatusCode::METHOD_NOT_ALLOWED, "the only action is :reset"),
        ("/v1/quotas/:reset", StatusCode::UNPROCESSABLE_ENTITY, "empty"),
        ("/v1/quotas/a%20b:reset", StatusCode::UNPROCESSABLE_ENTITY, "' '"),
    ] {
        let (s, v) = call(&st, POST, path, None, None).await;
        assert_eq!(s, status, "{path}: {v}");
        assert!(err(&v).contains(msg), "{path}: {v}");
    }
}

/// `--stripes 3`: concurrent syncs of several limiters through the router land in the right
/// stripes, answers carry every stripe's counters and the lead's quotas, and the admin API,
/// resets and metrics see one root.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_striped_root_serves_as_one_root() {
    let (store, _, _d) = sqlite_store().await;
    let st = state(store, Settings { stripes: 3, ..Settings::default() }).await;
    // Slow leaks: the fills stay what was sent for the length of the test.
    for i in 1..=30 {
        let (s, v) =
            call(&st, PUT, &format!("/v1/quotas/q{i}"), Some(&quota(0.001, 1e6, 2e6, None)), None)
                .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    // Four limiters, five rounds each, all at once; each round adds (limiter + 1) units to
    // every quota.
    let rounds = 5u64;
    let runs = (0..4u64).map(|l| {
        let st = st.clone();
        tokio::spawn(async move {
            let mut last = Value::Null;
            for seq in 1..=rounds {
                let deltas: Vec<[u64; 3]> = (1..=30).map(|id| [id, (l + 1) * 1000, 0]).collect();
                let body = json!({"v":1,"limiter":format!("l{l}"),
                    "root_instance": last["root_instance"], "since": last["version"].as_u64().unwrap_or(0),
                    "epoch": last["epoch"].as_u64().unwrap_or(0),
                    "batches":[{"seq":seq,"deltas":deltas}]})
                .to_string();
                let (s, v) = call(&st, POST, "/v1/sync", Some(&body), None).await;
                assert_eq!(s, StatusCode::OK, "{v}");
                assert_eq!(v["acked_seq"], seq, "{v}");
                if seq == 1 {
                    assert_eq!(v["quotas"].as_array().map(Vec::len), Some(30), "from the lead");
                    assert_eq!(v["epoch"], 30);
                }
                last = v;
            }
            last
        })
    });
    for run in runs.collect::<Vec<_>>() {
        run.await.unwrap();
    }
    // 5 rounds × (1 + 2 + 3 + 4) units on every quota, each counted once, in its stripe.
    for i in 1..=30 {
        let (_, v) = call(&st, GET, &format!("/v1/quotas/q{i}"), None, None).await;
        let fill = v["counter"]["fill"].as_f64().unwrap();
        assert!((49.9..=50.0).contains(&fill), "q{i}: {v}");
    }
    // A first contact gets every counter, from all three stripes.
    let (_, v) = call(&st, POST, "/v1/sync", Some(r#"{"v":1,"limiter":"new"}"#), None).await;
    let mut ids: Vec<u64> =
        v["counters"].as_array().unwrap().iter().map(|c| c[0].as_u64().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=30).collect::<Vec<_>>(), "{v}");
    // A reset reaches the stripe of its counter.
    let (s, _) = call(&st, POST, "/v1/quotas/q7:reset", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = call(&st, GET, "/v1/quotas/q7", None, None).await;
    assert_eq!(v["counter"]["fill"], 0.0, "{v}");

    let (_, m) = call(&st, GET, "/metrics", None, None).await;
    let m = m.as_str().unwrap();
    for line in [
        "yarl_root_state_stripes 3",
        "yarl_root_sync_requests_total{result=\"ok\"} 21",
        "yarl_root_syncs_applied_total 21",
        "yarl_root_deltas_applied_total 600",
        "yarl_root_limiters 5",
        "yarl_root_quotas 30",
        "yarl_root_counters 29",
        "yarl_root_resets_total 1",
    ] {
        assert!(m.contains(line), "metrics lack {line:?}:\n{m}");
    }
}

/// A template through the admin API, its keys through the sync route: a key has no row,
/// `GET` of its name shows its template and its counter.
#[tokio::test]
async fn templates_and_their_keys() {
    let (st, _d) = root().await;
    let (s, v) =
        call(&st, PUT, "/v1/quotas/api_key_*", Some(&quota(1.0, 5.0, 10.0, None)), None).await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("api_key_*")), "{v}");
    let template = v["id"].as_u64().unwrap();
    // A template cannot be a parent.
    let (s, v) =
        call(&st, PUT, "/v1/quotas/x", Some(&quota(1.0, 5.0, 10.0, Some("api_key_*"))), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    // The sync answer hands out the cluster's secret; the key's id comes from it.
    let first = json!({"v":1,"limiter":"l1"}).to_string();
    let (s, v) = call(&st, POST, "/v1/sync", Some(&first), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let secret = (v["key_secret"][0].as_u64().unwrap(), v["key_secret"][1].as_u64().unwrap());
    let id = yarl_core::zone::keys::key_id(secret, b"api_key_abc");
    let batch = json!({"v":1,"limiter":"l1","batches":[{"seq":1,"deltas":[[id,3000,0]]}],
        "key_templates":[[id, template]]})
    .to_string();
    let (s, v) = call(&st, POST, "/v1/sync", Some(&batch), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["template"].as_str(), v["id"].as_u64()), (Some("api_key_*"), Some(id)), "{v}");
    let fill = v["counter"]["fill"].as_f64().unwrap();
    assert!((2.9..=3.0).contains(&fill), "{v}");
    // Another key of the template, never seen: its template, no counter.
    let (s, v) = call(&st, GET, "/v1/quotas/api_key_new", None, None).await;
    assert_eq!((s, v["template"].as_str()), (StatusCode::OK, Some("api_key_*")), "{v}");
    assert_eq!(v["counter"], Value::Null);
    // A name no template covers: 404.
    let (s, _) = call(&st, GET, "/v1/quotas/other", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // An override for a key with bytes outside the name set: %XX, and % itself is %25 in a
    // URL.
    let (s, v) =
        call(&st, PUT, "/v1/quotas/api_key_%2500%25FF", Some(&quota(9.0, 5.0, 10.0, None)), None)
            .await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("api_key_%00%FF")), "{v}");
    let (_, m) = call(&st, GET, "/metrics", None, None).await;
    let m = m.as_str().unwrap();
    for line in [
        "yarl_root_keys 1",
        "yarl_root_keys_created_total 1",
        "yarl_root_keys_refused_total 0",
        "yarl_root_template_keys{template=\"api_key_*\"} 1",
        "yarl_root_template_keys_refused_total{template=\"api_key_*\"} 0",
    ] {
        assert!(m.contains(line), "metrics lack {line:?}:\n{m}");
    }
}

/// `:reset` of a key: keys have no row, so the reset is recorded as a tombstone of the
/// key's name; the root empties the key, drops deltas counted before it, hands the
/// tombstone to limiters, and the key stays under its template (not listed, no override).
#[tokio::test]
async fn a_key_is_reset_through_the_admin_api() {
    let (st, _d) = root().await;
    let (s, v) =
        call(&st, PUT, "/v1/quotas/api_key_*", Some(&quota(0.001, 50.0, 100.0, None)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let template = v["id"].as_u64().unwrap();
    let first = json!({"v":1,"limiter":"l1"}).to_string();
    let (_, v) = call(&st, POST, "/v1/sync", Some(&first), None).await;
    let secret = (v["key_secret"][0].as_u64().unwrap(), v["key_secret"][1].as_u64().unwrap());
    let id = yarl_core::zone::keys::key_id(secret, b"api_key_abc");
    let other = yarl_core::zone::keys::key_id(secret, b"api_key_other");
    let batch = |seq: u64, epoch: u64| {
        json!({"v":1,"limiter":"l1","epoch":epoch,"seen_epoch":epoch,
            "batches":[{"seq":seq,"epoch":epoch,"deltas":[[id,3000,0],[other,2000,0]]}],
            "key_templates":[[id, template],[other, template]]})
        .to_string()
    };
    let fill = |v: &Value| v["counter"]["fill"].as_f64().unwrap_or(0.0);
    let (s, v) = call(&st, POST, "/v1/sync", Some(&batch(1, 1)), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert!((2.9..=3.0).contains(&fill(&v)), "{v}");

    let (s, v) = call(&st, POST, "/v1/quotas/api_key_abc:reset", None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!((v["name"].as_str(), v["id"].as_u64()), (Some("api_key_abc"), Some(id)), "{v}");
    assert_eq!((v.get("deleted"), v["limit"].as_f64()), (None, Some(0.001)), "{v}");
    let reset_epoch = v["reset_epoch"].as_u64().unwrap();
    assert_eq!(v["epoch"].as_u64(), Some(reset_epoch), "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!((fill(&v), v["template"].as_str()), (0.0, Some("api_key_*")), "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_other", None, None).await;
    assert!((1.9..=2.0).contains(&fill(&v)), "another key keeps its count: {v}");

    // A batch counted before the reset is dropped for the key, not for the other one.
    let (s, _) = call(&st, POST, "/v1/sync", Some(&batch(2, 1)), None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!(fill(&v), 0.0, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_other", None, None).await;
    assert!((3.9..=4.0).contains(&fill(&v)), "{v}");
    // One counted after it is summed.
    let (_, v) = call(&st, POST, "/v1/sync", Some(&batch(3, reset_epoch)), None).await;
    assert!(v["counters"].as_array().unwrap().iter().any(|c| c[0].as_u64() == Some(id)), "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert!((2.9..=3.0).contains(&fill(&v)), "{v}");

    // Limiters learn it from the quota pages: the tombstone of the key's name.
    let (_, v) =
        call(&st, POST, "/v1/sync", Some(&json!({"v":1,"limiter":"l2"}).to_string()), None).await;
    let page = v["quotas"].as_array().unwrap();
    let tomb = page.iter().find(|q| q["name"] == "api_key_abc").expect("the reset's record");
    assert_eq!(
        (tomb["deleted"].as_bool(), tomb["reset_epoch"].as_u64()),
        (Some(true), Some(reset_epoch))
    );
    // The key is no quota: not listed, and a second reset works the same way.
    let (_, v) = call(&st, GET, "/v1/quotas", None, None).await;
    let names: Vec<&str> =
        v["quotas"].as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["api_key_*"]);
    let (s, v) = call(&st, POST, "/v1/quotas/api_key_abc:reset", None, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["reset_epoch"].as_u64().unwrap() > reset_epoch, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!(fill(&v), 0.0, "{v}");
    // An override made after the reset is a quota; deleting it falls back to the template.
    let (s, v) =
        call(&st, PUT, "/v1/quotas/api_key_abc", Some(&quota(9.0, 5.0, 10.0, None)), None).await;
    assert_eq!((s, v.get("deleted")), (StatusCode::OK, None), "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!((v["limit"].as_f64(), &v["template"]), (Some(9.0), &Value::Null), "{v}");
    let (s, _) = call(&st, DELETE, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = call(&st, GET, "/v1/quotas/api_key_abc", None, None).await;
    assert_eq!(v["template"].as_str(), Some("api_key_*"), "{v}");
    // A name no template covers is still 404.
    let (s, v) = call(&st, POST, "/v1/quotas/nokey:reset", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    // So is a template that does not exist, even under one that does.
    let (s, v) = call(&st, POST, "/v1/quotas/api_key_x*:reset", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
}

#[tokio::test]
async fn shadow_mode_is_stored_listed_and_flipped() {
    let (st, _d) = root().await;
    let body =
        json!({"limit": 10.0, "low_burst": 5.0, "high_burst": 10.0, "dry_run": true}).to_string();
    let (s, v) = call(&st, PUT, "/v1/quotas/new_limit", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["dry_run"], true);
    let (_, v) = call(&st, GET, "/v1/quotas/new_limit", None, None).await;
    assert_eq!(v["dry_run"], true, "read back from the database: {v}");
    // A template's keys show its mode.
    let (s, _) = call(&st, PUT, "/v1/quotas/k_*", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = call(&st, GET, "/v1/quotas/k_abc", None, None).await;
    assert_eq!((&v["template"], &v["dry_run"]), (&json!("k_*"), &json!(true)), "{v}");
    // Batch writes take it too; a delete item refuses it.
    let batch =
        json!([{"name": "b", "limit": 1.0, "low_burst": 1.0, "high_burst": 1.0, "dry_run": true}]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch.to_string()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas", None, None).await;
    let shadow: Vec<&str> = v["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["dry_run"] == true)
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(shadow, ["b", "k_*", "new_limit"]);
    let bad = json!([{"name": "b", "delete": true, "dry_run": true}]).to_string();
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&bad), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("dry_run"), "{v}");
    // Enforcing it is a write like any other: a new epoch, and no field when off.
    let enforce = quota(10.0, 5.0, 10.0, None);
    let (s, v) = call(&st, PUT, "/v1/quotas/new_limit", Some(&enforce), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v.get("dry_run"), None, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/new_limit", None, None).await;
    assert_eq!(v.get("dry_run"), None, "{v}");
    let wrong = json!({"limit": 1.0, "low_burst": 1.0, "high_burst": 1.0, "dry_run": "yes"});
    let (s, v) = call(&st, PUT, "/v1/quotas/new_limit", Some(&wrong.to_string()), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(err(&v).contains("dry_run: invalid type: string \"yes\", expected a boolean"), "{v}");
    let bad = json!([{"name": "c", "limit": 1.0, "low_burst": "1", "high_burst": 1.0}]).to_string();
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&bad), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(err(&v).starts_with("bad JSON: [0].low_burst: invalid type"), "{v}");
}

#[tokio::test]
async fn max_in_flight_is_stored_listed_and_checked() {
    let (st, _d) = root().await;
    // Alone: no rate, so no limit, window or bursts shown.
    let body = json!({"max_in_flight": 50}).to_string();
    let (s, v) = call(&st, PUT, "/v1/quotas/db_queries", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["max_in_flight"], 50, "{v}");
    for absent in ["limit", "per", "low_burst", "high_burst"] {
        assert_eq!(v.get(absent), None, "{absent}: {v}");
    }
    let (_, v) = call(&st, GET, "/v1/quotas/db_queries", None, None).await;
    assert_eq!((&v["max_in_flight"], v.get("limit")), (&json!(50), None), "from the database: {v}");
    // Beside a rate, on a template (per-key concurrency), whose keys show it.
    let both = json!({"limit": 10.0, "low_burst": 5.0, "high_burst": 10.0, "max_in_flight": 8});
    let (s, v) = call(&st, PUT, "/v1/quotas/gen_*", Some(&both.to_string()), None).await;
    assert_eq!((s, &v["limit"], &v["max_in_flight"]), (StatusCode::OK, &json!(10.0), &json!(8)));
    let (_, v) = call(&st, GET, "/v1/quotas/gen_k1", None, None).await;
    assert_eq!((&v["template"], &v["max_in_flight"]), (&json!("gen_*"), &json!(8)), "{v}");
    // Batches take it; a delete item refuses it.
    let batch = json!([{"name": "uploads", "max_in_flight": 200, "parent": "db_queries"}]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch.to_string()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/uploads", None, None).await;
    assert_eq!((&v["max_in_flight"], &v["parent"]), (&json!(200), &json!("db_queries")), "{v}");
    let bad = json!([{"name": "uploads", "delete": true, "max_in_flight": 1}]).to_string();
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&bad), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("max_in_flight"), "{v}");
    // What makes no sense is a 422 naming the field, and writes nothing.
    for (body, says) in [
        (json!({"max_in_flight": 0}), "max_in_flight must be a whole number from 1 to 1000000"),
        (json!({"max_in_flight": 2.5}), "max_in_flight must be a whole number"),
        (json!({"max_in_flight": 1e7}), "max_in_flight must be a whole number"),
        (json!({"max_in_flight": -3}), "max_in_flight must be a whole number"),
        (json!({"max_in_flight": 5, "per": "1h"}), "per needs a limit"),
        (json!({"max_in_flight": 5, "high_burst": 3}), "high_burst needs a limit"),
    ] {
        let (s, v) = call(&st, PUT, "/v1/quotas/db_queries", Some(&body.to_string()), None).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {v}");
        assert!(err(&v).contains(says), "{body}: {v}");
    }
    let batch = json!([{"name": "x", "max_in_flight": 0}]).to_string();
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("max_in_flight must be"), "{v}");
    // Neither a rate nor a concurrency.
    let (s, v) = call(&st, PUT, "/v1/quotas/db_queries", Some("{}"), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("limit is required unless the quota has max_in_flight"), "{v}");
    let batch = json!([{"name": "x", "low_burst": 1.0}]).to_string();
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("quota \"x\": limit is required unless"), "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/db_queries", None, None).await;
    assert_eq!(v["max_in_flight"], 50, "unchanged: {v}");
    // Dropping the cap is a write like any other: the field is gone.
    let rate = json!({"limit": 10.0, "low_burst": 5.0, "high_burst": 10.0}).to_string();
    let (s, v) = call(&st, PUT, "/v1/quotas/db_queries", Some(&rate), None).await;
    assert_eq!((s, v.get("max_in_flight")), (StatusCode::OK, None), "{v}");
}

#[tokio::test]
async fn windows_are_stored_exactly_and_default_their_bursts() {
    let (st, _d) = root().await;
    // 1,000 a day: exactly that, not a rate per second rounded to 0.012.
    let body = json!({"limit": 1000, "per": "1d"}).to_string();
    let (s, v) = call(&st, PUT, "/v1/quotas/daily", Some(&body), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let want = json!({"limit": 1000.0, "per": "1d", "low_burst": 999.0, "high_burst": 1000.0});
    for k in ["limit", "per", "low_burst", "high_burst"] {
        assert_eq!(v[k], want[k], "{k}: {v}");
    }
    let (_, v) = call(&st, GET, "/v1/quotas/daily", None, None).await;
    assert_eq!((&v["limit"], &v["per"]), (&json!(1000.0), &json!("1d")), "read back: {v}");
    // The extremes: 1 per 30 days, 1e12 per second; 1440 minutes is a day.
    for (body, limit, per) in [
        (json!({"limit": 1, "per": "30d", "low_burst": 0, "high_burst": 1}), 1.0, json!("30d")),
        (json!({"limit": 1e12, "low_burst": 0, "high_burst": 0}), 1e12, Value::Null),
        (json!({"limit": 5, "per": "1440m"}), 5.0, json!("1d")),
        (json!({"limit": 5, "per": "1s", "low_burst": 1, "high_burst": 1}), 5.0, Value::Null),
    ] {
        let (s, v) = call(&st, PUT, "/v1/quotas/x", Some(&body.to_string()), None).await;
        assert_eq!(s, StatusCode::OK, "{body}: {v}");
        let (_, v) = call(&st, GET, "/v1/quotas/x", None, None).await;
        assert_eq!((v["limit"].as_f64(), &v["per"]), (Some(limit), &per), "{body}: {v}");
    }
    // Windows a quota cannot have name the field; a batch item too.
    for bad in ["0s", "31d", "1w", "1.5h", "4097s", "h"] {
        let body = json!({"limit": 1, "per": bad}).to_string();
        let (s, v) = call(&st, PUT, "/v1/quotas/x", Some(&body), None).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {v}");
        assert!(err(&v).starts_with("per"), "{bad}: {v}");
    }
    let batch =
        json!([{"name": "h", "limit": 20, "per": "1h"}, {"name": "m", "limit": 1, "per": "2x"}]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch.to_string()), None).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(err(&v).contains("item 1") && err(&v).contains("per"), "{v}");
    let batch = json!([{"name": "h", "limit": 20, "per": "1h"}]);
    let (s, v) = call(&st, POST, "/v1/quotas:batch", Some(&batch.to_string()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&st, GET, "/v1/quotas/h", None, None).await;
    assert_eq!((&v["per"], &v["high_burst"]), (&json!("1h"), &json!(20.0)), "{v}");
    // A key under a windowed template shows the template's window.
    let (s, _) = call(
        &st,
        PUT,
        "/v1/quotas/k_*",
        Some(&json!({"limit": 10, "per": "1h"}).to_string()),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = call(&st, GET, "/v1/quotas/k_abc", None, None).await;
    assert_eq!((&v["template"], &v["per"]), (&json!("k_*"), &json!("1h")), "{v}");
}

/// A quota database recreated under a running root (its epochs start over): the root
/// polls for changes after its own epoch and sees none; the database's epoch, read when a
/// poll finds nothing, shows it behind (`yarl_root_db_epoch` below `yarl_root_epoch`).
#[tokio::test]
async fn a_database_whose_epoch_went_back_shows_in_the_metrics() {
    let (store, url, _dir) = sqlite_store().await;
    let st = state(store, Settings::default()).await;
    for n in ["a", "b"] {
        let (s, v) =
            call(&st, PUT, &format!("/v1/quotas/{n}"), Some(&quota(1.0, 1.0, 1.0, None)), None)
                .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    st.poll().await.unwrap();
    let metrics = |st| async move {
        call(st, GET, "/metrics", None, None).await.1.as_str().unwrap().to_owned()
    };
    let m = metrics(&st).await;
    assert!(m.contains("\nyarl_root_db_epoch 2\n") && m.contains("\nyarl_root_epoch 2\n"), "{m}");
    assert!(m.contains("\nyarl_root_db_went_back 0\n"), "{m}");
    // Recreated: empty, its counter back at 0.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("DELETE FROM yarl_quotas").execute(&pool).await.unwrap();
    sqlx::query("UPDATE yarl_epoch SET epoch = 0").execute(&pool).await.unwrap();
    st.poll().await.unwrap();
    let m = metrics(&st).await;
    assert!(m.contains("\nyarl_root_db_epoch 0\n") && m.contains("\nyarl_root_epoch 2\n"), "{m}");
    assert!(m.contains("\nyarl_root_db_went_back 1\n"), "{m}");
    // Writes take the database past the root's epoch again: what was written below it
    // stays unseen, and the root keeps saying so.
    for n in ["c", "d", "e"] {
        let (s, v) =
            call(&st, PUT, &format!("/v1/quotas/{n}"), Some(&quota(1.0, 1.0, 1.0, None)), None)
                .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    st.poll().await.unwrap();
    let m = metrics(&st).await;
    assert!(m.contains("\nyarl_root_db_went_back 1\n"), "{m}");
}
