//! The web status page: three embedded files served under `/ui/`, read-only. The page reads
//! the same lists as any API client (with their watches) and builds its DOM from text only,
//! so nothing a node reported can become markup; the headers forbid inline script as well.

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

/// Scripts, styles and requests only from the daemon itself; no inline script or handler, no
/// frame, no form. A payload that slipped past the page's escaping would still not run.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The page's routes; stateless, merged into the API's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Small, and replaced with the binary: always asked again, never a stale page.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// `GET /`: the protocol versions for API clients, as always; a browser, which asks for HTML
/// first, is sent to the page.
pub async fn root(headers: HeaderMap) -> Response {
    if wants_html(&headers) {
        return Redirect::to("/ui/").into_response();
    }
    axum::Json(serde_json::json!([1])).into_response()
}

/// Whether the client names HTML in its `Accept` header (browsers do, first); `*/*` alone (curl,
/// most libraries) is an API client.
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            let mut parts = m.split(';');
            let kind = parts.next().unwrap_or("").trim();
            // `q=0` is an explicit refusal.
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            kind.eq_ignore_ascii_case("text/html") && !refused
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn browsers_get_the_page_and_api_clients_the_versions() {
        assert!(wants_html(&accept(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        )));
        assert!(wants_html(&accept("TEXT/HTML")));
        assert!(!wants_html(&accept("*/*")));
        assert!(!wants_html(&accept("application/json")));
        assert!(!wants_html(&accept("text/html;q=0, application/json")));
        assert!(!wants_html(&HeaderMap::new()));
    }

    #[tokio::test]
    async fn the_page_and_its_files_are_served_with_their_types_and_policy() {
        use tower::ServiceExt;
        let app = routes::<()>().route("/", get(root));
        let get = |path: &str, accept: &str| {
            axum::http::Request::get(path)
                .header(header::ACCEPT, accept)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        for (path, kind) in [
            ("/ui/", "text/html"),
            ("/ui/app.js", "text/javascript"),
            ("/ui/style.css", "text/css"),
        ] {
            let r = app.clone().oneshot(get(path, "*/*")).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let h = r.headers();
            assert!(h[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind));
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], POLICY);
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        let r = app.clone().oneshot(get("/ui", "*/*")).await.unwrap();
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.headers()[header::LOCATION], "/ui/");
        let r = app.clone().oneshot(get("/", "text/html")).await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[header::LOCATION], "/ui/");
        let r = app.oneshot(get("/", "*/*")).await.unwrap();
        let body = axum::body::to_bytes(r.into_body(), 100).await.unwrap();
        assert_eq!(&body[..], b"[1]");
    }

    #[test]
    fn the_page_loads_only_its_own_files_and_builds_no_markup_from_data() {
        // Every file the page names is served here, and nothing from elsewhere.
        for r in ["/ui/app.js", "/ui/style.css"] {
            assert!(INDEX.contains(r.trim_start_matches("/ui/")), "{r}");
        }
        for external in ["http://", "https://", "//"] {
            let in_markup = INDEX
                .split(['"', '\''])
                .any(|attr| attr.starts_with(external));
            assert!(!in_markup, "the page names an outside resource: {external}");
        }
        // The script never parses strings as HTML: text nodes and attributes only.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(!SCRIPT.contains(sink), "app.js uses {sink}");
        }
        assert!(
            !INDEX.contains("<script>"),
            "no inline script (the policy forbids it)"
        );
    }
}
