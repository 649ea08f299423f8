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
    let given = req.headers().get(AUTHORIZATION).and_then(|v| bearer(v.as_bytes()));
    match given {
        None => ApiError::MissingToken.into_response(),
        // Only the length can leak, and the length of a random token is no secret.
        Some(t) if bool::from(t.ct_eq(expected)) => next.run(req).await,
        Some(_) => ApiError::WrongToken.into_response(),
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive
/// (RFC 9110 §11.1), so `bearer` and `BEARER` work too.
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let v = v.trim_ascii_start();
    let (scheme, rest) = v.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first()?.is_ascii_whitespace() {
        return None;
    }
    Some(rest.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn scheme_is_case_insensitive() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER  t0k ", " Bearer\tt0k"] {
            assert_eq!(bearer(v.as_bytes()), Some(&b"t0k"[..]), "{v:?}");
        }
        for v in ["Basic t0k", "Bearert0k", "Bearer", "Bear t0k", ""] {
            assert_eq!(bearer(v.as_bytes()), None, "{v:?}");
        }
    }
}
