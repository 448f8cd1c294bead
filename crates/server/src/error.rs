//! Errors as OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use resin_engine::SubmitError;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a Retry-After header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }
    /// 400, invalid_request_error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn param(mut self, p: impl Into<String>) -> Self {
        self.param = Some(p.into());
        self
    }
    pub fn code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }
    /// 503 for a server whose home's device failed (`why`): it stays down until it restarts,
    /// so no Retry-After is offered.
    pub fn device_lost(why: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("The server's device failed ({why}); it cannot generate until it is restarted. Retry on another server."),
        )
        .code("device_lost")
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "Incorrect or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")
            .code("invalid_api_key")
    }

    /// The error object alone (also sent inside a stream).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::EmptyPrompt => ApiError::invalid("The prompt is empty.").param("prompt"),
            SubmitError::PromptTooLong { prompt, n_ctx } => ApiError::invalid(format!(
                "This model's maximum context length is {n_ctx} tokens; the prompt has {prompt} tokens (at least one more position is needed to generate)."
            ))
            .param("messages")
            .code("context_length_exceeded"),
            SubmitError::QueueFull(n) => {
                let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("The server is busy ({n} requests waiting); retry later.")).code("queue_full");
                e.retry_after = Some(1);
                e
            }
            SubmitError::BadParams(m) => ApiError::invalid(m),
            SubmitError::Closed => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The engine has stopped."),
            SubmitError::HomeDown(why) => ApiError::device_lost(&why),
        }
    }
}
