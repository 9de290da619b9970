//! HTTP plumbing shared by the collector, the daemon and the CLI: JSON errors, signed requests
//! (verify on the server, sign on the client), and reading bodies under a size cap.

use axum::Json;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

pub mod client;
pub mod hygiene;
mod limits;
pub mod listener;
mod operators;
mod signed;
pub mod tls;
pub mod tokens;

pub use hygiene::{HeaderError, header_once};
pub use operators::{Operators, OperatorsError};
pub use signed::{RefusalLabel, Refused, ReplayCache, SignedAuth, require_signed};

use crate::report::{Key, SIGNATURE_HEADER, TIMESTAMP_HEADER, now_ns};

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
    pub fn forbidden(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", m)
    }
    pub fn internal(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m)
    }
    pub fn unavailable(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
    }
    pub fn too_large(cap: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            format!("this route takes a body of at most {cap} bytes"),
        )
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

/// Turns the framework's own plain-text rejections (a query or path that does not parse, a
/// missing content type) into the documented JSON error, so every error a client sees has one
/// shape.
pub async fn json_errors(resp: Response) -> Response {
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    let status = resp.status();
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let text = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .ok()
        .filter(|t| !t.is_empty())
        // The documented error always says something.
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let code = match status {
        StatusCode::BAD_REQUEST => "bad-request",
        StatusCode::NOT_FOUND => "not-found",
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        StatusCode::UNPROCESSABLE_ENTITY => "bad-request",
        s if s.is_server_error() => "internal",
        _ => "bad-request",
    };
    ApiError::new(status, code, text).into_response()
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

/// Parses a JSON body, naming the problem when it is malformed.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// A builder for an HTTP client. reqwest's TLS needs a process-wide crypto provider; ring is
/// installed as that (once) so that every client, HTTPS or not, builds.
pub fn client_builder() -> reqwest::ClientBuilder {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        // Err only when another provider was installed first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}

/// Sends a request signed with the cluster key for `target` (a node's name, or
/// [`crate::report::DAEMON_TARGET`]). `path` includes any query string.
pub async fn send_signed(
    client: &reqwest::Client,
    key: &Key,
    target: &str,
    method: reqwest::Method,
    base: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<reqwest::Response, reqwest::Error> {
    let ts = now_ns();
    let body = body.unwrap_or_default();
    let sig = key.sign_request(target, method.as_str(), path, ts, &body);
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

/// An error and its causes, each said once: reqwest's Display already names the URL, and its
/// source repeats the top line, so only causes that add something are appended.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Error message of a daemon or collector JSON error body, or the raw text.
pub fn error_message(status: http::StatusCode, body: &[u8]) -> String {
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
