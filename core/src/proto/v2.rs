//! Protocol v2: the binary encoding of the sync messages (`application/x-yarl-sync+v2`).
//!
//! The messages mean exactly what their JSON (v1) form means; only the bytes differ. The
//! byte layout is written out in `docs/sync-protocol.md` ("Protocol v2") so that a third
//! party can implement it without this crate; in short, every message is a sequence of
//! fields in a fixed order in the [postcard] wire format (version 1, a stable, documented
//! format): unsigned integers are LEB128 varints, signed ones zigzag varints, a list is its
//! length as a varint followed by its items, a string is a list of UTF-8 bytes, an option
//! is a byte `0` or `1` followed by the value, a bool is a byte `0` or `1`.
//!
//! Quota ids in every list are sent as the signed difference to the previous item's id of
//! the same list (the first to 0), wrapping, so any id and any order round-trip exactly,
//! and sorted ids (what limiters and roots send) take one or two bytes each instead of the
//! id's full width. Quota epochs in an answer are sent the same way.
//!
//! # Why postcard
//!
//! It is serde-native (the messages already derive serde, no code generation, no `protoc`
//! at build time), its wire format is frozen and specified (postcard 1.0), integers are
//! varints by default, and it has no dependencies beyond serde. Protocol buffers (prost)
//! would have given a schema file too, but needs generated or hand-annotated types, and
//! its packed repeated fields of tuples would need one field per column.
//!
//! # Hostile input
//!
//! [`decode_request`] and [`decode_response`] never allocate more than the body could
//! describe: each list's declared length is checked against the bytes left (every item
//! takes at least one byte) and against a caller's entry budget *before* its items are
//! allocated, varints longer than their type are refused, and every error names the field
//! where it happened. Bytes after the last known field are ignored, so fields can be
//! appended later without a new version.

use super::{SyncRequest, SyncResponse};
use crate::quota::{QuotaId, QuotaUpdate};
use crate::shard::Shard;
use serde::Serialize;

// The serializers and the bounded decoder live apart so each can be read whole; the
// decoder's state stays private to its file, so the public functions below only hand over.
mod decode;
mod encode;

/// The content type of protocol v2 bodies, requests and answers.
pub const CONTENT_TYPE: &str = "application/x-yarl-sync+v2";

/// The first byte of every v2 message.
pub const WIRE_VERSION: u8 = 2;

/// Why a v2 body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The first byte is not [`WIRE_VERSION`].
    #[error("unsupported v2 wire version {0}, this side speaks 2")]
    Version(u8),
    /// The body is not valid at `field`.
    #[error("bad v2 body at {field}: {why}")]
    Malformed {
        /// Where: `limiter`, `batches[].deltas`, `counters`, ...
        field: &'static str,
        /// What: `truncated`, `varint longer than 64 bits`, ...
        why: &'static str,
    },
    /// The lists declare more entries than the caller accepts.
    #[error("request carries {0} entries (deltas + hints + batches), the maximum is {1}")]
    TooLarge(usize, usize),
}

/// Borrowed parts of an answer, so a root can encode quotas it shares with its table
/// (`Arc<QuotaUpdate>`) without copying them.
#[derive(Debug, Clone, Copy)]
pub struct ResponseParts<'a, Q> {
    /// See [`SyncResponse::root_instance`].
    pub root_instance: u64,
    /// See [`SyncResponse::acked_seq`].
    pub acked_seq: u64,
    /// See [`SyncResponse::version`].
    pub version: u64,
    /// See [`SyncResponse::epoch`].
    pub epoch: u64,
    /// See [`SyncResponse::more`].
    pub more: bool,
    /// See [`SyncResponse::counters`]; sorting them by id makes the answer smaller.
    pub counters: &'a [(QuotaId, u64, u64)],
    /// See [`SyncResponse::quotas`].
    pub quotas: &'a [Q],
    /// See [`SyncResponse::shard`].
    pub shard: Option<Shard>,
    /// See [`SyncResponse::root_epoch`].
    pub root_epoch: Option<u64>,
    /// See [`SyncResponse::key_secret`].
    pub key_secret: Option<(u64, u64)>,
    /// See [`SyncResponse::limiters`].
    pub limiters: Option<u32>,
    /// See [`SyncResponse::grants`].
    pub grants: &'a [crate::proto::InFlightGrant],
}

fn to_vec(v: &impl Serialize) -> Vec<u8> {
    // Serialising into a Vec cannot fail: no custom errors, every length is known.
    postcard::to_allocvec(v).unwrap_or_default()
}

/// Encodes a request.
pub fn encode_request(r: &SyncRequest) -> Vec<u8> {
    to_vec(&encode::RequestWire(r))
}

/// Encodes an answer from its parts.
pub fn encode_response_parts<Q: AsRef<QuotaUpdate>>(parts: ResponseParts<'_, Q>) -> Vec<u8> {
    to_vec(&encode::ResponseWire(parts))
}

/// Encodes an answer.
pub fn encode_response(r: &SyncResponse) -> Vec<u8> {
    struct Own<'a>(&'a QuotaUpdate);
    impl AsRef<QuotaUpdate> for Own<'_> {
        fn as_ref(&self) -> &QuotaUpdate {
            self.0
        }
    }
    let quotas: Vec<Own<'_>> = r.quotas.iter().map(Own).collect();
    encode_response_parts(ResponseParts {
        root_instance: r.root_instance,
        acked_seq: r.acked_seq,
        version: r.version,
        epoch: r.epoch,
        more: r.more,
        counters: &r.counters,
        quotas: &quotas,
        shard: r.shard,
        root_epoch: r.root_epoch,
        key_secret: r.key_secret,
        limiters: r.limiters,
        grants: &r.grants,
    })
}

/// Decodes a request with at most `max_entries` deltas + hints + batches.
pub fn decode_request(body: &[u8], max_entries: usize) -> Result<SyncRequest, DecodeError> {
    decode::decode_request(body, max_entries)
}

/// Decodes an answer with at most `max_entries` counters + quotas.
pub fn decode_response(body: &[u8], max_entries: usize) -> Result<SyncResponse, DecodeError> {
    decode::decode_response(body, max_entries)
}
