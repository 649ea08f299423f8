//! Quotas as code: `yarl-root quotas export` and `yarl-root quotas apply`.
//!
//! A quota tree lives in a YAML file, names as keys so that a review diff shows one quota
//! per hunk:
//!
//! ```yaml
//! quotas:
//!   api_all:
//!     limit: 10000.0
//!     low_burst: 10000.0
//!     high_burst: 20000.0
//!   api_key_*:
//!     limit: 10.0
//!     low_burst: 10.0
//!     high_burst: 20.0
//!     parent: api_all
//! ```
//!
//! Export pages through `GET /v1/quotas`; apply compares the file with the live quotas
//! ([`plan`], a pure function), prints the difference and sends all of it in one
//! `POST /v1/quotas:batch`, which the root writes in one transaction or not at all.
//!
//! The fields of a quota are [`QuotaFields`] and nothing else: the file, the diff and the
//! batch body are all derived from it through serde, so a new quota field is one field
//! there (with `#[serde(default, skip_serializing_if = …)]` if it is optional).

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;
use yarl_core::units::milli_to_units;
use yarl_core::QuotaSpec;

/// Where a root listens unless told otherwise (`yarl-root`'s own default `--listen`).
pub const DEFAULT_URL: &str = "http://127.0.0.1:7700";

/// The page size of `GET /v1/quotas` (its maximum).
const PAGE: u32 = 1_000;

/// One quota's settings, as in the admin API's JSON (units per window, as floats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaFields {
    /// Units per window (`per`; per second without it); none on a quota with only
    /// `max_in_flight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// The window (`"1h"`, `"30d"`); none: one second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<String>,
    /// Units; may be left out beside `per` (and is always there once read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_burst: Option<f64>,
    /// Units; as `low_burst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_burst: Option<f64>,
    /// The parent quota's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Shadow mode: limiters count what the quota would reject but let it through.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Requests in flight at once across the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

/// Quotas by name, in the root's (bytewise) name order.
pub type QuotaSet = BTreeMap<String, QuotaFields>;

/// The whole file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotasFile {
    // Required: an empty file (an export that failed after the shell truncated its output)
    // must not read as "no quotas", which `apply --prune` would make true on the root.
    #[serde(deserialize_with = "unique_names")]
    quotas: QuotaSet,
}

/// A YAML mapping into a [`QuotaSet`], refusing a name given twice: a plain map would keep
/// the last silently, and a reviewer reading the first would approve the wrong numbers.
fn unique_names<'de, D: Deserializer<'de>>(d: D) -> Result<QuotaSet, D::Error> {
    struct Unique;
    impl<'de> Visitor<'de> for Unique {
        type Value = QuotaSet;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of quota names to {limit, low_burst, high_burst, parent}")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<QuotaSet, E> {
            Ok(QuotaSet::new())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<QuotaSet, A::Error> {
            let mut out = QuotaSet::new();
            while let Some(name) = m.next_key::<String>()? {
                if out.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!("quota {name:?} appears twice")));
                }
                let fields: QuotaFields = m.next_value()?;
                out.insert(name, fields);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Unique)
}

/// Why a `yarl-root quotas` command failed; every message is one line that names what to
/// fix (the file and quota, or the root and its answer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The quota file is not valid; the message names the quota and the field.
    #[error("{file}: {message}")]
    File {
        /// The file as given.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A local file could not be read.
    #[error("reading {file}: {source}")]
    Read {
        /// The file as given.
        file: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The admin token file is empty or not a token.
    #[error("the admin token file {0}")]
    Token(String),
    /// The root could not be reached (refused, timed out, TLS, DNS).
    #[error("cannot reach the root at {url}: {message}")]
    Connect {
        /// The root's URL.
        url: String,
        /// The innermost cause.
        message: String,
    },
    /// The root answered with an error status; `message` is its `{"error": …}`.
    #[error("the root at {url} answered {status}: {message}")]
    Http {
        /// The root's URL.
        url: String,
        /// The status, e.g. `401 Unauthorized`.
        status: reqwest::StatusCode,
        /// The root's message, or the start of its body.
        message: String,
    },
    /// The quotas could not be written as YAML.
    #[error("cannot write the quotas as YAML: {0}")]
    Yaml(String),
    /// The CA file given to check the root's certificate is unreadable or holds none.
    #[error("the CA file {file} {message}")]
    Ca {
        /// The file as given.
        file: String,
        /// What is wrong with it.
        message: String,
    },
    /// The root answered something this `yarl-root` cannot read.
    #[error("unexpected answer from the root at {url}: {message}")]
    Protocol {
        /// The root's URL.
        url: String,
        /// What was wrong with it.
        message: String,
    },
}

/// Reads a quota file and validates every quota locally (name, numbers, parent not a
/// template) before anything is sent; the quotas come back with their numbers as the root
/// will store them (whole milli-units), so that [`plan`] compares like with like.
pub fn parse(file: &str, text: &str) -> Result<QuotaSet, Error> {
    let bad = |message: String| Error::File { file: file.to_owned(), message };
    let parsed: Option<QuotasFile> =
        serde_norway::from_str(text).map_err(|e| bad(e.to_string()))?;
    let Some(parsed) = parsed else {
        return Err(bad("the file is empty; a file of no quotas says `quotas: {}`".into()));
    };
    parsed
        .quotas
        .into_iter()
        .map(|(name, fields)| {
            let fields =
                normalize(&name, fields).map_err(|e| bad(format!("quota {name:?}: {e}")))?;
            Ok((name, fields))
        })
        .collect()
}

/// Reads and [`parse`]s `path`.
pub fn read(path: &Path) -> Result<QuotaSet, Error> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::Read { file: file.clone(), source })?;
    parse(&file, &text)
}

/// The numbers rounded as the root stores them, after the root's own validation.
fn normalize(name: &str, mut f: QuotaFields) -> Result<QuotaFields, yarl_core::QuotaError> {
    let spec = QuotaSpec {
        limit: f.limit,
        per: f.per.clone(),
        low_burst: f.low_burst,
        high_burst: f.high_burst,
        parent: f.parent.clone(),
        dry_run: f.dry_run,
        max_in_flight: f.max_in_flight,
    };
    let limits = spec.validate(name)?;
    let rate = limits.has_rate();
    f.limit = rate.then(|| limits.limit_units());
    f.per = (rate && limits.window_secs() != 1).then(|| limits.limit().window_text());
    f.low_burst = rate.then(|| milli_to_units(limits.low_burst()));
    f.high_burst = rate.then(|| milli_to_units(limits.high_burst()));
    Ok(f)
}

/// The YAML of `quotas`, after a `#` line saying where they came from. The same quotas
/// always give the same bytes.
pub fn render(source: &str, quotas: &QuotaSet) -> Result<String, Error> {
    let body = QuotasFile { quotas: quotas.clone() };
    let yaml = serde_norway::to_string(&body).map_err(|e| Error::Yaml(e.to_string()))?;
    Ok(format!("# yarl-root quotas export, from {source}\n{yaml}"))
}

/// One changed field of a quota: its name and the old and new values, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    /// The field.
    pub field: String,
    /// Its value on the root (`none` when unset).
    pub old: String,
    /// Its value in the file.
    pub new: String,
}

/// What `apply` would do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Quotas in the file that the root lacks.
    pub create: Vec<(String, QuotaFields)>,
    /// Quotas whose settings differ, with the file's settings and what changes.
    pub change: Vec<(String, QuotaFields, Vec<FieldChange>)>,
    /// Quotas on the root missing from the file (only with `prune`).
    pub delete: Vec<String>,
    /// Quotas that are the same in both.
    pub unchanged: usize,
    /// Quotas on the root missing from the file, left alone (without `prune`).
    pub kept: usize,
}

impl Plan {
    /// Whether applying would write nothing.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.change.is_empty() && self.delete.is_empty()
    }
}

/// The fields of `f` as `(name, shown value)`, the admin API's fields first in its order,
/// then any other alphabetically; unset optional fields are left out.
fn shown(f: &QuotaFields) -> Vec<(String, String)> {
    const ORDER: [&str; 7] =
        ["limit", "per", "low_burst", "high_burst", "max_in_flight", "parent", "dry_run"];
    let serde_json::Value::Object(map) = serde_json::to_value(f).unwrap_or_default() else {
        return Vec::new();
    };
    let mut fields: Vec<(String, String)> =
        map.into_iter().map(|(k, v)| (k, show_value(&v))).collect();
    let rank = |k: &str| ORDER.iter().position(|o| *o == k).unwrap_or(ORDER.len());
    fields.sort_by(|a, b| (rank(&a.0), &a.0).cmp(&(rank(&b.0), &b.0)));
    fields
}

/// How a field left out of a quota shows in a diff: a flag is off, anything else unset.
fn unset(field: &str) -> String {
    if field == "dry_run" { "false" } else { "none" }.into()
}

fn show_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "none".into(),
        // `Display` of f64: `10` rather than JSON's `10.0`, never an exponent.
        serde_json::Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| f.to_string()),
        other => other.to_string(),
    }
}

/// Compares the file (`desired`) with the root (`current`): pure, for `--dry-run` and the
/// tests. Quotas on the root but not in the file are deleted only with `prune`.
pub fn plan(desired: &QuotaSet, current: &QuotaSet, prune: bool) -> Plan {
    let mut p = Plan::default();
    for (name, want) in desired {
        match current.get(name) {
            None => p.create.push((name.clone(), want.clone())),
            Some(have) if have == want => p.unchanged += 1,
            Some(have) => {
                let (old, new) = (shown(have), shown(want));
                let mut fields: Vec<String> = old.iter().map(|(k, _)| k.clone()).collect();
                let added: Vec<String> =
                    new.iter().map(|(k, _)| k.clone()).filter(|k| !fields.contains(k)).collect();
                fields.extend(added);
                let old: HashMap<String, String> = old.into_iter().collect();
                let mut new: HashMap<String, String> = new.into_iter().collect();
                let changes = fields
                    .into_iter()
                    .filter_map(|field| {
                        let o = old.get(&field).cloned().unwrap_or_else(|| unset(&field));
                        let n = new.remove(&field).unwrap_or_else(|| unset(&field));
                        (o != n).then_some(FieldChange { field, old: o, new: n })
                    })
                    .collect();
                p.change.push((name.clone(), want.clone(), changes));
            }
        }
    }
    for name in current.keys().filter(|n| !desired.contains_key(*n)) {
        if prune {
            p.delete.push(name.clone());
        } else {
            p.kept += 1;
        }
    }
    p
}

/// The plan as the operator reads it: `+` create, `~` change, `-` delete, then the
/// counts.
pub fn render_plan(p: &Plan) -> String {
    let mut out = String::new();
    for (name, f) in &p.create {
        let fields: Vec<String> = shown(f).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "+ {name}  {}", fields.join(" "));
    }
    for (name, _, changes) in &p.change {
        let fields: Vec<String> =
            changes.iter().map(|c| format!("{}: {} -> {}", c.field, c.old, c.new)).collect();
        let _ = writeln!(out, "~ {name}  {}", fields.join(", "));
    }
    for name in &p.delete {
        let _ = writeln!(out, "- {name}");
    }
    if p.kept > 0 {
        let _ = writeln!(
            out,
            "({} quota{} on the root but not in the file left alone; --prune deletes them)",
            p.kept,
            if p.kept == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(
        out,
        "{} to create, {} to change, {} to delete, {} unchanged",
        p.create.len(),
        p.change.len(),
        p.delete.len(),
        p.unchanged
    );
    out
}

/// One item of `POST /v1/quotas:batch`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum BatchItem<'a> {
    Write {
        name: &'a str,
        #[serde(flatten)]
        fields: &'a QuotaFields,
    },
    Delete {
        name: &'a str,
        delete: bool,
    },
}

/// The batch body of a plan: writes parents first (the root accepts any order, but epochs
/// follow the items and limiters then never see a child before its parent), then the
/// deletes (the root orders those children first).
fn batch_items(p: &Plan) -> Vec<BatchItem<'_>> {
    let writes: HashMap<&str, &QuotaFields> = p
        .create
        .iter()
        .map(|(n, f)| (n.as_str(), f))
        .chain(p.change.iter().map(|(n, f, _)| (n.as_str(), f)))
        .collect();
    let depth = |name: &str| {
        let mut d = 0usize;
        let mut cur = writes.get(name).and_then(|f| f.parent.as_deref());
        // Bounded: a cycle in the file is the root's to refuse, by name.
        while let Some(parent) = cur.filter(|_| d <= yarl_core::MAX_CHAIN) {
            d += 1;
            cur = writes.get(parent).and_then(|f| f.parent.as_deref());
        }
        d
    };
    let mut ordered: Vec<(usize, &str, &QuotaFields)> =
        writes.iter().map(|(n, f)| (depth(n), *n, *f)).collect();
    ordered.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    ordered
        .into_iter()
        .map(|(_, name, fields)| BatchItem::Write { name, fields })
        .chain(p.delete.iter().map(|name| BatchItem::Delete { name, delete: true }))
        .collect()
}

/// What the root answered to a batch.
#[derive(Debug, Clone, Deserialize)]
pub struct Applied {
    /// Rows written, deletes included.
    pub count: usize,
    /// The epoch of the last one (`None` for an empty batch).
    pub last_epoch: Option<u64>,
}

/// Reads a bearer token file, trimmed as the root trims its own copy.
pub fn read_token(path: &Path) -> Result<String, Error> {
    let file = path.display().to_string();
    let raw = std::fs::read_to_string(path)
        .map_err(|source| Error::Read { file: file.clone(), source })?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(Error::Token(format!("{file} is empty")));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Token(format!("{file} must hold printable ASCII without spaces")));
    }
    Ok(token.to_owned())
}

/// The admin API of one root.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

/// The certificates of a PEM file.
fn load_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, Error> {
    let file = path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| Error::Read { file: file.clone(), source })?;
    let bad = |message: String| Error::Ca { file: file.clone(), message };
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        return Err(bad("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| bad(format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// Checks that every quota of `file`'s `quotas` starts with `prefix`: applied with a
/// prefix, a file speaks for the quotas under it only (and `--prune` deletes only there).
pub fn check_prefix(file: &Path, quotas: &QuotaSet, prefix: &str) -> Result<(), Error> {
    match quotas.keys().find(|name| !name.starts_with(prefix)) {
        None => Ok(()),
        Some(name) => Err(Error::File {
            file: file.display().to_string(),
            message: format!("quota {name:?} is outside --prefix {prefix:?}"),
        }),
    }
}

/// The quota fields of one `GET /v1/quotas` item: everything but the row's bookkeeping.
/// Any other field is one this `yarl-root` does not know, and exporting without it would
/// lose it, so it is an error rather than dropped.
const SERVER_ONLY: [&str; 5] = ["name", "id", "epoch", "deleted", "reset_epoch"];

#[derive(Debug, Deserialize)]
struct Page {
    quotas: Vec<serde_json::Map<String, serde_json::Value>>,
    next: Option<String>,
}

impl Client {
    /// A client of the root at `url` (e.g. `http://127.0.0.1:7700`), checking an `https`
    /// root's certificate against the PEM certificates of `ca_file` instead of the
    /// system's CAs when one is given.
    pub fn new(url: &str, token: Option<String>, ca_file: Option<&Path>) -> Result<Self, Error> {
        let url = url.trim_end_matches('/').to_owned();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // A million-quota batch takes the root tens of seconds.
            .timeout(Duration::from_secs(600))
            // A root never redirects: following one would carry the admin token where the
            // answer said (reqwest keeps `Authorization` when only the scheme changes).
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = ca_file {
            builder = builder.tls_built_in_root_certs(false);
            for c in load_ca(path)? {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder
            .build()
            .map_err(|e| Error::Connect { url: url.clone(), message: innermost(&e) })?;
        Ok(Client { http, url, token })
    }

    /// The root's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, Error> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .send()
            .await
            .map_err(|e| Error::Connect { url: self.url.clone(), message: innermost(&e) })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| body.trim().chars().take(200).collect());
        Err(Error::Http { url: self.url.clone(), status, message })
    }

    fn protocol(&self, message: impl std::fmt::Display) -> Error {
        Error::Protocol { url: self.url.clone(), message: message.to_string() }
    }

    /// Every live quota whose name starts with `prefix`, templates included.
    pub async fn list(&self, prefix: &str) -> Result<QuotaSet, Error> {
        let mut out = QuotaSet::new();
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("limit", PAGE.to_string())];
            if !prefix.is_empty() {
                query.push(("prefix", prefix.to_owned()));
            }
            if let Some(a) = &after {
                query.push(("after", a.clone()));
            }
            let req = self.http.get(format!("{}/v1/quotas", self.url)).query(&query);
            let page: Page = self.send(req).await?.json().await.map_err(|e| self.protocol(e))?;
            for mut q in page.quotas {
                let Some(serde_json::Value::String(name)) = q.remove("name") else {
                    return Err(self.protocol("a quota without a name"));
                };
                for k in SERVER_ONLY {
                    q.remove(k);
                }
                // The root sends `"parent": null`; the file leaves an unset parent out.
                q.retain(|_, v| !v.is_null());
                let fields: QuotaFields = serde_json::from_value(serde_json::Value::Object(q))
                    .map_err(|e| {
                        self.protocol(format!(
                            "quota {name:?}: {e} (is this yarl-root older than the root?)"
                        ))
                    })?;
                out.insert(name, fields);
            }
            match page.next {
                Some(n) if after.as_ref() != Some(&n) => after = Some(n),
                Some(n) => return Err(self.protocol(format!("the page after {n:?} repeats"))),
                None => return Ok(out),
            }
        }
    }

    /// The root's counters and sessions (`GET /v1/copy`), read within `timeout` and at
    /// most `max_bytes` of body: a restarting root's start, from a live root of its shard.
    pub async fn copy(
        &self,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<yarl_core::root::RootCopy, Error> {
        let req = self.http.get(format!("{}/v1/copy", self.url)).timeout(timeout);
        let mut resp = self.send(req).await?;
        if resp.content_length().is_some_and(|n| n > max_bytes as u64) {
            return Err(self.protocol(format!("a copy of more than {max_bytes} bytes")));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| Error::Connect { url: self.url.clone(), message: innermost(&e) })?
        {
            if body.len() + chunk.len() > max_bytes {
                return Err(self.protocol(format!("a copy of more than {max_bytes} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| self.protocol(format!("the copy: {e}")))
    }

    /// Applies the whole plan in one `POST /v1/quotas:batch`: all of it or, on any error,
    /// none of it.
    pub async fn apply(&self, p: &Plan) -> Result<Applied, Error> {
        let req = self.http.post(format!("{}/v1/quotas:batch", self.url)).json(&batch_items(p));
        self.send(req).await?.json().await.map_err(|e| self.protocol(e))
    }
}

/// The most specific message of an error chain: "Connection refused (os error 111)"
/// rather than reqwest's "error sending request for url (…)".
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(limit: f64, low: f64, high: f64, parent: Option<&str>) -> QuotaFields {
        QuotaFields {
            limit: Some(limit),
            per: None,
            low_burst: Some(low),
            high_burst: Some(high),
            parent: parent.map(Into::into),
            dry_run: false,
            max_in_flight: None,
        }
    }

    const FILE: &str = "\
quotas:
  api_all: {limit: 10000, low_burst: 10000, high_burst: 20000}
  api_key_*:
    limit: 10.0
    low_burst: 10
    high_burst: 20
    parent: api_all
";

    #[test]
    fn parses_and_renders_stably() {
        let set = parse("q.yaml", FILE).unwrap();
        assert_eq!(set["api_all"], q(10000.0, 10000.0, 20000.0, None));
        assert_eq!(set["api_key_*"], q(10.0, 10.0, 20.0, Some("api_all")));
        let out = render("http://r", &set).unwrap();
        assert_eq!(
            out,
            "# yarl-root quotas export, from http://r\nquotas:\n  api_all:\n    limit: 10000.0\n    \
             low_burst: 10000.0\n    high_burst: 20000.0\n  api_key_*:\n    limit: 10.0\n    \
             low_burst: 10.0\n    high_burst: 20.0\n    parent: api_all\n"
        );
        assert_eq!(parse("q.yaml", &out).unwrap(), set);
        assert_eq!(render("http://r", &parse("q.yaml", &out).unwrap()).unwrap(), out);
        assert_eq!(
            render("http://r", &QuotaSet::new()).unwrap().lines().nth(1),
            Some("quotas: {}")
        );
        assert!(parse("q.yaml", "quotas:\n").unwrap().is_empty());
        for empty in ["", "\n", "# nothing\n", "---\n"] {
            let e = parse("q.yaml", empty).unwrap_err().to_string();
            assert!(e.contains("the file is empty"), "{empty:?}: {e}");
        }
        let e = parse("q.yaml", "{}\n").unwrap_err().to_string();
        assert!(e.contains("missing field `quotas`"), "{e}");
    }

    #[test]
    fn names_that_need_quotes_round_trip() {
        let mut set = QuotaSet::new();
        for n in ["true", "123", "a:b", "@x", "-y", "null", "1e3", "a%20b", "*"] {
            set.insert(n.into(), q(1.0, 0.0, 0.0, None));
        }
        let out = render("x", &set).unwrap();
        assert_eq!(serde_norway::from_str::<QuotasFile>(&out).unwrap().quotas, set, "{out}");
    }

    #[test]
    fn bad_files_name_the_file_quota_and_field() {
        let cases = [
            ("quotas:\n  a: {limit: 1, low_burst: 1, high_burst: 2}\n  a: {limit: 2, low_burst: 1, high_burst: 2}\n", "quota \"a\" appears twice"),
            ("quotas:\n  a: {limit: 1, low_burst: 1, high_burst: 2, lowburst: 3}\n", "quotas.a: unknown field `lowburst`"),
            ("quotas:\n  a: {limit: 1, low_burst: 1}\n", "quota \"a\": high_burst is required unless the quota has a window (per)"),
            ("quotas:\n  a: {limit: -1, low_burst: 1, high_burst: 2}\n", "quota \"a\": limit must be a number"),
            ("quotas:\n  a: {limit: 1, low_burst: 5, high_burst: 2}\n", "quota \"a\": low_burst (5) must not be greater"),
            ("quotas:\n  a: {limit: ten, low_burst: 1, high_burst: 2}\n", "quotas.a.limit: invalid type"),
            ("quotas:\n  b c: {limit: 1, low_burst: 1, high_burst: 2}\n", "quota \"b c\": name has ' '"),
            ("quotas:\n  a: {limit: 1, low_burst: 1, high_burst: 2, parent: t_*}\n", "quota \"a\": the parent must be a quota"),
            ("quota:\n  a: {limit: 1, low_burst: 1, high_burst: 2}\n", "unknown field `quota`"),
        ];
        for (text, want) in cases {
            let e = parse("q.yaml", text).unwrap_err().to_string();
            assert!(
                e.starts_with("q.yaml: ") && e.contains(want),
                "{text}: {e} should say {want:?}"
            );
        }
    }

    #[test]
    fn numbers_compare_as_the_root_stores_them() {
        let file =
            parse("f", "quotas:\n  a: {limit: 10.0004, low_burst: 1, high_burst: 2}\n").unwrap();
        let root = QuotaSet::from([("a".into(), q(10.0, 1.0, 2.0, None))]);
        assert!(plan(&file, &root, false).is_empty());
    }

    #[test]
    fn windows_are_written_as_the_root_writes_them() {
        let file = parse(
            "f",
            "quotas:\n  d: {limit: 1000, per: 1440m}\n  h: {limit: 20, per: 1h, low_burst: 5}\n",
        )
        .unwrap();
        let d = &file["d"];
        assert_eq!(
            (d.per.as_deref(), d.low_burst, d.high_burst),
            (Some("1d"), Some(999.0), Some(1000.0))
        );
        let h = &file["h"];
        assert_eq!(
            (h.per.as_deref(), h.low_burst, h.high_burst),
            (Some("1h"), Some(5.0), Some(20.0))
        );
        let text = render("r", &file).unwrap();
        assert!(text.contains("    per: 1d\n"), "{text}");
        assert_eq!(parse("f", &text).unwrap(), file, "an export reads back as itself");
        let e = parse("f", "quotas:\n  d: {limit: 1, per: 1w}\n").unwrap_err().to_string();
        assert!(e.contains("quota \"d\": per must be"), "{e}");
    }

    #[test]
    fn max_in_flight_alone_or_beside_a_rate() {
        let file = parse(
            "f",
            "quotas:\n  db: {max_in_flight: 50}\n  g: {limit: 10, per: 1m, max_in_flight: 8}\n",
        )
        .unwrap();
        let db = &file["db"];
        assert_eq!((db.limit, db.low_burst, db.max_in_flight), (None, None, Some(50)));
        assert_eq!((file["g"].limit, file["g"].max_in_flight), (Some(10.0), Some(8)));
        let text = render("r", &file).unwrap();
        assert!(text.contains("  db:\n    max_in_flight: 50\n"), "{text}");
        assert_eq!(parse("f", &text).unwrap(), file, "an export reads back as itself");
        // A change of the cap is a change like any other.
        let mut root = file.clone();
        root.get_mut("db").unwrap().max_in_flight = Some(40);
        let p = plan(&file, &root, false);
        assert_eq!(p.change[0].2[0].field, "max_in_flight");
        for (text, want) in [
            ("quotas:\n  a: {max_in_flight: 0}\n", "max_in_flight must be a whole number"),
            ("quotas:\n  a: {max_in_flight: 5, per: 1h}\n", "per needs a limit"),
            ("quotas:\n  a: {parent: b}\n", "limit is required unless the quota has max_in_flight"),
        ] {
            let e = parse("f", text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e} should say {want:?}");
        }
    }

    #[test]
    fn plan_creates_changes_and_prunes() {
        let current = QuotaSet::from([
            ("a".into(), q(10.0, 10.0, 20.0, None)),
            ("b".into(), q(1.0, 1.0, 2.0, Some("a"))),
            ("c".into(), q(1.0, 1.0, 2.0, None)),
            ("gone".into(), q(1.0, 0.0, 0.0, None)),
        ]);
        let desired = QuotaSet::from([
            ("a".into(), q(20.0, 10.0, 20.0, None)),
            ("b".into(), q(1.0, 1.0, 2.0, None)),
            ("c".into(), q(1.0, 1.0, 2.0, None)),
            ("new".into(), q(0.5, 1.0, 2.0, Some("a"))),
        ]);
        let p = plan(&desired, &current, false);
        assert_eq!(
            (p.create.len(), p.change.len(), p.delete.len(), p.unchanged, p.kept),
            (1, 2, 0, 1, 1)
        );
        assert_eq!(
            render_plan(&p),
            "+ new  limit=0.5 low_burst=1 high_burst=2 parent=a\n\
             ~ a  limit: 10 -> 20\n\
             ~ b  parent: a -> none\n\
             (1 quota on the root but not in the file left alone; --prune deletes them)\n\
             1 to create, 2 to change, 0 to delete, 1 unchanged\n"
        );
        let p = plan(&desired, &current, true);
        assert_eq!(p.delete, ["gone"]);
        assert!(render_plan(&p)
            .ends_with("- gone\n1 to create, 2 to change, 1 to delete, 1 unchanged\n"));
        assert!(plan(&current, &current, true).is_empty());
        // Shadow mode on and off: a flag left out is off.
        let trial = |dry_run| QuotaFields { dry_run, ..q(1.0, 1.0, 2.0, None) };
        let on = QuotaSet::from([("c".into(), trial(true))]);
        let off = QuotaSet::from([("c".into(), trial(false))]);
        assert_eq!(
            render_plan(&plan(&on, &off, false)),
            "~ c  dry_run: false -> true\n0 to create, 1 to change, 0 to delete, 0 unchanged\n"
        );
        assert_eq!(
            render_plan(&plan(&off, &on, false)),
            "~ c  dry_run: true -> false\n0 to create, 1 to change, 0 to delete, 0 unchanged\n"
        );
        assert_eq!(
            render_plan(&plan(&current, &current, true)),
            "0 to create, 0 to change, 0 to delete, 4 unchanged\n"
        );
    }

    #[test]
    fn batch_writes_parents_first_then_deletes() {
        let desired = QuotaSet::from([
            ("a_child".into(), q(1.0, 0.0, 0.0, Some("z_root"))),
            ("z_root".into(), q(1.0, 0.0, 0.0, None)),
        ]);
        let current = QuotaSet::from([("old".into(), q(1.0, 0.0, 0.0, None))]);
        let p = plan(&desired, &current, true);
        let body = serde_json::to_value(batch_items(&p)).unwrap();
        assert_eq!(
            body,
            serde_json::json!([
                {"name": "z_root", "limit": 1.0, "low_burst": 0.0, "high_burst": 0.0},
                {"name": "a_child", "limit": 1.0, "low_burst": 0.0, "high_burst": 0.0, "parent": "z_root"},
                {"name": "old", "delete": true},
            ])
        );
    }

    #[test]
    fn token_file_loses_only_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "s3cret\n").unwrap();
        assert_eq!(read_token(&p).unwrap(), "s3cret");
        std::fs::write(&p, "\n").unwrap();
        assert!(read_token(&p).unwrap_err().to_string().contains("is empty"));
    }
}
