//! What every request's head must be before any route sees it: within the size cap, and its
//! path and query UTF-8 text, also once percent-decoded; and a signed request's header read once.

use axum::http::StatusCode;

use super::ApiError;

/// The largest request head (request line and headers) either listener takes. hyper's read
/// buffer bounds memory only loosely (a head can run past it by a read), so the cap is
/// counted here, on what was parsed.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// Refuses a head over [`MAX_HEAD_BYTES`] (431) and a path or query that is not UTF-8, as
/// sent or percent-decoded (400): a handler never sees a name or a reason that would be
/// stored with U+FFFD in place of what the client sent.
pub fn check_head<B>(req: &axum::http::Request<B>) -> Result<(), ApiError> {
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let headers: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    let size = req.method().as_str().len() + target.len() + headers + 12;
    if size > MAX_HEAD_BYTES {
        return Err(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            format!("the request head is {size} bytes; at most {MAX_HEAD_BYTES} are taken"),
        ));
    }
    let path = req.uri().path();
    if percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .is_err()
    {
        return Err(ApiError::bad_request(
            "the request path is not UTF-8 once percent-decoded",
        ));
    }
    if let Some(q) = req.uri().query() {
        // A query's `+` is a space; only its percent-escapes can hide bytes that are not UTF-8.
        if percent_encoding::percent_decode_str(q)
            .decode_utf8()
            .is_err()
        {
            return Err(ApiError::bad_request(
                "the request query is not UTF-8 once percent-decoded",
            ));
        }
    }
    Ok(())
}

/// A header of a signed request's head: absent, or sent once as text. A second copy is
/// refused, not ignored: of two values, which one a proxy or a server reads is not agreed.
pub fn header_once<'a>(
    headers: &'a axum::http::HeaderMap,
    name: &str,
) -> Result<Option<&'a str>, HeaderError> {
    let mut all = headers.get_all(name).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(HeaderError::Twice(name.to_string()));
    }
    first
        .map(|v| {
            v.to_str()
                .map_err(|_| HeaderError::NotText(name.to_string()))
        })
        .transpose()
}

/// A header of a signed request's head that cannot be read, by name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HeaderError {
    #[error("{0} must be sent once")]
    Twice(String),
    #[error("{0} must be ASCII text")]
    NotText(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(target: &str, pad: usize) -> axum::http::Request<()> {
        axum::http::Request::get(target)
            .header("x-pad", "a".repeat(pad))
            .body(())
            .unwrap()
    }

    #[test]
    fn heads_over_the_cap_and_targets_that_are_not_utf8_are_refused() {
        assert!(check_head(&req("/1/status?node=n%C3%A9", 10)).is_ok());
        assert!(check_head(&req("/1/status", MAX_HEAD_BYTES - 100)).is_ok());
        let e = check_head(&req("/1/status", MAX_HEAD_BYTES)).unwrap_err();
        assert_eq!(e.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        for bad in ["/1/status?x=%ff", "/1/%C3%28", "/1/events?reason=%ed%a0%80"] {
            let e = check_head(&req(bad, 0)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.message.contains("UTF-8"), "{bad}: {}", e.message);
        }
    }
}
