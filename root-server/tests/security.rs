//! Secure defaults, HTTPS and what a client holding the sync token can do, against real
//! `yarl-root` processes. Figures are printed (run with `--nocapture`).

mod common;

use common::process::{free_port, write_token, Root};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use yarl_core::{Clock, Limiter, MonotonicClock, Outcome, SyncConfig, SyncEngine};

const ADMIN: &str = "admin-token-0123456789abcdef";
const SYNC: &str = "sync-token-0123456789abcdef";

fn tokens(dir: &Path) -> Vec<String> {
    vec![
        "--admin-token-file".into(),
        write_token(dir, "admin", ADMIN).display().to_string(),
        "--sync-token-file".into(),
        write_token(dir, "sync", SYNC).display().to_string(),
    ]
}

#[test]
fn refuses_to_start_open_on_a_network_address() {
    let out = Command::new(env!("CARGO_BIN_EXE_yarl-root"))
        .args(["--listen", &format!("0.0.0.0:{}", free_port()), "--db", "sqlite::memory:"])
        .env_remove("YARL_ADMIN_TOKEN_FILE")
        .env_remove("YARL_SYNC_TOKEN_FILE")
        .env_remove("YARL_INSECURE_NO_AUTH")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("yarl-root --listen 0.0.0.0:…: {}\n{err}", out.status);
    assert!(!out.status.success());
    assert!(err.contains("refusing to listen on 0.0.0.0:"), "{err}");
    assert!(err.contains("--insecure-no-auth"), "{err}");
}

#[test]
fn insecure_no_auth_is_said_out_loud() {
    let root = Root::start(&["--insecure-no-auth"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(root.log().contains("--insecure-no-auth"), "{}", root.log());
}

/// The recommended 0640 root:yarl token file starts quietly; one others can read does not.
#[cfg(unix)]
#[test]
fn token_files_readable_by_others_are_warned_about() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let admin = write_token(dir.path(), "admin", ADMIN);
    let sync = write_token(dir.path(), "sync", SYNC);
    std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(&sync, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (admin, sync) = (admin.display().to_string(), sync.display().to_string());
    let root = Root::start(&["--admin-token-file", &admin, "--sync-token-file", &sync]);
    let log = root.log();
    assert!(log.contains(&format!("the sync token file {sync} is readable by others")), "{log}");
    assert!(!log.contains("the admin token file"), "{log}");
}

/// `systemctl reload` sends SIGHUP whether or not the root serves TLS: without it there is
/// nothing to reload, and the root must live on.
#[cfg(unix)]
#[test]
fn sighup_without_tls_keeps_the_root() {
    let mut root = Root::start(&[]);
    root.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !root.log().contains("SIGHUP: no TLS certificate to reload") {
        assert!(root.alive(), "SIGHUP ended the root: {}", root.log());
        assert!(Instant::now() < deadline, "SIGHUP not seen: {}", root.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(root.alive(), "{}", root.log());
}

fn make_ca(dir: &Path) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/make-test-ca.sh");
    let out = Command::new(script).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// One HTTPS request with only `ca` trusted; the status, or the TLS error.
async fn https(addr: &str, ca: &Path, request: String) -> Result<u16, String> {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| text.into_owned())
}

fn sync_request(token: Option<&str>) -> String {
    let body = r#"{"v":1,"limiter":"tls-test"}"#;
    let auth = token.map(|t| format!("Authorization: bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST /v1/sync HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn https_with_tokens_and_a_reloaded_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    make_ca(&first);
    make_ca(&second);
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    for f in ["server.pem", "server.key"] {
        std::fs::copy(first.join(f), live.join(f)).unwrap();
    }
    let mut args = tokens(dir.path());
    args.extend([
        "--tls-cert".into(),
        live.join("server.pem").display().to_string(),
        "--tls-key".into(),
        live.join("server.key").display().to_string(),
    ]);
    let root = Root::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let ca1 = first.join("ca.pem");
    assert_eq!(https(&root.addr, &ca1, sync_request(Some(SYNC))).await, Ok(200));
    assert_eq!(https(&root.addr, &ca1, sync_request(None)).await, Ok(401));
    assert_eq!(https(&root.addr, &ca1, sync_request(Some("wrong"))).await, Ok(401));
    // Plain HTTP on the TLS port gets nowhere.
    let plain = reqwest::get(format!("http://{}/healthz", root.addr)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());

    // A renewed certificate (here: from another CA) is served after SIGHUP.
    for f in ["server.pem", "server.key"] {
        std::fs::copy(second.join(f), live.join(f)).unwrap();
    }
    root.signal("HUP");
    let ca2 = second.join("ca.pem");
    let deadline = Instant::now() + Duration::from_secs(5);
    while https(&root.addr, &ca2, sync_request(Some(SYNC))).await != Ok(200) {
        assert!(Instant::now() < deadline, "not reloaded: {}", root.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(https(&root.addr, &ca1, sync_request(Some(SYNC))).await.is_err());
    assert!(root.log().contains("TLS certificate reloaded"), "{}", root.log());
}

/// Issue 10: a client holding the sync token, sending the worst legal messages, cannot keep
/// a quota rejecting honest traffic for more than two intervals after it stops. A real
/// root; an honest limiter (the real `Limiter` and `SyncEngine`, 1 s interval) admitting
/// half the limit; eight attacker sessions at 50 ms claiming u64::MAX everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worst_legal_client_cannot_keep_a_quota_rejecting() {
    const INTERVAL: Duration = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let args = tokens(dir.path());
    let root = Root::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let client = reqwest::Client::new();
    let base = root.url();
    // The recommended bursts at a 1 s interval: 1.5 and 3 intervals of the limit.
    let q: Value = client
        .put(format!("{base}/v1/quotas/api"))
        .bearer_auth(ADMIN)
        .json(&json!({"limit": 100, "low_burst": 150, "high_burst": 300}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = q["id"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let clock = Arc::new(MonotonicClock::new());
    let limiter = Arc::new(Limiter::builder().clock(clock.clone()).build());
    let config = SyncConfig { interval: INTERVAL, ..SyncConfig::default() };
    let mut engine = SyncEngine::new(limiter.clone(), vec![base.clone()], config).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The honest limiter's sync thread.
    let syncer = {
        let (client, base, clock, stop) =
            (client.clone(), base.clone(), clock.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let now = clock.now_nanos();
                for call in engine.begin_round(now) {
                    let t0 = Instant::now();
                    let r = client
                        .post(format!("{base}/v1/sync"))
                        .bearer_auth(SYNC)
                        .json(&call.request)
                        .timeout(Duration::from_millis(500))
                        .send()
                        .await;
                    let result = match r {
                        Ok(r) if r.status().is_success() => {
                            r.json().await.map_err(|e| e.to_string())
                        }
                        Ok(r) => Err(r.status().to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    engine.on_response(call.root, result, t0.elapsed(), clock.now_nanos());
                }
                engine.end_round(clock.now_nanos());
                tokio::time::sleep(INTERVAL).await;
            }
        })
    };
    // Wait until the limiter knows the quota.
    while limiter.quota("api").is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Honest traffic: 50 requests/s, half the limit, the whole time.
    let rejections = Arc::new(parking_lot::Mutex::new(Vec::<f64>::new()));
    let honest = {
        let (limiter, stop, rejections) = (limiter.clone(), stop.clone(), rejections.clone());
        let t0 = Instant::now();
        std::thread::spawn(move || {
            let mut sent = 0u32;
            while !stop.load(Relaxed) {
                let d = limiter.account("api", 1).unwrap();
                if d.outcome == Outcome::Rejected {
                    rejections.lock().push(t0.elapsed().as_secs_f64());
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (sent, t0)
        })
    };
    tokio::time::sleep(2 * INTERVAL).await;
    let before = rejections.lock().len();

    // Baseline: the most one honest limiter may add in one interval (high_burst plus an
    // interval of the limit), once; how long do the others see rejections after it?
    let baseline_at = Instant::now();
    let body = json!({"v": 1, "limiter": "honest-burst", "batches": [{"seq": 1, "deltas": [[id, 400_000, 0]]}]});
    let r =
        client.post(format!("{base}/v1/sync")).bearer_auth(SYNC).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    tokio::time::sleep(5 * INTERVAL).await;

    // The attack: 3 s of the worst legal messages from 8 sessions every 50 ms.
    let attack_start = Instant::now();
    let mut seq = 0u64;
    while attack_start.elapsed() < Duration::from_secs(3) {
        seq += 1;
        let mut sends = vec![];
        for s in 0..8 {
            let body = json!({
                "v": 1, "limiter": format!("attacker-{s}"),
                "batches": [{"seq": seq, "deltas": [[id, u64::MAX, u64::MAX]]}],
                "hints": [[id, u64::MAX]],
            });
            sends.push(client.post(format!("{base}/v1/sync")).bearer_auth(SYNC).json(&body).send());
        }
        for r in futures_join(sends).await {
            assert_eq!(r.unwrap().status(), 200);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = Instant::now();
    tokio::time::sleep(5 * INTERVAL).await;
    stop.store(true, Relaxed);
    let (sent, t0) = honest.join().unwrap();
    syncer.await.unwrap();

    let at = |i: Instant| i.duration_since(t0).as_secs_f64();
    let r = rejections.lock();
    let window = |from: f64, to: f64| -> (usize, f64) {
        let hits: Vec<f64> = r.iter().copied().filter(|&t| t > from && t <= to).collect();
        (hits.len(), hits.last().map_or(0.0, |t| t - from))
    };
    let (base_n, base_last) = window(at(baseline_at), at(attack_start));
    let (during, _) = window(at(attack_start), at(stopped));
    let (after_n, last) = window(at(stopped), f64::MAX);
    eprintln!(
        "worst legal client: {sent} honest requests at 50/s (limit 100/s, bursts 150/300, 1 s \
         interval): {before} rejected before; after one honest full burst {base_n} rejected, \
         the last {base_last:.2} s after it; {during} during the 3 s attack; after the \
         attacker stopped {after_n} rejected, the last {last:.2} s after it stopped"
    );
    assert_eq!(before, 0, "honest traffic alone must pass");
    assert!(during > 0, "the attack had no effect: the test measures nothing");
    // The root is back at low_burst 1.75 s after the attacker stops; the limiter sees that
    // at its next sync, up to one interval later, and its estimator holds the fill level
    // between syncs (it assumes the others add the limit): about 3 s in all, as after an
    // honest full burst. The bounds leave room for scheduling noise.
    assert!(
        last <= 3.5 * INTERVAL.as_secs_f64(),
        "honest traffic rejected {last:.2} s after the attacker stopped"
    );
    assert!(
        last <= base_last + 0.5 * INTERVAL.as_secs_f64(),
        "the attacker ({last:.2} s) did worse than an honest burst ({base_last:.2} s)"
    );
}

async fn futures_join<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(fs.len());
    for f in fs {
        out.push(f.await);
    }
    out
}

/// Issue 10, items 3 and 4: eight 64 MiB sync bodies at once. Memory stays bounded (the
/// budget admits one full body at a time, the others wait and get 503 + Retry-After) and
/// `/healthz` keeps answering quickly throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_64_mib_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let args = tokens(dir.path());
    let root = Root::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let base = root.url();
    // 1.9 M valid entries with long numbers: just under 64 MiB and under the entry limit.
    let mut body = String::from(r#"{"v":1,"limiter":"L","batches":[{"seq":1,"deltas":["#);
    let entry = "[1234567890123,1234567890123,1234567],";
    while body.len() + entry.len() + 10 < (64 << 20) && body.len() / entry.len() < 1_900_000 {
        body.push_str(entry);
    }
    body.push_str("[1,1,1]]}]}");
    let size = body.len();
    let body = bytes::Bytes::from(body);
    let (rss0, _) = root.rss_kib();

    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let probe = {
        let (client, base, done) = (client.clone(), base.clone(), done.clone());
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut n = 0;
            while !done.load(Relaxed) {
                let t0 = Instant::now();
                let r = client.get(format!("{base}/healthz")).send().await.unwrap();
                assert_eq!(r.status(), 200);
                worst = worst.max(t0.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (n, worst)
        })
    };
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (pid, peak) = (root.pid(), peak.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(v) = s.lines().find(|l| l.starts_with("VmHWM:")) {
                        let kib = v.split_whitespace().nth(1).and_then(|n| n.parse().ok());
                        peak.fetch_max(kib.unwrap_or(0), Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let t0 = Instant::now();
    let mut sends = vec![];
    for k in 0..8 {
        let (client, base) = (client.clone(), base.clone());
        let body = bytes::Bytes::from(String::from_utf8(body.to_vec()).unwrap().replacen(
            "\"L\"",
            &format!("\"L{k}\""),
            1,
        ));
        sends.push(tokio::spawn(async move {
            let r = client
                .post(format!("{base}/v1/sync"))
                .bearer_auth(SYNC)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            // A body refused while it arrives (the memory budget full) gets its 503 and the
            // connection closed: a client still sending may see only the close.
            match r {
                Ok(r) => (r.status().as_u16(), r.headers().contains_key("retry-after")),
                Err(e) if e.is_request() => (0, true),
                Err(e) => panic!("{e}"),
            }
        }));
    }
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for s in sends {
        let (status, retry_after) = s.await.unwrap();
        assert!(status == 200 || ((status == 503 || status == 0) && retry_after), "{status}");
        *statuses.entry(status).or_default() += 1;
    }
    let took = t0.elapsed();
    done.store(true, Relaxed);
    let (probes, worst) = probe.await.unwrap();
    sampler.abort();
    let peak_kib = peak.load(Relaxed).max(root.rss_kib().1);
    eprintln!(
        "8 concurrent sync bodies of {:.1} MiB: statuses {statuses:?} (0: closed while \
         sending) in {:.1} s; RSS {} MiB \
         before, peak {} MiB; /healthz answered {probes} times, slowest {:.1} ms",
        size as f64 / (1 << 20) as f64,
        took.as_secs_f64(),
        rss0 / 1024,
        peak_kib / 1024,
        worst.as_secs_f64() * 1000.0
    );
    assert!(statuses.get(&200).copied().unwrap_or(0) >= 1);
    assert!(peak_kib < 640 * 1024, "peak RSS {peak_kib} KiB");
    assert!(worst < Duration::from_millis(100), "/healthz took {worst:?}");
}
