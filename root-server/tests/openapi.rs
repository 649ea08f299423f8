//! The served OpenAPI document against the router it describes: the same routes and
//! methods both ways, links that lead somewhere, and a name pattern that accepts exactly
//! the names the server does.

mod common;

use axum::http::{Method, StatusCode};
use common::{call, sqlite_store, state};
use proptest::prelude::*;
use serde_json::Value;
use std::collections::BTreeSet;
use yarl_root::Settings;

const TOKEN: &str = "t0ken";

/// Routes of the router that the document leaves out on purpose: the limiters' binary
/// protocol (docs/sync-protocol.md).
const NOT_DESCRIBED: &[&str] = &["/v1/sync", "/v1/copy"];

async fn root() -> (yarl_root::AppState, tempfile::TempDir) {
    let (store, _, dir) = sqlite_store().await;
    let settings = Settings { admin_token: Some(TOKEN.into()), ..Settings::default() };
    (state(store, settings).await, dir)
}

async fn document() -> Value {
    let (st, _d) = root().await;
    // No token: the document is public, like /healthz.
    let (s, doc) = call(&st, Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK, "{doc}");
    doc
}

/// Every (path, method) the document lists.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((path.clone(), method.to_uppercase()));
        }
    }
    ops
}

/// The paths of `app`'s `.route(...)` calls, read from its source: axum cannot list a
/// router's routes, and a route added without a line in the document must fail here.
fn router_paths() -> BTreeSet<String> {
    include_str!("../src/lib.rs")
        .split(".route(\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn document_is_openapi_3_1_with_bearer_auth() {
    let doc = document().await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["components"]["securitySchemes"]["admin_token"]["scheme"], "bearer");
    for (path, method) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let public = ["/healthz", "/metrics", "/v1/openapi.json"].contains(&path.as_str());
        assert_eq!(op["security"].is_null(), public, "{method} {path}: security");
        if !public {
            for status in ["401", "503"] {
                assert!(op["responses"][status].is_object(), "{method} {path}: no {status}");
            }
        }
    }
}

/// A write needs a rate or a cap on requests in flight, and the document says so: the
/// bodies the schema takes are the ones the server does, on this point.
#[tokio::test]
async fn a_write_needs_limit_or_max_in_flight() {
    let doc = document().await;
    for name in ["QuotaBody", "BatchWrite"] {
        let any = doc["components"]["schemas"][name]["anyOf"].as_array().unwrap();
        let required: Vec<&Value> = any.iter().map(|a| &a["required"][0]).collect();
        assert_eq!(required, ["limit", "max_in_flight"], "{name}");
        assert_eq!(any[1]["properties"]["per"]["type"], "null", "{name}");
    }
}

#[tokio::test]
async fn every_route_is_described_and_every_operation_routed() {
    let doc = document().await;
    let ops = operations(&doc);
    let described: BTreeSet<String> = ops.iter().map(|(p, _)| p.clone()).collect();
    for path in router_paths() {
        if NOT_DESCRIBED.contains(&path.as_str()) {
            assert!(!described.contains(&path), "{path} is described after all");
            continue;
        }
        assert!(described.contains(&path), "route {path} is missing from the document");
    }

    let (st, _d) = root().await;
    let all = [Method::GET, Method::PUT, Method::POST, Method::DELETE, Method::PATCH];
    for path in &described {
        let uri = path.replace("{name}", "q1");
        for method in &all {
            let listed = ops.contains(&(path.clone(), method.to_string()));
            // GET/PUT/DELETE of `/v1/quotas/q1:reset` are those of a quota named `q1:reset`
            // (names may hold `:`), so only the listed method is checked there.
            if path.ends_with(":reset") && !listed {
                continue;
            }
            let body = (*method == Method::PUT || *method == Method::POST).then_some("{}");
            let (s, v) = call(&st, method.clone(), &uri, body, Some(TOKEN)).await;
            if listed {
                assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}: {v}");
                assert!(
                    !v["error"].as_str().unwrap_or_default().starts_with("no route"),
                    "{method} {uri}: {v}"
                );
            } else {
                assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri} is not described");
            }
        }
    }
}

#[tokio::test]
async fn links_name_real_operations_and_parameters() {
    let doc = document().await;
    let mut params_of = std::collections::HashMap::new();
    for (path, method) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_lowercase()];
        let names: BTreeSet<String> = op["parameters"]
            .as_array()
            .map(|ps| ps.iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        params_of.insert(op["operationId"].as_str().unwrap().to_owned(), names);
    }
    let links = &doc["paths"]["/v1/quotas/{name}"]["put"]["responses"]["200"]["links"];
    let targets: BTreeSet<&str> =
        links.as_object().unwrap().values().map(|l| l["operationId"].as_str().unwrap()).collect();
    assert_eq!(targets, BTreeSet::from(["get_quota", "reset_quota", "delete_quota"]));
    for (name, link) in links.as_object().unwrap() {
        let target = &params_of[link["operationId"].as_str().unwrap()];
        for (param, value) in link["parameters"].as_object().unwrap() {
            assert!(target.contains(param), "link {name}: no parameter {param}");
            assert_eq!(value, "$response.body#/name");
        }
    }
}

/// The document's name pattern, compiled.
fn name_regex() -> regex::Regex {
    let doc = block_on(document());
    let pattern = doc["components"]["schemas"]["QuotaName"]["pattern"].as_str().unwrap();
    regex::RegexBuilder::new(pattern).size_limit(1 << 26).build().unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Mostly near-valid names: the set's characters, escapes (some of bytes that need
    /// none, some malformed), a `*` anywhere, long runs.
    #[test]
    fn name_pattern_is_validate_name(
        parts in prop::collection::vec(
            prop_oneof![
                "[A-Za-z0-9._:@-]{1,8}",
                "%[0-9A-Fa-f]{2}",
                Just("%2A".to_owned()),
                Just("%2a".to_owned()),
                Just("*".to_owned()),
                "%[0-9A-Za-z]{0,2}",
                "[ /é#?]",
                "a{200,260}",
                "(%00){250,256}",
            ],
            0..8,
        )
    ) {
        static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
        let re = RE.get_or_init(name_regex);
        let name = parts.concat();
        prop_assert_eq!(
            re.is_match(&name),
            yarl_core::validate_name(&name).is_ok(),
            "{:?}", name
        );
    }
}
