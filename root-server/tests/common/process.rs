//! A real `yarl-root` process on a free loopback port, killed when dropped.

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub struct Root {
    pub child: Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub stderr: PathBuf,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn write_token(dir: &Path, name: &str, token: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, token).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    p
}

impl Root {
    /// Starts the root with `args` (plus `--listen` and `--db` unless given) and waits until
    /// `/healthz` answers (plain HTTP) or the port accepts (HTTPS).
    pub fn start(args: &[&str]) -> Root {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let db = format!("sqlite://{}", dir.path().join("yarl.db").display());
        let stderr = dir.path().join("stderr.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_yarl-root"));
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env("RUST_LOG", "warn,yarl_root=info")
            // The log goes to stdout, errors before it starts to stderr: keep both.
            .stdout(std::fs::File::create(&stderr).unwrap())
            .stderr(std::fs::OpenOptions::new().append(true).open(&stderr).unwrap());
        for k in ["LISTEN", "DB", "POLL_INTERVAL", "ADMIN_TOKEN_FILE", "SYNC_TOKEN_FILE"] {
            cmd.env_remove(format!("YARL_{k}"));
        }
        if !args.contains(&"--listen") {
            cmd.args(["--listen", &addr]);
        }
        if !args.contains(&"--db") {
            cmd.args(["--db", &db]);
        }
        let child = cmd.spawn().unwrap();
        let mut root = Root { child, addr, dir, stderr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&root.addr).is_err() {
            if let Some(st) = root.child.try_wait().unwrap() {
                panic!("yarl-root exited with {st}: {}", root.log());
            }
            assert!(Instant::now() < deadline, "yarl-root did not start: {}", root.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The port came from `free_port` and may have been taken meanwhile by another
        // test's root, which then answered the connect above while this one failed to
        // bind and exits: seen once in CI as "Connection refused" a moment later. A root
        // that is still running after a short wait is the one listening.
        std::thread::sleep(Duration::from_millis(150));
        if let Some(st) = root.child.try_wait().unwrap() {
            let log = root.log();
            assert!(
                !args.contains(&"--listen") && log.contains("in use"),
                "yarl-root exited with {st}: {log}"
            );
            return Root::start(args);
        }
        root
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (current, peak) resident set size in KiB.
    pub fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([&format!("-{sig}"), &self.pid().to_string()]).status();
        assert!(ok.unwrap().success());
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
