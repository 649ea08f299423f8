//! The command line, and the grid of points it selects.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use yarl_core::proto::{v2, SyncRequest, SyncResponse};

#[derive(Debug, Parser)]
#[command(about = "Capacity of yarl-root: N limiters syncing, v1 vs v2, 1 vs 2 shards")]
pub(crate) struct Args {
    /// The yarl-root binary (a release build).
    #[arg(long, default_value = "target/release/yarl-root")]
    pub(crate) root_bin: PathBuf,
    /// Where the quota database is built and kept between runs.
    #[arg(long, default_value = "target/bench-root")]
    pub(crate) dir: PathBuf,
    /// Quotas loaded.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) quotas: u64,
    /// Changed counters per limiter per interval.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) counters: usize,
    /// Seconds measured per grid point, after the warm-up.
    #[arg(long, default_value_t = 8)]
    pub(crate) seconds: u64,
    /// Seconds of warm-up before measuring (default: 3 intervals; 12 s for answers by
    /// interest, the root's interest time of 10 s and two intervals, until the maps a root
    /// keeps per session have grown to their steady size: their growth, a few resizes of
    /// million-entry tables under the root's lock, is a start-up cost, not a per-sync one).
    #[arg(long)]
    pub(crate) warm_up: Option<u64>,
    /// Sync interval, ms.
    #[arg(long, default_value_t = 1000)]
    pub(crate) interval_ms: u64,
    /// Timeout of one sync call, ms (the agent's default).
    #[arg(long, default_value_t = 500)]
    pub(crate) timeout_ms: u64,
    /// The big grid: 50, 300 and 1,000 limiters, v1, v2 and v2 by interest, 1 and 2 shards.
    #[arg(long)]
    pub(crate) full: bool,
    /// Only these limiter counts (comma-separated), instead of the grid's.
    #[arg(long, value_delimiter = ',')]
    pub(crate) limiters: Vec<usize>,
    /// Draw the changed counters from the first K quotas only (default: all of them, the
    /// worst case: limiters barely overlap, so the cluster changes about limiters × 1,000
    /// distinct counters per interval). A smaller K models limiters that see the same hot
    /// keys, as behind a load balancer.
    #[arg(long)]
    pub(crate) key_space: Option<u64>,
    /// Only these protocols (comma-separated: v1, v2, interest), instead of all three.
    #[arg(long, value_delimiter = ',')]
    pub(crate) protocols: Vec<String>,
    /// Only these shard counts (comma-separated: 1, 2), instead of both.
    #[arg(long, value_delimiter = ',')]
    pub(crate) shards: Vec<u32>,
    /// Stripes of each root (`yarl-root --stripes`; comma-separated: each is a grid point).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub(crate) stripes: Vec<u32>,
    /// First port of the roots.
    #[arg(long, default_value_t = 17_700)]
    pub(crate) port: u16,
}

impl Args {
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// `--warm-up`, or its default for `proto` (see the flag).
    pub(crate) fn warm_up(&self, proto: Proto) -> Duration {
        let interval = self.interval();
        self.warm_up.map_or_else(
            || match proto {
                Proto::V2Interest => (interval * 2).max(Duration::from_secs(12)),
                Proto::V1 | Proto::V2 => interval * 3,
            },
            Duration::from_secs,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    V1,
    V2,
    /// v2 with answers by interest (`SyncRequest::interest`).
    V2Interest,
}

impl Proto {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Proto::V1 => "v1 JSON",
            Proto::V2 => "v2",
            Proto::V2Interest => "v2 by interest",
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Proto::V1 => "application/json",
            Proto::V2 | Proto::V2Interest => v2::CONTENT_TYPE,
        }
    }

    pub(crate) fn encode(self, r: &SyncRequest) -> Vec<u8> {
        match self {
            Proto::V1 => serde_json::to_vec(r).unwrap_or_default(),
            Proto::V2 | Proto::V2Interest => v2::encode_request(r),
        }
    }

    /// `(root_instance, acked_seq, version)` without decoding the counters: the simulated
    /// limiters only need these, and the load generator must not spend its CPU (shared
    /// with the roots) on parsing what the probe measures.
    pub(crate) fn header(self, body: &[u8]) -> Option<(u64, u64, u64)> {
        match self {
            Proto::V2 | Proto::V2Interest => {
                let ((_, inst, acked, version), _) =
                    postcard::take_from_bytes::<(u8, u64, u64, u64)>(body).ok()?;
                Some((inst, acked, version))
            }
            // The root writes these fields first: `{"v":1,"root_instance":…,"acked_seq":…,"version":…`.
            Proto::V1 => {
                let head = std::str::from_utf8(&body[..body.len().min(200)]).ok()?;
                let field = |name: &str| -> Option<u64> {
                    let at = head.find(&format!("\"{name}\":"))? + name.len() + 3;
                    let digits: String =
                        head[at..].chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                };
                Some((field("root_instance")?, field("acked_seq")?, field("version")?))
            }
        }
    }

    pub(crate) fn decode(self, body: &[u8]) -> Result<SyncResponse, String> {
        match self {
            Proto::V1 => serde_json::from_slice(body).map_err(|e| e.to_string()),
            Proto::V2 | Proto::V2Interest => {
                v2::decode_response(body, usize::MAX).map_err(|e| e.to_string())
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Point {
    pub(crate) proto: Proto,
    pub(crate) shards: u32,
    pub(crate) stripes: u32,
    pub(crate) limiters: usize,
}

/// The points to measure, in order.
pub(crate) fn grid(args: &Args) -> Vec<Point> {
    let limiter_counts: Vec<usize> = if !args.limiters.is_empty() {
        args.limiters.clone()
    } else if args.full {
        vec![50, 300, 1000]
    } else {
        vec![50, 300]
    };
    let mut grid = Vec::new();
    let shard_counts = if args.shards.is_empty() { vec![1, 2] } else { args.shards.clone() };
    for &shards in &shard_counts {
        for &limiters in &limiter_counts {
            for proto in [Proto::V1, Proto::V2, Proto::V2Interest] {
                let key = match proto {
                    Proto::V1 => "v1",
                    Proto::V2 => "v2",
                    Proto::V2Interest => "interest",
                };
                if !args.protocols.is_empty() && !args.protocols.iter().any(|p| p == key) {
                    continue;
                }
                // v1 is for debugging and old limiters: measured unsharded only, unless
                // the big grid asks for everything.
                if proto == Proto::V1 && shards > 1 && !args.full {
                    continue;
                }
                for &stripes in &args.stripes {
                    grid.push(Point { proto, shards, stripes, limiters });
                }
            }
        }
    }
    grid
}
