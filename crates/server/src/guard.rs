//! What every request passes before the routes: the CORS origin check and preflights, the
//! shutdown gate, `Content-Type: application/json` on POST bodies, the body read under its time
//! and size limits, and JSON error objects for the empty-bodied errors axum writes itself (405).

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::http::Phase;
use crate::AppState;

/// The request's `Origin`, when it has one: Ok(allowed) or Err(the refusal).
fn check_origin(state: &AppState, headers: &HeaderMap) -> Option<Result<HeaderValue, ApiError>> {
    let origin = headers.get(header::ORIGIN)?;
    let allowed = origin.to_str().ok().is_some_and(|o| origin_allowed(&state.cfg.cors_origins, o));
    Some(if allowed {
        Ok(origin.clone())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            format!(
                "Requests from the origin {:?} are not allowed; start the server with --cors-origin <origin> to allow a web page to call it.",
                String::from_utf8_lossy(origin.as_bytes())
            ),
        )
        .code("origin_not_allowed"))
    })
}

/// An origin matches a configured one exactly (case and a trailing slash aside), or `*`.
pub fn origin_allowed(allowed: &[String], origin: &str) -> bool {
    let o = origin.trim().trim_end_matches('/');
    allowed.iter().any(|a| {
        let a = a.trim().trim_end_matches('/');
        a == "*" || a.eq_ignore_ascii_case(o)
    })
}

/// `application/json`, with any parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()).is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn unsupported_media_type(headers: &HeaderMap) -> ApiError {
    let given = headers.get(header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let what = match given {
        Some(t) => format!("The request body is sent as {t:?}"),
        None => "The request has no Content-Type".to_string(),
    };
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request_error",
        format!("{what}; this server takes JSON bodies with `Content-Type: application/json` (with curl: add -H 'Content-Type: application/json'; `curl -d` alone sends a form)."),
    )
    .code("unsupported_media_type")
}

fn shutting_down() -> ApiError {
    let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The server is shutting down; retry this request on another server or after it restarts.")
        .code("server_shutdown");
    e.retry_after = Some(1);
    e
}

/// The status's error object for an error response that has no body.
fn error_for(status: StatusCode, headers: &HeaderMap) -> ApiError {
    let msg = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("");
            format!("This endpoint does not take this method (it takes: {allow}).")
        }
        StatusCode::REQUEST_TIMEOUT => "The request took too long to arrive.".to_string(),
        StatusCode::PAYLOAD_TOO_LARGE => "The request body is larger than this server accepts.".to_string(),
        StatusCode::URI_TOO_LONG => "The request's URI is longer than this server accepts.".to_string(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "Send the body as JSON with `Content-Type: application/json`.".to_string(),
        StatusCode::TOO_MANY_REQUESTS => "Too many requests; retry later.".to_string(),
        StatusCode::SERVICE_UNAVAILABLE => "The server cannot take this request now; retry later.".to_string(),
        s => format!("The request failed: {s}."),
    };
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    ApiError::new(status, kind, msg)
}

/// A response of status >= 400 with no body and no Content-Type gets the error object, keeping
/// its other headers (Allow, Retry-After).
fn with_json_error(resp: Response) -> Response {
    let status = resp.status();
    if status.as_u16() < 400 || resp.headers().contains_key(header::CONTENT_TYPE) || resp.body().size_hint().exact() != Some(0) {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    let mut r = error_for(status, &parts.headers).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_LENGTH && k != header::CONTENT_TYPE {
            r.headers_mut().append(k, v.clone());
        }
    }
    r.extensions_mut().extend(parts.extensions);
    r
}

fn add_cors(resp: &mut Response, origin: Option<HeaderValue>) {
    if let Some(o) = origin {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

pub(crate) async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    // Every error under /v1/messages, whichever layer makes it, in Anthropic's shape.
    if crate::anthropic::is_messages_path(req.uri().path()) {
        let resp = guarded(state, req, next).await;
        return crate::anthropic::reshape_error(resp).await;
    }
    guarded(state, req, next).await
}

async fn guarded(state: AppState, req: Request, next: Next) -> Response {
    let origin = match check_origin(&state, req.headers()) {
        None => None,
        Some(Ok(o)) => Some(o),
        Some(Err(e)) => return e.into_response(),
    };
    // A CORS preflight from an allowed origin.
    if req.method() == Method::OPTIONS && origin.is_some() && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.unwrap_or(HeaderValue::from_static("authorization, content-type")));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        add_cors(&mut r, origin);
        return r;
    }
    let mut resp = handle(&state, req, next).await;
    if state.life.phase() != Phase::Running {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    add_cors(&mut resp, origin);
    resp
}

async fn handle(state: &AppState, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if state.life.phase() != Phase::Running && path != "/health" && path != "/metrics" {
        return shutting_down().into_response();
    }
    if req.method() == Method::POST && !is_json(req.headers()) {
        return unsupported_media_type(req.headers()).into_response();
    }
    // Read the whole body here, under the time and size limits.
    let (parts, body) = req.into_parts();
    let limit = state.cfg.max_body_bytes;
    let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit));
    let read = if state.cfg.body_timeout.is_zero() { Ok(read.await) } else { tokio::time::timeout(state.cfg.body_timeout, read).await };
    let bytes = match read {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("The request body did not arrive within {} s.", state.cfg.body_timeout.as_secs_f64()),
            )
            .code("request_timeout")
            .into_response()
        }
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                return ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("The request body is larger than this server accepts ({limit} bytes)."))
                    .code("request_too_large")
                    .into_response();
            }
            return ApiError::invalid(format!("The request body could not be read: {e}")).into_response();
        }
        Ok(Ok(b)) => b.to_bytes(),
    };
    let resp = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    with_json_error(resp)
}
