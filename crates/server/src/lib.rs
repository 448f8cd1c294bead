//! resin's OpenAI-compatible HTTP server (axum on tokio).
//!
//! Endpoints: `POST /v1/chat/completions` (streaming and not, tools, logprobs),
//! `POST /v1/completions`, `GET /v1/models`, Anthropic's `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, OpenAI's Responses API (`POST /v1/responses`, `GET` and
//! `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`), `GET /health`, `GET /metrics` (Prometheus text).
//!
//! One file per concern: [`openai`] the request types and their checks, [`anthropic`] the
//! Messages API translated onto the chat pipeline, [`responses`] the Responses API on the same
//! pipeline (and its store of responses), [`prompt`] messages
//! through the chat template, [`generate`] the engine's events as whole responses or SSE
//! chunks, [`reasoning`] the reasoning of templates that think kept apart from the answer,
//! [`tools`] recognising tool calls, [`grammar`] the llguidance constraints (structured
//! outputs, forced calls),
//! [`metrics`] the Prometheus text, [`error`] OpenAI's error object.

pub mod anthropic;
pub mod error;
mod generate;
pub mod grammar;
mod guard;
mod handlers;
pub mod http;
pub mod metrics;
mod openai;
mod prompt;
pub mod reasoning;
pub mod responses;
pub mod tools;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use resin_engine::Engine;
use resin_model::{ChatTemplate, Tokenizer};

pub use error::ApiError;
pub use guard::origin_allowed;
pub use http::{serve_on, shutdown_signal, Lifecycle, Phase};
pub use metrics::Metrics;

/// How the server listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// When set, every /v1 request needs `Authorization: Bearer <key>` (or `x-api-key: <key>`,
    /// as Anthropic's clients send it).
    pub api_key: Option<String>,
    /// Overrides the model id from [`ModelInfo`] when not empty.
    pub model_name: String,
    /// Largest request body accepted (413 past it).
    pub max_body_bytes: usize,
    /// Largest `stop` list.
    pub max_stop: usize,
    /// Time to receive a request's headers before the connection is closed (zero: no limit).
    pub header_timeout: Duration,
    /// Time to receive a request's body, from its headers, before a 408 (zero: no limit).
    pub body_timeout: Duration,
    /// Open connections served at once; past it new ones get 503 and are closed.
    pub max_connections: usize,
    /// Origins (`scheme://host[:port]`) whose browser requests are served; `*` allows any.
    /// Requests with another `Origin` get 403; requests without one are not affected.
    pub cors_origins: Vec<String>,
    /// How long in-flight generations may run on after the shutdown signal.
    pub shutdown_grace: Duration,
    /// How long a response's write may wait for a client that stopped reading (its socket's
    /// buffer full) before the connection is closed and its generation cancelled (zero: no limit).
    pub stall_timeout: Duration,
    /// Responses the Responses API keeps for `previous_response_id` and `GET`; past it the
    /// oldest is dropped (0 keeps none).
    pub max_stored_responses: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            model_name: String::new(),
            max_body_bytes: 4 << 20,
            max_stop: 16,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            cors_origins: Vec::new(),
            shutdown_grace: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(60),
            max_stored_responses: 256,
        }
    }
}

/// The model the server speaks for.
pub struct ModelInfo {
    /// The id clients name in `model` (and /v1/models lists).
    pub id: String,
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template; None falls back to ChatML.
    pub template: Option<ChatTemplate>,
}

/// Everything a handler needs. Cheap to clone (an Arc).
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub engine: Engine,
    pub model_id: String,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub cfg: ServerConfig,
    pub metrics: Metrics,
    /// Seconds since the epoch when the server started (`created` in /v1/models).
    pub created: u64,
    /// The grammar engine over the model's vocabulary (structured outputs, forced tool
    /// calls), built on first use.
    pub grammar: OnceLock<Result<Arc<grammar::GrammarEnv>, String>>,
    /// The shutdown phase and the generations in flight.
    pub life: Lifecycle,
    /// The Responses API's stored responses.
    pub responses: responses::ResponseStore,
    /// This process's key for Anthropic thinking signatures (random, made at start).
    pub thinking_key: [u8; 32],
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    pub fn new(engine: Engine, model: ModelInfo, cfg: ServerConfig) -> Self {
        let model_id = if cfg.model_name.is_empty() { model.id } else { cfg.model_name.clone() };
        let responses = responses::ResponseStore::new(cfg.max_stored_responses);
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        AppState(Arc::new(Inner {
            engine,
            model_id,
            tokenizer: model.tokenizer,
            template: model.template,
            cfg,
            metrics: Metrics::default(),
            created,
            grammar: OnceLock::new(),
            life: Lifecycle::default(),
            responses,
            thinking_key: rand::random(),
        }))
    }

    /// The grammar engine over the model's vocabulary, built once per model.
    pub fn grammar(&self) -> Result<Arc<grammar::GrammarEnv>, ApiError> {
        self.grammar
            .get_or_init(|| grammar::GrammarEnv::from_tokenizer(&self.tokenizer).map(Arc::new).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| ApiError::internal(format!("The grammar engine could not be built for this model's vocabulary: {e}")))
    }
}

/// The whole application: routes, body limit, API key check, request log and metrics.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{*id}", get(handlers::model))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::list_input_items))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(v1)
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .with_state(state)
}

/// Bind and serve until `shutdown` resolves (see [`shutdown_signal`]), then shut down gracefully.
pub async fn serve(engine: Engine, model: ModelInfo, cfg: ServerConfig, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
    let state = AppState::new(engine, model, cfg);
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, model = %state.model_id, auth = state.cfg.api_key.is_some(), "serving the OpenAI API");
    serve_on(listener, state, shutdown).await
}

/// Compares in time that depends only on the lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    if let Some(key) = &state.cfg.api_key {
        let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let given = bearer.or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok())).map(str::trim).unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Token counts a response carries for the request log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub prompt: usize,
    pub completion: usize,
}

/// Marks a streamed response: its stream writes the log line when it ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogsItself;

async fn log_request(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    state.metrics.request(&path, status);
    if resp.extensions().get::<LogsItself>().is_none() {
        let (p, c) = resp.extensions().get::<Usage>().map(|u| (u.prompt, u.completion)).unwrap_or((0, 0));
        tracing::info!(
            %method,
            path,
            status,
            latency_ms = t0.elapsed().as_secs_f64() * 1e3,
            prompt_tokens = p,
            completion_tokens = c,
            "request"
        );
    }
    resp
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares() {
        assert!(super::constant_time_eq(b"abc", b"abc"));
        assert!(!super::constant_time_eq(b"abc", b"abd"));
        assert!(!super::constant_time_eq(b"abc", b"ab"));
        assert!(!super::constant_time_eq(b"", b"a"));
    }
}
