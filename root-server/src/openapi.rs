//! The OpenAPI 3.1 document of the admin API, generated from the handlers' annotations and
//! the request and response types themselves so it cannot drift from what the server does.
//! Served without a token at `GET /v1/openapi.json`: it describes the public contract only,
//! like `/healthz` it reveals nothing about the quotas.
//!
//! `POST /v1/sync` is left out: it is the limiters' binary protocol, not an admin route
//! (docs/sync-protocol.md describes it); so is `GET /v1/copy`, roots' own exchange when one
//! restarts (the same document, "After a root restart").

use crate::admin;
use crate::error::ErrorBody;
use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

/// One byte of a name: a character of the set, or `%XX` for a byte outside it. Escaping a
/// byte of the set is refused (one key, one name), hence the holes in the hex ranges.
macro_rules! unit {
    ($two:literal) => {
        concat!("(?:[A-Za-z0-9._:@-]|%(?:[0189A-F][0-9A-F]|2[", $two, "]|3[B-F]|5[B-E]|60|7[B-F]))")
    };
}
/// The names `yarl_core::validate_name` accepts: 1–255 bytes once unescaped, a final `*`
/// counting as one, and a name that is no template may not end in an escaped `*` (`%2A`).
macro_rules! name_body {
    () => {
        concat!(unit!("0-9A-CF"), "{0,254}", unit!("0-9BCF"), "|", unit!("0-9A-CF"), "{1,254}\\*")
    };
}
pub(crate) const NAME_PATTERN: &str = concat!("^(?:", name_body!(), ")$");
const PREFIX_PATTERN: &str = concat!("^(?:", name_body!(), ")?$");
/// 255 bytes, each escaped.
const NAME_MAX_LENGTH: usize = 3 * yarl_core::quota::MAX_NAME_LEN;

/// A quota name, as [`yarl_core::validate_name`] defines it.
pub(crate) struct QuotaName;

impl PartialSchema for QuotaName {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(NAME_MAX_LENGTH))
            .pattern(Some(NAME_PATTERN))
            .description(Some(
                "1 to 255 bytes of A-Z a-z 0-9 . _ : @ -, where %XX (two upper-case hex \
                 digits) stands for any other byte (%25 for % itself; escaping a byte that needs none is \
                 refused). A final * makes a template: it limits every name that starts with \
                 the rest and has no quota of its own, each with a bucket of its own.",
            ))
            .examples(["s3_bucket-1.read", "api_key_*", "ip_%7F%00%00%01"])
            .into()
    }
}

impl ToSchema for QuotaName {}

/// The `prefix` of `GET /v1/quotas`: empty, or a valid name.
pub(crate) struct NamePrefix;

impl PartialSchema for NamePrefix {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(NAME_MAX_LENGTH))
            .pattern(Some(PREFIX_PATTERN))
            .description(Some("Only names that start with this; empty or a valid quota name."))
            .into()
    }
}

impl ToSchema for NamePrefix {}

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "The admin token: the contents of the file given to --admin-token-file.",
            ))
            .build();
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("admin_token", SecurityScheme::Http(scheme));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "YARL root admin API",
        description = "Quotas of the YARL distributed rate limiter: create, read, list, reset \
                       and delete them. Numbers are in units (a request weighs 1 unless \
                       configured otherwise): `limit` per second, bursts in units. Every error \
                       is `{\"error\": \"…\"}`.",
        license(name = "Apache-2.0"),
    ),
    paths(
        admin::list,
        admin::batch,
        admin::put,
        admin::get,
        admin::delete,
        admin::action,
        crate::healthz,
        crate::metrics,
        crate::openapi_json,
    ),
    // The name schemas too: parameters refer to them, and only body types are collected.
    components(schemas(ErrorBody, QuotaName, NamePrefix)),
    modifiers(&Security),
)]
struct ApiDoc;

/// The document as served, rendered once.
pub(crate) fn json() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
        camel_case_links(&mut doc);
        rate_or_in_flight(&mut doc);
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    })
}

/// utoipa 5 writes a link's fields in snake case (`operation_id`), which no OpenAPI tool
/// reads, so schemathesis would see links to nowhere.
/// A quota written has a rate (`limit`) or a cap on requests in flight
/// (`max_in_flight`), and the fields of a rate only with a rate: what the serde structs
/// cannot say (`limit` is optional there for the second case), said as `anyOf`. Null is
/// what the server takes for absent, so a rate field may be null beside `max_in_flight`.
fn rate_or_in_flight(doc: &mut serde_json::Value) {
    let rule = serde_json::json!([
        {"required": ["limit"], "properties": {"limit": {"type": "number"}}},
        {
            "required": ["max_in_flight"],
            "properties": {
                "max_in_flight": {"type": "integer"},
                "per": {"type": "null"},
                "low_burst": {"type": "null"},
                "high_burst": {"type": "null"}
            }
        }
    ]);
    for name in ["QuotaBody", "BatchWrite"] {
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            schema["anyOf"] = rule.clone();
        }
    }
}

fn camel_case_links(doc: &mut serde_json::Value) {
    let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) else { return };
    let responses = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|op| op.get_mut("responses")?.as_object_mut())
        .flat_map(|r| r.values_mut());
    for response in responses {
        let Some(links) = response.get_mut("links").and_then(|l| l.as_object_mut()) else {
            continue;
        };
        for link in links.values_mut().filter_map(|l| l.as_object_mut()) {
            for (snake, camel) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(v) = link.remove(snake) {
                    link.insert(camel.to_owned(), v);
                }
            }
        }
    }
}
