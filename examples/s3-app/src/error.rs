//! Every error the application answers, with its status: `{"code": …, "error": …}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// What went wrong with a request; each variant says its status. Codes are S3's where S3
/// has one.
#[derive(Debug)]
pub enum AppError {
    /// 400: not a bucket name.
    InvalidBucketName,
    /// 400: not a key.
    InvalidKey(&'static str),
    /// 400: a bad query parameter.
    InvalidArgument(String),
    /// 400: the store has its maximum of buckets.
    TooManyBuckets(usize),
    /// 404.
    NoSuchBucket,
    /// 404.
    NoSuchKey,
    /// 405: a method the route does not take.
    MethodNotAllowed,
    /// 408: the body did not arrive in time.
    RequestTimeout,
    /// 409: the bucket exists.
    BucketExists,
    /// 409: a bucket with objects cannot be deleted.
    BucketNotEmpty,
    /// 409: the bucket has its maximum of objects.
    TooManyObjects(usize),
    /// 411: a PUT without Content-Length (the byte quota must know the size up front).
    MissingContentLength,
    /// 413: the object is larger than allowed.
    TooLarge(usize),
    /// 400: the body could not be read.
    BadBody(String),
    /// 507: the store holds as many bytes as it may.
    StoreFull,
}

impl AppError {
    fn parts(&self) -> (StatusCode, &'static str, String) {
        use AppError::*;
        match self {
            InvalidBucketName => (
                StatusCode::BAD_REQUEST,
                "InvalidBucketName",
                "a bucket name is 3 to 63 characters of a-z, 0-9, '.' and '-', beginning and \
                 ending with a letter or digit"
                    .into(),
            ),
            InvalidKey(why) => (StatusCode::BAD_REQUEST, "InvalidKey", (*why).into()),
            InvalidArgument(why) => (StatusCode::BAD_REQUEST, "InvalidArgument", why.clone()),
            TooManyBuckets(n) => {
                (StatusCode::BAD_REQUEST, "TooManyBuckets", format!("at most {n} buckets"))
            }
            NoSuchBucket => {
                (StatusCode::NOT_FOUND, "NoSuchBucket", "the bucket does not exist".into())
            }
            NoSuchKey => (StatusCode::NOT_FOUND, "NoSuchKey", "the key does not exist".into()),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "buckets take GET, PUT and DELETE; objects GET, HEAD, PUT and DELETE".into(),
            ),
            RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "RequestTimeout",
                "the body did not arrive within 10 s".into(),
            ),
            BucketExists => {
                (StatusCode::CONFLICT, "BucketAlreadyOwnedByYou", "the bucket exists".into())
            }
            BucketNotEmpty => {
                (StatusCode::CONFLICT, "BucketNotEmpty", "delete the bucket's objects first".into())
            }
            TooManyObjects(n) => (
                StatusCode::CONFLICT,
                "TooManyObjects",
                format!("a bucket holds at most {n} objects"),
            ),
            MissingContentLength => (
                StatusCode::LENGTH_REQUIRED,
                "MissingContentLength",
                "a PUT needs a Content-Length".into(),
            ),
            TooLarge(n) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "EntityTooLarge",
                format!("an object is at most {n} bytes"),
            ),
            BadBody(why) => (StatusCode::BAD_REQUEST, "IncompleteBody", why.clone()),
            StoreFull => (
                StatusCode::INSUFFICIENT_STORAGE,
                "StoreFull",
                "the store holds as many bytes as it may".into(),
            ),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, code, error) = self.parts();
        (status, Json(serde_json::json!({ "code": code, "error": error }))).into_response()
    }
}
