//! Bearer tokens, compared in constant time so response timing does not reveal how much of
//! a guessed token is right.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The token a group of routes requires, if any.
#[derive(Debug, Clone, Default)]
pub(crate) struct Token(pub Option<Arc<[u8]>>);

pub(crate) async fn require(State(token): State<Token>, req: Request, next: Next) -> Response {
    let Some(expected) = &token.0 else { return next.run(req).await };
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .map(|t| t.trim_ascii());
    match given {
        None => ApiError::MissingToken.into_response(),
        // Only the length can leak, and the length of a random token is no secret.
        Some(t) if bool::from(t.ct_eq(expected)) => next.run(req).await,
        Some(_) => ApiError::WrongToken.into_response(),
    }
}
