//! HTTP plumbing shared by the collector, the daemon and the CLI: JSON errors, signed requests
//! (verify on the server, sign on the client), and reading bodies under a size cap.

use axum::Json;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::report::{Key, SIGNATURE_HEADER, TIMESTAMP_HEADER, check_signed_request, now_ns};

/// Every API error is `{"error": <code>, "message": <what was wrong>}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad-request", m)
    }
    pub fn not_found(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not-found", m)
    }
    pub fn conflict(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", m)
    }
    pub fn unauthorized(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m)
    }
    pub fn internal(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m)
    }
    pub fn unavailable(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.code, "message": self.message})),
        )
            .into_response()
    }
}

pub async fn not_found_fallback(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no such endpoint: {}", uri.path()))
}

pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// Checks that a request was signed with the cluster key within the time window.
pub fn verify_signed(
    key: &Key,
    window_s: u64,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ApiError> {
    let h = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    check_signed_request(
        key,
        &crate::report::SignedRequest {
            method: method.as_str(),
            path,
            timestamp: h(TIMESTAMP_HEADER),
            signature: h(SIGNATURE_HEADER),
            body,
        },
        now_ns(),
        window_s,
    )
    .map_err(ApiError::unauthorized)
}

/// Largest body a signed request may carry.
const MAX_SIGNED_BODY: usize = 1 << 20;

/// What the signature middleware checks against.
#[derive(Clone)]
pub struct SignedAuth {
    pub key: Key,
    pub window_s: u64,
}

/// Middleware for routes that change state: the request must be signed with the cluster key.
/// The body is read once, verified, and handed on to the handler unchanged.
pub async fn require_signed(
    axum::extract::State(auth): axum::extract::State<SignedAuth>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_SIGNED_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
    verify_signed(
        &auth.key,
        auth.window_s,
        &parts.method,
        &parts.uri,
        &parts.headers,
        &bytes,
    )?;
    Ok(next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await)
}

/// Parses a JSON body, naming the problem when it is malformed.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Sends a request signed with the cluster key. `path` includes any query string.
pub async fn send_signed(
    client: &reqwest::Client,
    key: &Key,
    method: reqwest::Method,
    base: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<reqwest::Response, reqwest::Error> {
    let ts = now_ns();
    let body = body.unwrap_or_default();
    let sig = key.sign_request(method.as_str(), path, ts, &body);
    let mut req = client
        .request(method, format!("{base}{path}"))
        .header(TIMESTAMP_HEADER, ts.to_string())
        .header(SIGNATURE_HEADER, sig);
    if !body.is_empty() {
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
    }
    req.send().await
}

#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("{0}")]
    Transport(#[from] reqwest::Error),
    #[error("body is over the {cap}-byte cap")]
    TooLarge { cap: usize },
}

/// Reads a response body, stopping as soon as it exceeds `cap`.
pub async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|l| l as usize > cap) {
        return Err(BodyError::TooLarge { cap });
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        out.extend_from_slice(&chunk);
        if out.len() > cap {
            return Err(BodyError::TooLarge { cap });
        }
    }
    Ok(out)
}

/// Error message of a daemon or collector JSON error body, or the raw text.
pub fn error_message(status: reqwest::StatusCode, body: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v.get("message").is_some() => format!(
            "{} ({}): {}",
            status,
            v["error"].as_str().unwrap_or("error"),
            v["message"].as_str().unwrap_or("")
        ),
        _ => format!("{status}: {}", String::from_utf8_lossy(body).trim()),
    }
}

/// Binds a TCP listener, naming the address on failure.
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, std::io::Error> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
