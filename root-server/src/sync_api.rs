//! `POST /v1/sync`: the limiter ↔ root exchange (wire format: `docs/sync-protocol.md`).
//!
//! A sync goes through three bounded steps before the root's lock is taken:
//!
//! 1. **Admission**: a memory budget sized from the declared `Content-Length` (body plus
//!    what decoding it may allocate), then a concurrency slot; either waits a moment and
//!    then answers `503` with `Retry-After`.
//! 2. **Body**: read within [`SYNC_BODY_TIMEOUT`]; a declared length over the limit is
//!    refused before reading, a streamed one is cut at the limit.
//! 3. **Decode, apply, encode** on a blocking thread, never on the async workers that
//!    answer everyone else: [`SyncEncoding::decode`] (the only step that depends on the
//!    content type: JSON for protocol v1, binary for v2), then the core's
//!    `RootState::sync_from` under the lock of each stripe in turn, then the answer is
//!    encoded after the locks are released (quotas are shared with the root's table, not
//!    copied under a lock).

use crate::error::ApiError;
use crate::guard::{declared_length, read_body_paced};
use crate::AppState;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use yarl_core::proto::v2::{self, DecodeError};
use yarl_core::proto::{SyncError, SyncRequest};
use yarl_core::root::SyncAnswer;

/// Deadline for a whole sync body: 64 MiB in 10 s is 6.4 MB/s, far below any LAN.
pub const SYNC_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes a decoded JSON request may take per body byte, at most: `[1,1,1],` is 8 bytes of
/// JSON and 24 in memory, and a vector may hold twice its length while it grows.
const JSON_DECODE_FACTOR: u64 = 6;
/// The same for v2: an entry takes at least 3 bytes and 24 in memory, and lists are
/// allocated at their declared length (checked against the bytes left), never grown.
const V2_DECODE_FACTOR: u64 = 8;

/// The wire encodings of a sync request and its answer; the answer uses the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncEncoding {
    /// `application/json`: protocol v1.
    JsonV1,
    /// `application/x-yarl-sync+v2`: protocol v2, binary (`yarl_core::proto::v2`).
    BinaryV2,
}

/// Commas a JSON request's entry may take: a delta `[id,units,demand]` has two, the comma
/// after it a third, and a batch or hint one more of its own.
const JSON_COMMAS_PER_ENTRY: usize = 4;

impl SyncEncoding {
    /// The encoding a request's `Content-Type` names. No content type means JSON, as curl
    /// and old limiters send it.
    pub fn from_content_type(ct: Option<&HeaderValue>) -> Result<Self, ApiError> {
        let Some(ct) = ct else { return Ok(SyncEncoding::JsonV1) };
        let essence = ct.to_str().unwrap_or("").split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/json") || essence.is_empty() {
            Ok(SyncEncoding::JsonV1)
        } else if essence.eq_ignore_ascii_case(v2::CONTENT_TYPE) {
            Ok(SyncEncoding::BinaryV2)
        } else {
            Err(ApiError::UnsupportedMediaType(essence.chars().take(100).collect()))
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            SyncEncoding::JsonV1 => "application/json",
            SyncEncoding::BinaryV2 => v2::CONTENT_TYPE,
        }
    }

    fn decode_factor(self) -> u64 {
        match self {
            SyncEncoding::JsonV1 => JSON_DECODE_FACTOR,
            SyncEncoding::BinaryV2 => V2_DECODE_FACTOR,
        }
    }

    /// Decodes a request, refusing one with more than `max_entries` entries before it
    /// allocates them.
    pub fn decode(self, body: &[u8], max_entries: usize) -> Result<SyncRequest, ApiError> {
        match self {
            SyncEncoding::JsonV1 => {
                // Every delta, hint and batch opens one '[' (plus the two outer lists), so
                // counting them bounds those entries before serde builds them; the ids of
                // `watch` open none, but every value of a list but its last is followed by
                // ',': a delta or hint takes at most JSON_COMMAS_PER_ENTRY, so a body with
                // more commas than that many per entry holds too many values of some list.
                // Objects are the request, its batches and its concurrency reports, each an
                // entry too. Brackets and commas inside strings only make the counts larger.
                let (brackets, braces, commas) =
                    body.iter().fold((0usize, 0usize, 0usize), |(b, o, c), &x| {
                        (
                            b + usize::from(x == b'['),
                            o + usize::from(x == b'{'),
                            c + usize::from(x == b','),
                        )
                    });
                if brackets > max_entries.saturating_add(2)
                    || braces > max_entries.saturating_add(1)
                {
                    return Err(ApiError::Sync(SyncError::TooLarge(
                        brackets.saturating_sub(2).max(braces.saturating_sub(1)),
                        max_entries,
                    )));
                }
                let most_commas =
                    max_entries.saturating_mul(JSON_COMMAS_PER_ENTRY).saturating_add(64);
                if commas > most_commas {
                    return Err(ApiError::Sync(SyncError::TooLarge(
                        commas / JSON_COMMAS_PER_ENTRY,
                        max_entries,
                    )));
                }
                // The plain decoder is the fast one; a body it refuses is decoded again to
                // name where the error is (`batches[0].deltas[3]: invalid value ...`).
                serde_json::from_slice(body).map_err(|e| {
                    match crate::error::parse_json::<SyncRequest>(body) {
                        Err(named) => named,
                        // The same decoder cannot accept it; if it ever did, still refused.
                        Ok(_) => crate::error::bad_json(e.to_string()),
                    }
                })
            }
            // Every list's length is checked against the bytes left and the entry budget
            // before it is allocated (see the v2 module docs).
            SyncEncoding::BinaryV2 => v2::decode_request(body, max_entries).map_err(|e| match e {
                DecodeError::TooLarge(n, max) => ApiError::Sync(SyncError::TooLarge(n, max)),
                e => ApiError::BadV2(e),
            }),
        }
    }

    pub fn encode(self, mut answer: SyncAnswer) -> Result<Vec<u8>, ApiError> {
        // Ids sorted (each costs v2 one or two bytes as a difference to the previous) and
        // each once.
        answer.tidy();
        match self {
            SyncEncoding::JsonV1 => serde_json::to_vec(&answer)
                .map_err(|e| ApiError::Internal(format!("sync answer: {e}"))),
            SyncEncoding::BinaryV2 => Ok(v2::encode_response_parts(v2::ResponseParts {
                root_instance: answer.root_instance,
                acked_seq: answer.acked_seq,
                version: answer.version,
                epoch: answer.epoch,
                more: answer.more,
                counters: &answer.counters,
                quotas: &answer.quotas,
                shard: answer.shard,
                root_epoch: Some(answer.root_epoch),
                key_secret: answer.key_secret,
                limiters: Some(answer.limiters),
                grants: &answer.grants,
            })),
        }
    }
}

/// KiB of the sync memory budget a body of `len` bytes in `encoding` takes.
pub(crate) fn memory_cost(len: u64, max_entries: usize, encoding: SyncEncoding) -> u32 {
    let decoded = (len.saturating_mul(encoding.decode_factor())).min(max_entries as u64 * 48);
    u32::try_from(len.saturating_add(decoded).div_ceil(1024).max(1)).unwrap_or(u32::MAX)
}

pub(crate) async fn sync(State(st): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let (parts, body): (_, Body) = req.into_parts();
    let encoding = SyncEncoding::from_content_type(parts.headers.get(header::CONTENT_TYPE))?;
    let limit = crate::SYNC_BODY_LIMIT;
    let max_entries = st.0.settings.root.max_entries;
    let declared = declared_length(&parts.headers).unwrap_or(limit as u64).min(limit as u64);
    let guards = &st.0.guards;
    let memory = guards.sync_memory.enter_n(memory_cost(declared, max_entries, encoding)).await?;
    // The turn to decode only once the body is in, and the body at a pace: a request that
    // declares a body and stalls holds no turn, and its memory for about a second.
    let body = read_body_paced(&parts.headers, body, limit, SYNC_BODY_TIMEOUT).await?;
    let slot = guards.sync.enter().await?;

    let work = st.clone();
    let (bytes, waited, took) = tokio::task::spawn_blocking(move || {
        // The permits live as long as the work, not the request: a limiter that gives up
        // (its timeout) drops the request, but the decode, apply and encode it started go
        // on, and must keep counting against the memory and concurrency bounds, or an
        // overloaded root would pile up abandoned work without limit.
        let _held = (memory, slot);
        let started = Instant::now();
        let waited = started - arrived;
        let req = encoding.decode(&body, max_entries)?;
        drop(body);
        let now = work.now();
        let answer = work.sync(&req, peer, now).map_err(ApiError::Sync)?;
        drop(req);
        let bytes = encoding.encode(answer)?;
        Ok::<_, ApiError>((bytes, waited, started.elapsed()))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("sync worker: {e}")))??;
    st.0.metrics.sync_done(waited, took);
    Ok(([(header::CONTENT_TYPE, encoding.content_type())], bytes).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `watch` list opens one bracket whatever its length: its ids are bounded by the
    /// commas before serde allocates them.
    #[test]
    fn json_watch_ids_are_bounded_before_decoding() {
        let ids = vec!["1"; 1000].join(",");
        let body = format!(r#"{{"v":1,"limiter":"a","interest":true,"watch":[{ids}]}}"#);
        match SyncEncoding::JsonV1.decode(body.as_bytes(), 100) {
            Err(ApiError::Sync(SyncError::TooLarge(n, 100))) => assert!(n >= 200, "{n}"),
            other => panic!("{other:?}"),
        }
        // Within the budget it decodes, and so does a full budget of deltas.
        assert_eq!(SyncEncoding::JsonV1.decode(body.as_bytes(), 1000).unwrap().watch.len(), 1000);
        let deltas = vec!["[1,2,3]"; 100].join(",");
        let body =
            format!(r#"{{"v":1,"limiter":"a","batches":[{{"seq":1,"deltas":[{deltas}]}}]}}"#);
        assert!(SyncEncoding::JsonV1.decode(body.as_bytes(), 101).is_ok());
    }
}
