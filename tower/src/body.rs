//! The response body: the inner service's, counted when a quota is charged its bytes; or
//! the rejection's.

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use yarl_core::units::MAX_WEIGHT_UNITS;
use yarl_core::{Acquired, Limiter, Permit, QuotaId};

/// Adds `weight` to `name`'s chain, clamped to the largest weight a limiter takes.
pub(crate) fn charge(limiter: &Limiter, name: &str, weight: u64) {
    // Unknown names charge nothing; the clamp makes WeightError impossible.
    let _ = limiter.charge(name, weight.min(MAX_WEIGHT_UNITS));
}

/// Bytes a body yielded, charged once when it ends or is dropped.
pub(crate) struct BodyCharge {
    limiter: Arc<Limiter>,
    names: Vec<Cow<'static, str>>,
    bytes: u64,
}

impl BodyCharge {
    pub(crate) fn new(limiter: Arc<Limiter>, names: Vec<Cow<'static, str>>) -> Self {
        BodyCharge { limiter, names, bytes: 0 }
    }
}

impl Drop for BodyCharge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            for name in &self.names {
                charge(&self.limiter, name, self.bytes);
            }
        }
    }
}

/// A slot of a quota's `max_in_flight` was refused (the limiter runs its whole share): the
/// counter that refused.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) QuotaId);

/// The concurrency slots one request holds, given back when dropped: when its response
/// body ends or is dropped, or with the response future (the inner service failed, the
/// client went away before the answer) or the rejection.
pub(crate) struct Slots {
    limiter: Arc<Limiter>,
    permits: Vec<Permit>,
}

impl Slots {
    /// Takes a slot of each name's chain, all of them or none (what was taken before a
    /// refusal is given back); in a `dry` run a refused name is passed over and the others
    /// keep their slots. `None` when no name has a cap here.
    pub(crate) fn acquire(
        limiter: &Arc<Limiter>,
        names: &[Cow<'static, str>],
        dry: bool,
    ) -> Result<Option<Slots>, Refused> {
        if names.is_empty() {
            return Ok(None);
        }
        let mut slots = Slots { limiter: limiter.clone(), permits: Vec::new() };
        for name in names {
            match limiter.acquire(&**name) {
                // A quota in shadow mode lets the request on past its cap.
                Acquired::Admitted(p) | Acquired::WouldRefuse(p, _) if !p.is_empty() => {
                    slots.permits.push(p)
                }
                Acquired::Admitted(_) | Acquired::WouldRefuse(..) => {}
                Acquired::Refused(_) if dry => {}
                Acquired::Refused(id) => return Err(Refused(id)),
            }
        }
        Ok((!slots.permits.is_empty()).then_some(slots))
    }
}

impl Slots {
    /// The slots held, one permit per name with a cap.
    pub(crate) fn permits(&self) -> &[Permit] {
        &self.permits
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        for p in &self.permits {
            self.limiter.release(p);
        }
    }
}

pin_project! {
    /// The body of [`YarlService`](crate::YarlService)'s responses: the inner service's
    /// body (counted when a quota is charged its bytes), or the rejection's.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            charge: Option<BodyCharge>,
            slots: Option<Slots>,
        },
        Rejected {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn new(body: B, charge: Option<BodyCharge>, slots: Option<Slots>) -> Self {
        ResponseBody { kind: Kind::Inner { body, charge, slots } }
    }

    pub(crate) fn rejected(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        ResponseBody { kind: Kind::Rejected { data } }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { charge, .. } => {
                if charge.is_some() {
                    "counted"
                } else {
                    "inner"
                }
            }
            Kind::Rejected { .. } => "rejection",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, charge, slots } => {
                let frame = ready!(body.poll_frame(cx));
                match (&frame, charge.as_mut()) {
                    (Some(Ok(f)), Some(c)) => {
                        if let Some(d) = f.data_ref() {
                            c.bytes = c.bytes.saturating_add(d.remaining() as u64);
                        }
                    }
                    // The end: charge now rather than whenever the body is dropped.
                    (None, Some(_)) => drop(charge.take()),
                    _ => {}
                }
                if frame.is_none() {
                    // The request is over: its slots go back now, not when a server gets
                    // round to dropping the body.
                    drop(slots.take());
                }
                Poll::Ready(frame)
            }
            KindProj::Rejected { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Rejected { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejected { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
