//! The response future: the inner service's answer, with the `RateLimit` fields and the
//! charges made after the response; or the rejection, ready at once.

use crate::body::{BodyCharge, ResponseBody, Slots};
use crate::layer::{Cost, RATELIMIT, RATELIMIT_POLICY};
use http::header::HeaderValue;
use http::Response;
use pin_project_lite::pin_project;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use yarl_core::Limiter;

/// What happens once the inner service answered a request that passed.
pub(crate) struct After {
    pub(crate) limiter: Arc<Limiter>,
    /// `RateLimit-Policy` and `RateLimit`, computed when the request was decided.
    pub(crate) fields: Option<(HeaderValue, HeaderValue)>,
    /// Quotas charged the handler's [`Cost`].
    pub(crate) reported: Vec<Cow<'static, str>>,
    /// Quotas charged the response body's bytes.
    pub(crate) body: Option<BodyCharge>,
    /// Concurrency slots, given back when the body ends or is dropped (or with this, if
    /// the inner service fails or the future is dropped).
    pub(crate) slots: Option<Slots>,
}

impl After {
    fn apply<B>(self, mut response: Response<B>) -> Response<ResponseBody<B>> {
        if let Some((policy, state)) = self.fields {
            let h = response.headers_mut();
            h.insert(RATELIMIT_POLICY, policy);
            h.insert(RATELIMIT, state);
        }
        if !self.reported.is_empty() {
            if let Some(&Cost(cost)) = response.extensions().get::<Cost>() {
                for name in &self.reported {
                    crate::body::charge(&self.limiter, name, cost);
                }
            }
        }
        response.map(|b| ResponseBody::new(b, self.body, self.slots))
    }
}

pin_project! {
    /// The future of [`YarlService`](crate::YarlService)'s responses.
    pub struct ResponseFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Passed {
            #[pin]
            future: F,
            after: Option<Box<After>>,
        },
        Rejected {
            response: Option<Response<ResponseBody<B>>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn passed(future: F, after: Option<Box<After>>) -> Self {
        ResponseFuture { kind: Kind::Passed { future, after } }
    }

    pub(crate) fn rejected(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture { kind: Kind::Rejected { response: Some(response) } }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passed { future, after } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(match after.take() {
                    Some(after) => after.apply(response),
                    None => response.map(|b| ResponseBody::new(b, None, None)),
                }))
            }
            KindProj::Rejected { response } => {
                Poll::Ready(Ok(response.take().expect("ResponseFuture polled after completion")))
            }
        }
    }
}
