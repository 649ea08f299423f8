//! What each layer costs per request without any network: the services of
//! `bench_server.rs` called in a loop on one thread (`make bench-tower` prints it beside the
//! HTTP figures, which a shared machine makes noisy). The yarl quotas are set by hand
//! (1,000,001 in the same 3-level tree as the HTTP benchmark) and never reject.
//!
//! Usage: `layer_cost [REQUESTS] [ROUNDS]` (default 1,000,000 and 5): interleaved rounds,
//! the median ns per request of each variant.

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::Request;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tower::{Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use yarl_core::{Limiter, Limits, QuotaUpdate};
use yarl_tower::{Quotas, Yarl};

const TENANTS: u64 = 1000;
const BUCKETS: u64 = 10_000;
const LEAVES: u64 = 989_001;

fn quotas(limiter: &Limiter) {
    let limits = Limits::from_units(1e6, 1e9, 1e9).expect("limits");
    let mut all = Vec::new();
    let mut id = 0;
    let mut push = |name: String, parent: Option<String>| {
        id += 1;
        all.push(QuotaUpdate {
            id,
            name,
            epoch: id,
            deleted: false,
            reset_epoch: 0,
            limits,
            parent,
        });
    };
    for t in 0..TENANTS {
        push(format!("tenant-{t}"), None);
    }
    for b in 0..BUCKETS {
        push(format!("tenant-{}.b{b}", b % TENANTS), Some(format!("tenant-{}", b % TENANTS)));
    }
    for l in 0..LEAVES {
        let b = l % BUCKETS;
        push(format!("s3_bucket-{l:07}_read"), Some(format!("tenant-{}.b{b}", b % TENANTS)));
    }
    for chunk in all.chunks(100_000) {
        limiter.apply_quotas(chunk);
    }
}

async fn hello() -> &'static str {
    "Hello, World!"
}

type Svc = axum::routing::RouterIntoService<axum::body::Body>;

async fn run(svc: &mut Svc, paths: &[String]) -> f64 {
    let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40000)));
    let start = Instant::now();
    for p in paths {
        let mut req = Request::get(p.as_str()).body(axum::body::Body::empty()).expect("request");
        req.extensions_mut().insert(peer);
        let r = svc.ready().await.expect("ready").call(req).await.expect("response");
        assert!(r.status().is_success(), "{}", r.status());
    }
    start.elapsed().as_nanos() as f64 / paths.len() as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let limiter = Arc::new(Limiter::builder().capacity(1_100_000).build());
    quotas(&limiter);
    let yarl = Yarl::unsynced(limiter);
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let paths: Vec<String> = (0..n)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            format!("/s3_bucket-{:07}_read", rng % LEAVES)
        })
        .collect();

    let governor = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .finish()
        .expect("governor config");
    let mut variants: Vec<(&str, Svc)> = vec![
        ("no layer", Router::new().route("/{*path}", get(hello)).into_service()),
        (
            "tower-governor (peer IP)",
            Router::new()
                .route("/{*path}", get(hello))
                .layer(GovernorLayer::new(governor))
                .into_service(),
        ),
        (
            "yarl-tower, one quota",
            Router::new()
                .route("/{*path}", get(hello))
                .layer(yarl.layer(|_: &Parts, q: &mut Quotas| {
                    q.account("s3_bucket-0123456_read", 1);
                }))
                .into_service(),
        ),
        (
            "yarl-tower, random of 1M",
            Router::new()
                .route("/{*path}", get(hello))
                .layer(yarl.layer(|req: &Parts, q: &mut Quotas| {
                    q.account(req.uri.path().trim_start_matches('/').to_owned(), 1);
                }))
                .into_service(),
        ),
    ];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for (_, svc) in variants.iter_mut() {
        run(svc, &paths[..n.min(100_000)]).await;
    }
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            results[i].push(run(&mut variants[i].1, &paths).await);
        }
    }
    println!("| variant (in process, {n} requests x {rounds} rounds) | ns per request (median) | over no layer |");
    println!("|---|---|---|");
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = med(&mut results[0].clone());
    for (i, (name, _)) in variants.iter().enumerate() {
        let m = med(&mut results[i]);
        println!("| {name} | {m:.0} | +{:.0} |", m - base);
    }
}
