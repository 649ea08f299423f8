//! `yarl-root quotas export|apply`: the real binary against a live root with an admin
//! token.

mod common;

use common::process::{write_token, Root};
use std::path::{Path, PathBuf};
use std::process::Command;
use yarl_root::quotas_file::{self, QuotaSet};

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn cli(url: &str, token: &Path, args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_yarl-root"))
        .arg("quotas")
        .args(args)
        .args(["--url", url, "--admin-token-file"])
        .arg(token)
        .env_remove("YARL_URL")
        .env_remove("YARL_ADMIN_TOKEN_FILE")
        // A server variable the client must not trip over (set for the server on its host).
        .env("YARL_LISTEN", "not an address")
        .output()
        .unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The root's epoch from `/healthz`: unchanged means nothing was written.
fn epoch(root: &Root) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(&root.addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["epoch"].as_u64().unwrap()
}

fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn parsed(text: &str) -> QuotaSet {
    quotas_file::parse("t", text).unwrap()
}

const FIRST: &str = "\
quotas:
  api_all: {limit: 10000, low_burst: 10000, high_burst: 20000}
  api_key_*: {limit: 10, low_burst: 10, high_burst: 20, parent: api_all}
  s3: {limit: 100, low_burst: 200, high_burst: 400}
  s3_get: {limit: 10, low_burst: 20, high_burst: 40, parent: s3}
";

/// `api_all` doubled, `s3_get` gone.
const SECOND: &str = "\
quotas:
  api_all: {limit: 20000, low_burst: 10000, high_burst: 20000}
  api_key_*: {limit: 10, low_burst: 10, high_burst: 20, parent: api_all}
  s3: {limit: 100, low_burst: 200, high_burst: 400}
";

#[test]
fn export_apply_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let token = write_token(dir.path(), "admin", "s3cret\n");
    let root = Root::start(&["--admin-token-file", token.to_str().unwrap()]);
    let url = root.url();
    let url = url.as_str();

    let first = file(dir.path(), "first.yaml", FIRST);
    let o = cli(url, &token, &["apply", first.to_str().unwrap()]);
    assert!(o.ok, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("+ api_key_*  limit=10 low_burst=10 high_burst=20 parent=api_all\n"));
    assert!(
        o.stdout.contains("4 to create, 0 to change, 0 to delete, 0 unchanged\n"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("applied: 4 quotas written"), "{}", o.stdout);
    assert_eq!(epoch(&root), 4);

    // Export says what the file says, and says it the same way every time.
    let e1 = cli(url, &token, &["export"]);
    assert!(e1.ok, "{}", e1.stderr);
    assert!(e1.stdout.starts_with(&format!("# yarl-root quotas export, from {url}\nquotas:\n")));
    assert_eq!(parsed(&e1.stdout), parsed(FIRST));
    let exported = file(dir.path(), "exported.yaml", &e1.stdout);
    let o = cli(url, &token, &["apply", exported.to_str().unwrap()]);
    assert!(
        o.ok && o.stdout == "0 to create, 0 to change, 0 to delete, 4 unchanged\n",
        "{}",
        o.stdout
    );
    assert_eq!(epoch(&root), 4, "applying what is there wrote something");
    let e2 = cli(url, &token, &["export"]);
    assert_eq!(e1.stdout, e2.stdout, "a second export differs");
    let o = cli(url, &token, &["export", "--prefix", "s3"]);
    assert_eq!(parsed(&o.stdout).keys().collect::<Vec<_>>(), ["s3", "s3_get"]);

    // A change and a removal: --dry-run shows them and writes nothing.
    let second = file(dir.path(), "second.yaml", SECOND);
    let second = second.to_str().unwrap();
    let o = cli(url, &token, &["apply", second, "--dry-run", "--prune"]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        "~ api_all  limit: 10000 -> 20000\n- s3_get\n0 to create, 1 to change, 1 to delete, 2 unchanged\n"
    );
    assert_eq!(epoch(&root), 4);
    assert_eq!(cli(url, &token, &["export"]).stdout, e1.stdout);
    // Without --prune the missing quota is left alone.
    let o = cli(url, &token, &["apply", second, "--dry-run"]);
    assert!(
        o.stdout.contains("(1 quota on the root but not in the file left alone"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.ends_with("0 to create, 1 to change, 0 to delete, 2 unchanged\n"));
    // --prune applies both in one batch.
    let o = cli(url, &token, &["apply", second, "--prune"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.ends_with("applied: 2 quotas written, epoch 6\n"), "{}", o.stdout);
    assert_eq!(parsed(&cli(url, &token, &["export"]).stdout), parsed(SECOND));

    // What only the root can check (the parent exists) comes back as its message.
    let orphan = file(
        dir.path(),
        "orphan.yaml",
        "quotas:\n  s3_x: {limit: 1, low_burst: 1, high_burst: 2, parent: ghost}\n",
    );
    let o = cli(url, &token, &["apply", orphan.to_str().unwrap()]);
    assert!(!o.ok);
    assert!(o.stdout.contains("+ s3_x"), "the plan is shown before the write: {}", o.stdout);
    assert!(
        o.stderr.contains("answered 422 Unprocessable Entity: item 0: parent \"ghost\" of quota \"s3_x\" does not exist"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert_eq!(epoch(&root), 6);
}

/// A root that needs a token, with [`FIRST`] applied (4 quotas, epoch 4).
fn root_with_first() -> (tempfile::TempDir, PathBuf, Root) {
    let dir = tempfile::tempdir().unwrap();
    let token = write_token(dir.path(), "admin", "s3cret\n");
    let root = Root::start(&["--admin-token-file", token.to_str().unwrap()]);
    let first = file(dir.path(), "first.yaml", FIRST);
    let o = cli(&root.url(), &token, &["apply", first.to_str().unwrap()]);
    assert!(o.ok, "{}", o.stderr);
    (dir, token, root)
}

#[test]
fn a_refused_prune_changes_nothing() {
    let (dir, token, root) = root_with_first();
    let url = root.url();
    // A file that drops s3 but keeps its child: the deletes and the write of `new` are one
    // batch, and the root refuses all of it.
    let bad = file(
        dir.path(),
        "bad.yaml",
        "quotas:\n  api_all: {limit: 10000, low_burst: 10000, high_burst: 20000}\n  \
         api_key_*: {limit: 10, low_burst: 10, high_burst: 20, parent: api_all}\n  \
         new: {limit: 1, low_burst: 0, high_burst: 0}\n  \
         s3_get: {limit: 10, low_burst: 20, high_burst: 40, parent: s3}\n",
    );
    let o = cli(&url, &token, &["apply", bad.to_str().unwrap(), "--prune"]);
    assert!(!o.ok);
    assert!(o.stdout.contains("+ new") && o.stdout.contains("- s3\n"), "{}", o.stdout);
    assert!(
        o.stderr.contains("409 Conflict: item 1: quota \"s3\" is the parent of \"s3_get\""),
        "{}",
        o.stderr
    );
    assert_eq!(epoch(&root), 4);
    assert_eq!(parsed(&cli(&url, &token, &["export"]).stdout), parsed(FIRST));
}

#[test]
fn bad_files_and_tokens_fail_clearly_and_change_nothing() {
    let (dir, token, root) = root_with_first();
    let url = root.url();
    let first = dir.path().join("first.yaml");

    let cases = [
        ("dup.yaml", "quotas:\n  a: {limit: 1, low_burst: 1, high_burst: 2}\n  a: {limit: 2, low_burst: 1, high_burst: 2}\n", "quota \"a\" appears twice"),
        ("unknown.yaml", "quotas:\n  a: {limit: 1, low_burst: 1, high_burst: 2, lowburst: 3}\n", "quotas.a: unknown field `lowburst`"),
        ("limit.yaml", "quotas:\n  a: {limit: 0, low_burst: 1, high_burst: 2}\n", "quota \"a\": limit must be a number from 0.001"),
    ];
    for (name, text, want) in cases {
        let p = file(dir.path(), name, text);
        let o = cli(&url, &token, &["apply", p.to_str().unwrap()]);
        assert!(!o.ok, "{name}: {}", o.stdout);
        assert!(o.stdout.is_empty(), "{name}: {}", o.stdout);
        assert!(
            o.stderr.contains(&format!("{}: ", p.display())) && o.stderr.contains(want),
            "{name}: {}",
            o.stderr
        );
    }
    // An empty file (a failed `export > q.yaml` leaves one) is refused, not read as "no
    // quotas": with --prune that would delete every quota.
    let empty = file(dir.path(), "empty.yaml", "");
    let o = cli(&url, &token, &["apply", empty.to_str().unwrap(), "--prune"]);
    assert!(!o.ok && o.stdout.is_empty(), "{}", o.stdout);
    assert!(o.stderr.contains("the file is empty"), "{}", o.stderr);
    let o = cli(&url, &token, &["apply", "/nonexistent.yaml"]);
    assert!(!o.ok && o.stderr.contains("reading /nonexistent.yaml"), "{}", o.stderr);

    let wrong = write_token(dir.path(), "wrong", "nope\n");
    let o = cli(&url, &wrong, &["apply", first.to_str().unwrap()]);
    assert!(!o.ok);
    assert!(o.stderr.contains("answered 401 Unauthorized: wrong bearer token"), "{}", o.stderr);
    let o = cli(&url, &wrong, &["export"]);
    assert!(!o.ok && o.stdout.is_empty() && o.stderr.contains("401"), "{}", o.stderr);

    let free = format!("http://127.0.0.1:{}", common::process::free_port());
    let o = cli(&free, &token, &["export"]);
    assert!(
        !o.ok && o.stderr.contains(&format!("cannot reach the root at {free}")),
        "{}",
        o.stderr
    );
    assert_eq!(epoch(&root), 4);
}

/// With `--prefix`, a file speaks for the quotas under it only: `--prune` deletes there and
/// nowhere else, and a file listing a quota outside it is refused before anything is sent.
#[test]
fn apply_with_a_prefix_touches_only_that_prefix() {
    let (dir, token, root) = root_with_first();
    let url = root.url();
    // What `export --prefix s3` writes, with s3_get dropped and s3 changed.
    let o = cli(&url, &token, &["export", "--prefix", "s3"]);
    assert!(o.ok && o.stdout.contains("--prefix s3") && !o.stdout.contains("api_all"));
    let s3 = file(
        dir.path(),
        "s3.yaml",
        "quotas:\n  s3: {limit: 50, low_burst: 100, high_burst: 200}\n",
    );
    let args = ["apply", s3.to_str().unwrap(), "--prune", "--prefix", "s3"];
    let o = cli(&url, &token, &args);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("- s3_get") && o.stdout.contains("~ s3"), "{}", o.stdout);
    assert!(
        !o.stdout.contains("api_"),
        "quotas outside the prefix are not in the plan: {}",
        o.stdout
    );
    let left = parsed(&cli(&url, &token, &["export"]).stdout);
    assert_eq!(left.keys().cloned().collect::<Vec<_>>(), ["api_all", "api_key_*", "s3"]);
    // Without the prefix the same file would delete api_*: the dry run says so.
    let o = cli(&url, &token, &["apply", s3.to_str().unwrap(), "--prune", "--dry-run"]);
    assert!(o.ok && o.stdout.contains("- api_all"), "{}", o.stdout);

    let before = epoch(&root);
    let outside = file(
        dir.path(),
        "outside.yaml",
        "quotas:\n  s3: {limit: 50, low_burst: 100, high_burst: 200}\n  \
         api_all: {limit: 1, low_burst: 1, high_burst: 2}\n",
    );
    let o = cli(&url, &token, &["apply", outside.to_str().unwrap(), "--prune", "--prefix", "s3"]);
    assert!(!o.ok && o.stdout.is_empty(), "{}", o.stdout);
    assert!(
        o.stderr.contains(&format!(
            "{}: quota \"api_all\" is outside --prefix \"s3\"",
            outside.display()
        )),
        "{}",
        o.stderr
    );
    assert_eq!(epoch(&root), before);
}

/// An `https` root with a private CA: `--ca-file` trusts it, the system's CAs do not, and a
/// file that is no CA is named.
#[test]
fn an_https_root_is_checked_against_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/make-test-ca.sh");
    let out = Command::new(script).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = write_token(dir.path(), "admin", "s3cret\n");
    let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    let root = Root::start(&[
        "--admin-token-file",
        token.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let url = format!("https://{}", root.addr);
    let first = file(dir.path(), "first.yaml", FIRST);
    let ca = dir.path().join("ca.pem");
    let o =
        cli(&url, &token, &["apply", first.to_str().unwrap(), "--ca-file", ca.to_str().unwrap()]);
    assert!(o.ok, "{}", o.stderr);
    let o = cli(&url, &token, &["export", "--ca-file", ca.to_str().unwrap()]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(parsed(&o.stdout), parsed(FIRST));

    let o = cli(&url, &token, &["export"]);
    assert!(!o.ok && o.stderr.contains(&format!("cannot reach the root at {url}")), "{}", o.stderr);
    let o = cli(&url, &token, &["export", "--ca-file", token.to_str().unwrap()]);
    assert!(
        !o.ok
            && o.stderr
                .contains(&format!("the CA file {} holds no PEM certificate", token.display())),
        "{}",
        o.stderr
    );
}
