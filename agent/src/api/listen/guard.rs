//! What every request passes before a route sees it, as the web configuration in force
//! says: no body (every endpoint is a GET), the rate limit, basic auth; and the
//! configured headers on every answer, refusals too.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::WebConfigs;

#[derive(Clone)]
struct Guard {
    web: WebConfigs,
    max_body_bytes: u64,
}

/// `routes` behind the guard: the web configuration is read from `web` at each request,
/// so that a reload applies to the next one.
pub fn guard(routes: Router, web: WebConfigs, max_body_bytes: u64) -> Router {
    routes.layer(axum::middleware::from_fn_with_state(
        Guard {
            web,
            max_body_bytes,
        },
        check,
    ))
}

async fn check(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let web = Arc::clone(&guard.web.borrow());
    let mut response = if has_body_over(request.headers(), guard.max_body_bytes) {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large: the API takes none\n",
        )
    } else if web.rate_limit.as_ref().is_some_and(|r| !r.allow()) {
        refusal(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n")
    } else if !web.users.is_empty()
        // The Authorization header is handed over, never logged.
        && !web.users.verify(request.headers().get(header::AUTHORIZATION)).await
    {
        let mut r = refusal(StatusCode::UNAUTHORIZED, "Unauthorized\n");
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
        r
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    for (name, value) in &web.headers {
        headers.insert(name.clone(), value.clone());
    }
    response
}

/// Whether a request has a body the API does not take: chunked, or a `Content-Length`
/// over `cap`.
fn has_body_over(headers: &HeaderMap, cap: u64) -> bool {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return true;
    }
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > cap)
}

/// A refusal as Go's `http.Error` writes it: plain text, not to be sniffed.
fn refusal(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_or_a_long_one_is_refused() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        assert!(!has_body_over(&headers(&[]), 1024));
        assert!(!has_body_over(&headers(&[("content-length", "0")]), 1024));
        assert!(!has_body_over(
            &headers(&[("content-length", "1024")]),
            1024
        ));
        assert!(has_body_over(&headers(&[("content-length", "1025")]), 1024));
        assert!(has_body_over(
            &headers(&[("transfer-encoding", "chunked")]),
            1024
        ));
    }
}
