//! The layer, its service, and what a rule says about one request.

use crate::body::{BodyCharge, Refused, ResponseBody, Slots};
use crate::future::{After, ResponseFuture};
use crate::Yarl;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderName, Request, Response, StatusCode};
use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};
use yarl_core::units::MAX_WEIGHT_UNITS;
use yarl_core::{Decision, Limiter, Outcome};

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Names the quotas of one request: called once per request with its head (method, URI,
/// headers, extensions such as axum's `MatchedPath`), before the inner service sees it.
///
/// Any `Fn(&Parts, &mut Quotas) + Send + Sync + 'static` is a rule.
pub trait Rule: Send + Sync + 'static {
    /// Adds this request's quotas to `quotas`.
    fn quotas(&self, request: &Parts, quotas: &mut Quotas);
}

impl<F> Rule for F
where
    F: Fn(&Parts, &mut Quotas) + Send + Sync + 'static,
{
    fn quotas(&self, request: &Parts, quotas: &mut Quotas) {
        self(request, quotas)
    }
}

/// Where a charge made after the response takes its weight from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChargeFrom {
    Body,
    Reported,
}

/// The quotas one request is decided on and charged to, as a [`Rule`] names them.
///
/// [`check`](Self::check) and [`account`](Self::account) are decided together before the
/// request goes on, all or nothing: if any quota of any chain rejects, the request is
/// rejected and nothing is added anywhere. Charges are added after the response, without
/// deciding. Names no quota has pass (creating the quota is how an operator starts
/// limiting); empty names are skipped.
#[derive(Debug, Default)]
pub struct Quotas {
    /// The first item to decide on, inline: most requests name one quota, and then no
    /// allocation is made.
    first: Option<(Cow<'static, str>, u64)>,
    more: Vec<(Cow<'static, str>, u64)>,
    charges: Vec<(Cow<'static, str>, ChargeFrom)>,
    slots: Vec<Cow<'static, str>>,
}

impl Quotas {
    /// Decides on `name` and its ancestors without counting anything (the module's
    /// `yarl_check`; the article's nginx role).
    pub fn check(&mut self, name: impl Into<Cow<'static, str>>) -> &mut Self {
        self.account(name, 0)
    }

    /// Decides on `name` and its ancestors and, if the request passes, adds `weight` units
    /// to every counter of the chain (the module's `yarl_account`; the article's application
    /// role). Weights above 1e12 units count as 1e12; a weight of 0 is a check.
    pub fn account(&mut self, name: impl Into<Cow<'static, str>>, weight: u64) -> &mut Self {
        let name = name.into();
        if !name.is_empty() {
            let item = (name, weight.min(MAX_WEIGHT_UNITS));
            if self.first.is_none() {
                self.first = Some(item);
            } else {
                self.more.push(item);
            }
        }
        self
    }

    /// The name of item `k` to decide on.
    fn name(&self, k: usize) -> Option<&str> {
        match k {
            0 => self.first.as_ref().map(|(n, _)| &**n),
            k => self.more.get(k - 1).map(|(n, _)| &**n),
        }
    }

    /// After the response, adds the bytes of its body to every counter of `name`'s chain,
    /// without deciding (the module's `yarl_charge NAME $bytes_sent`): what the body
    /// yielded, counted when it ends or is dropped (a client that went away is charged
    /// what was sent until then). Nothing is charged for a rejected request or an error of
    /// the inner service.
    pub fn charge_body(&mut self, name: impl Into<Cow<'static, str>>) -> &mut Self {
        self.charge(name.into(), ChargeFrom::Body)
    }

    /// After the response, adds the cost the handler reported in the response's
    /// extensions as a [`Cost`] to every counter of `name`'s chain, without deciding (a
    /// listing's number of objects, an LLM's tokens). No [`Cost`]: nothing is charged.
    pub fn charge_reported(&mut self, name: impl Into<Cow<'static, str>>) -> &mut Self {
        self.charge(name.into(), ChargeFrom::Reported)
    }

    /// Takes a slot of `name`'s `max_in_flight`, and of every capped ancestor's, for the
    /// request's life, on the share of the cap the roots grant this limiter (the module's
    /// `yarl_concurrency`): no I/O, one compare-and-swap per capped level. The slots are
    /// given back when the response body ends or is dropped, when the inner service fails,
    /// and when the request is rejected. A request refused a slot is rejected with
    /// `Retry-After: 1` before any rate is decided (in dry-run mode it goes on without the
    /// slot); several names take their slots all or none. Names without a cap pass.
    pub fn concurrency(&mut self, name: impl Into<Cow<'static, str>>) -> &mut Self {
        let name = name.into();
        if !name.is_empty() {
            self.slots.push(name);
        }
        self
    }

    fn charge(&mut self, name: Cow<'static, str>, from: ChargeFrom) -> &mut Self {
        if !name.is_empty() {
            self.charges.push((name, from));
        }
        self
    }

    /// Whether the rule named nothing.
    pub fn is_empty(&self) -> bool {
        self.first.is_none() && self.charges.is_empty() && self.slots.is_empty()
    }
}

/// A cost known only once the handler ran, charged to the quotas the rule named with
/// [`Quotas::charge_reported`]. Put it in the response's extensions: with axum, return
/// `(Extension(Cost(n)), body)` from the handler.
///
/// ```
/// use axum::Extension;
/// use yarl_tower::Cost;
///
/// async fn list() -> (Extension<Cost>, String) {
///     let listed = vec!["a", "b", "c"];
///     (Extension(Cost(listed.len() as u64)), listed.join("\n"))
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost(pub u64);

/// Settings shared by a layer and the services it makes.
#[derive(Debug, Clone)]
struct Settings {
    status: StatusCode,
    retry_after: bool,
    headers: bool,
    dry_run: bool,
    content_type: HeaderValue,
    body: Bytes,
}

pub(crate) struct Config<R> {
    pub(crate) limiter: Arc<Limiter>,
    settings: Settings,
    rule: Arc<R>,
    /// Keeps the sync task alive as long as a service uses the limiter.
    _yarl: Yarl,
}

impl<R> Clone for Config<R> {
    fn clone(&self) -> Self {
        Config {
            limiter: self.limiter.clone(),
            settings: self.settings.clone(),
            rule: self.rule.clone(),
            _yarl: self._yarl.clone(),
        }
    }
}

/// A [`tower_layer::Layer`] that decides each request on the quotas a [`Rule`] names, in a
/// [`Yarl`] limiter that syncs with the roots in the background.
///
/// Rejected requests never reach the inner service: they get `429 Too Many Requests`
/// (see [`status`](Self::status)) with `Retry-After` (whole seconds until the rejecting
/// quota drains back to `low_burst`, the same number the module sends) and, with
/// [`headers`](Self::headers), the `RateLimit-Policy` / `RateLimit` fields.
///
/// The services it makes answer `Response<ResponseBody<B>>` for an inner `Response<B>`;
/// with axum, `B` is `axum::body::Body` and the layer goes in `Router::layer`,
/// `Router::route_layer`, `MethodRouter::layer` or `Handler::layer`.
pub struct YarlLayer<R> {
    /// Made once: `layer()` only clones the `Arc` (axum may call it for every request that
    /// reaches a fallback).
    config: Arc<Config<R>>,
}

impl<R> Clone for YarlLayer<R> {
    fn clone(&self) -> Self {
        YarlLayer { config: self.config.clone() }
    }
}

impl<R> std::fmt::Debug for YarlLayer<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("YarlLayer").field("settings", &self.config.settings).finish_non_exhaustive()
    }
}

impl<R: Rule> YarlLayer<R> {
    /// A layer deciding in `yarl`'s limiter on the quotas `rule` names.
    pub fn new(yarl: Yarl, rule: R) -> Self {
        YarlLayer {
            config: Arc::new(Config {
                limiter: yarl.limiter().clone(),
                settings: Settings {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    retry_after: true,
                    headers: false,
                    dry_run: false,
                    content_type: HeaderValue::from_static("text/plain; charset=utf-8"),
                    body: Bytes::from_static(b"Too Many Requests\n"),
                },
                rule: Arc::new(rule),
                _yarl: yarl,
            }),
        }
    }

    fn settings(&mut self) -> &mut Settings {
        &mut Arc::make_mut(&mut self.config).settings
    }

    /// The status of rejections (default 429, `yarl_status`); S3 clients expect 503.
    ///
    /// # Panics
    ///
    /// If `status` is not in 400–599: a rejection must be an error. A status read from
    /// configuration goes through [`try_status`](Self::try_status).
    pub fn status(self, status: StatusCode) -> Self {
        match self.try_status(status) {
            Ok(layer) => layer,
            Err(e) => panic!("yarl-tower: {e}"),
        }
    }

    /// [`status`](Self::status), with [`Error::BadStatus`](crate::Error::BadStatus) rather
    /// than a panic when `status` is not in 400–599.
    pub fn try_status(mut self, status: StatusCode) -> Result<Self, crate::Error> {
        if !(status.is_client_error() || status.is_server_error()) {
            return Err(crate::Error::BadStatus(status.as_u16()));
        }
        self.settings().status = status;
        Ok(self)
    }

    /// Whether rejections carry `Retry-After` (default on, `yarl_retry_after`).
    pub fn retry_after(mut self, on: bool) -> Self {
        self.settings().retry_after = on;
        self
    }

    /// Whether answers carry the IETF `RateLimit-Policy` and `RateLimit` fields for the
    /// chain that decided (default off, `yarl_headers`): the same fields as the module,
    /// made by [`yarl_core::ratelimit::fields`].
    pub fn headers(mut self, on: bool) -> Self {
        self.settings().headers = on;
        self
    }

    /// Decide, never reject (default off, `yarl_dry_run`): a request that would be rejected
    /// goes on (and, like any rejected account, adds nothing).
    pub fn dry_run(mut self, on: bool) -> Self {
        self.settings().dry_run = on;
        self
    }

    /// The body of rejections and its content type (default `Too Many Requests` as
    /// `text/plain`).
    pub fn rejection_body(mut self, content_type: HeaderValue, body: impl Into<Bytes>) -> Self {
        let s = self.settings();
        s.content_type = content_type;
        s.body = body.into();
        self
    }
}

impl<S, R: Rule> tower_layer::Layer<S> for YarlLayer<R> {
    type Service = YarlService<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        YarlService { inner, config: self.config.clone() }
    }
}

/// The service [`YarlLayer`] wraps around an inner one.
pub struct YarlService<S, R> {
    inner: S,
    config: Arc<Config<R>>,
}

impl<S: Clone, R> Clone for YarlService<S, R> {
    fn clone(&self) -> Self {
        YarlService { inner: self.inner.clone(), config: self.config.clone() }
    }
}

impl<S: std::fmt::Debug, R> std::fmt::Debug for YarlService<S, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("YarlService")
            .field("inner", &self.inner)
            .field("settings", &self.config.settings)
            .finish_non_exhaustive()
    }
}

impl<S, R, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for YarlService<S, R>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    R: Rule,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let mut quotas = Quotas::default();
        self.config.rule.quotas(&parts, &mut quotas);
        let request = Request::from_parts(parts, body);
        if quotas.is_empty() {
            return ResponseFuture::passed(self.inner.call(request), None);
        }
        let cfg = &*self.config;
        let limiter = &cfg.limiter;
        // Slots first, as the module does: a request refused one is not counted by the
        // rates, and one the rates reject gives its slots back (dropped on return).
        let headers = cfg.settings.headers;
        let slots = match Slots::acquire(limiter, &quotas.slots, cfg.settings.dry_run) {
            Ok(slots) => slots,
            Err(Refused(id)) => {
                // The cap that refused, `r=0;t=1`, as the module answers.
                let fields = headers.then(|| limiter.with_slot_fields(None, &[], Some(id)));
                let fields = header_values(fields.flatten());
                return ResponseFuture::rejected(rejection(&cfg.settings, 1, fields));
            }
        };
        let (decision, matched) = decide(limiter, &quotas);
        let chain = matched.and_then(|k| quotas.name(k));
        let rejected = decision.as_ref().is_some_and(|d| d.outcome == Outcome::Rejected);
        let fields = match (headers, chain, &decision) {
            (true, Some(chain), Some(d)) => ratelimit_fields(limiter, chain, d),
            _ => None,
        };
        let rejected = rejected && !cfg.settings.dry_run;
        // The caps' items of the slots a request that goes on holds (a rejected one gives
        // them back).
        let fields = match (headers, &slots) {
            (true, Some(s)) if !rejected => limiter.with_slot_fields(fields, s.permits(), None),
            _ => fields,
        };
        let fields = header_values(fields);
        if rejected {
            let retry = decision.as_ref().and_then(|d| d.retry_after).unwrap_or(1);
            return ResponseFuture::rejected(rejection(&cfg.settings, retry, fields));
        }
        let after = After::new(limiter, fields, quotas.charges, slots);
        ResponseFuture::passed(self.inner.call(request), after)
    }
}

/// Decides on every item at once; the decision (`None`: no quota matched) and the index of
/// the item whose chain decided (the rejecting one, or the last that matched).
fn decide(limiter: &Limiter, q: &Quotas) -> (Option<Decision>, Option<usize>) {
    let (d, k) = match (&q.first, q.more.is_empty()) {
        (None, _) => return (None, None),
        // The common case, without a slice of borrowed names.
        (Some((name, weight)), true) => match limiter.account(&**name, *weight) {
            Ok(d) => (d, Some(0)),
            // Weights are clamped when named; fail open if that ever changes.
            Err(_) => return (None, None),
        },
        (Some(first), false) => {
            let items: Vec<(&str, u64)> =
                std::iter::once(first).chain(&q.more).map(|(n, w)| (&**n, *w)).collect();
            match limiter.account_many_matched(&items) {
                Ok(r) => r,
                Err(_) => return (None, None),
            }
        }
    };
    if d.outcome == Outcome::Unlimited {
        (None, None)
    } else {
        (Some(d), k)
    }
}

/// The `RateLimit-Policy` and `RateLimit` values for `chain`, as the module makes them:
/// every level on a pass, the levels up to the rejecting quota on a rejection, whose `t` is
/// `Retry-After`.
fn ratelimit_fields(
    limiter: &Limiter,
    chain: &str,
    decision: &Decision,
) -> Option<(String, String)> {
    let mut levels = limiter.levels(chain);
    let mut rejected = None;
    if decision.outcome == Outcome::Rejected {
        let rejecting = decision.quota.as_deref();
        if let Some(k) = rejecting.and_then(|q| levels.iter().position(|l| l.name == q)) {
            levels.truncate(k + 1);
            rejected = Some((k, decision.retry_after.unwrap_or(1)));
        }
    }
    yarl_core::ratelimit::fields(&levels, rejected)
}

/// The two fields as header values: quota names are `[A-Za-z0-9._:@-]` (`%XX` for other
/// bytes), always a valid header value.
fn header_values(fields: Option<(String, String)>) -> Option<(HeaderValue, HeaderValue)> {
    let (policy, state) = fields?;
    Some((HeaderValue::try_from(policy).ok()?, HeaderValue::try_from(state).ok()?))
}

fn rejection<B>(
    s: &Settings,
    retry_after: u32,
    fields: Option<(HeaderValue, HeaderValue)>,
) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::rejected(s.body.clone()));
    *response.status_mut() = s.status;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, s.content_type.clone());
    if s.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    if let Some((policy, state)) = fields {
        h.insert(RATELIMIT_POLICY, policy);
        h.insert(RATELIMIT, state);
    }
    response
}

impl After {
    /// What to do once the inner service answered; `None` (no allocation) when nothing.
    fn new(
        limiter: &Arc<Limiter>,
        fields: Option<(HeaderValue, HeaderValue)>,
        charges: Vec<(Cow<'static, str>, ChargeFrom)>,
        slots: Option<Slots>,
    ) -> Option<Box<After>> {
        if fields.is_none() && charges.is_empty() && slots.is_none() {
            return None;
        }
        let (body, reported): (Vec<_>, Vec<_>) =
            charges.into_iter().partition(|(_, from)| *from == ChargeFrom::Body);
        Some(Box::new(After {
            limiter: limiter.clone(),
            fields,
            reported: reported.into_iter().map(|(n, _)| n).collect(),
            body: (!body.is_empty()).then(|| {
                BodyCharge::new(limiter.clone(), body.into_iter().map(|(n, _)| n).collect())
            }),
            slots,
        }))
    }
}
