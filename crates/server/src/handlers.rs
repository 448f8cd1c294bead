//! The endpoints.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use resin_engine::{GenRequest, LogitsConstraint};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generate::{Gen, Kind};
use crate::openai::{parse, response_schema, ChatRequest, CompletionRequest, Plan};
use crate::prompt;
use crate::reasoning::{prompt_opens, ReasoningSplitter};
use crate::tools::ToolStreamer;
use crate::AppState;

/// The body, or 413 past the limit (and 400 for a body that could not be read).
pub(crate) fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("The request body is larger than this server accepts ({} bytes).", state.cfg.max_body_bytes),
            )
            .code("request_too_large")
        } else {
            ApiError::invalid(format!("The request body could not be read: {}", r.body_text()))
        }
    })
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The declared tools as (name, parameter schema), checked.
fn declared_tools(tools: &[Value]) -> Result<Vec<(String, Value)>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let bad = |m: &str| ApiError::invalid(format!("tools[{i}]: {m}")).param(format!("tools[{i}]"));
        if let Some(kind) = t.get("type").and_then(Value::as_str) {
            if kind != "function" {
                return Err(bad(&format!("type {kind:?} is not supported (only \"function\")")));
            }
        }
        let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| bad("needs a 'function' object"))?;
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| bad("the function needs a 'name'"))?;
        let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        if !params.is_object() {
            return Err(bad("'parameters' must be a JSON schema object"));
        }
        out.push((name.to_string(), params));
    }
    Ok(out)
}

fn tool_choice(v: Option<&Value>, tools: &[(String, Value)]) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::invalid(m).param("tool_choice");
    let choice = match v {
        None | Some(Value::Null) => {
            if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(bad(format!("tool_choice {other:?} is not one of none, auto, required, or a function object."))),
        },
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}.".into()))?;
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object.".into())),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(bad("tool_choice \"required\" needs tools.".into())),
        ToolChoice::Named(n) if !tools.iter().any(|(t, _)| t == n) => Err(bad(format!("tool_choice names {n:?}, which is not among the tools."))),
        _ => Ok(choice),
    }
}

/// Generations (streams and whole requests) that may hold connections at once: the
/// connection cap less a quarter of it (at least one), which stays free for /health, /metrics
/// and the prompt refusals of requests past this (503, Retry-After).
pub(crate) fn generation_cap(max_connections: usize) -> usize {
    let max = max_connections.max(1);
    max - (max / 4).max(1).min(max - 1)
}

/// Submit to the engine; the response streams or comes whole.
#[allow(clippy::too_many_arguments)]
fn submit(
    state: &AppState,
    prompt: Vec<u32>,
    plan: Plan,
    constraint: Option<Box<dyn LogitsConstraint>>,
    tools: Option<ToolStreamer>,
    reasoning: Option<ReasoningSplitter>,
    kind: Kind,
    path: &'static str,
    t0: Instant,
) -> Result<Gen, ApiError> {
    let n_ctx = state.engine.n_ctx();
    if prompt.len() >= n_ctx {
        return Err(resin_engine::SubmitError::PromptTooLong { prompt: prompt.len(), n_ctx }.into());
    }
    // Each generation holds its connection while it runs or waits (a stream for its whole
    // length): past the cap's share for generations they would take every connection, and
    // /health, /metrics and the answers that tell a client to back off would find none.
    let cap = generation_cap(state.cfg.max_connections);
    let Some(in_flight) = state.life.generation(cap) else {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("The server is busy ({cap} generations hold connections, the most --max-connections leaves them); retry later."),
        )
        .code("queue_full");
        e.retry_after = Some(1);
        return Err(e);
    };
    let prompt_tokens = prompt.len();
    let mut req = GenRequest::new(prompt, plan.max_tokens.unwrap_or(n_ctx));
    req.params = plan.params;
    req.stop = plan.stop;
    if plan.ignore_eos {
        req.stop_ids = Some(Vec::new());
    }
    req.constraint = constraint;
    req.logprobs = plan.logprobs;
    let handle = state.engine.submit(req)?;
    state.metrics.tokens(prompt_tokens, 0);
    Ok(Gen {
        state: state.clone(),
        handle,
        kind,
        tools,
        reasoning,
        include_usage: plan.include_usage,
        logprobs: plan.logprobs.is_some(),
        t0,
        path,
        prompt_tokens,
        phase: state.life.subscribe(),
        _in_flight: in_flight,
    })
}

async fn respond(gen: Gen, stream: bool) -> Response {
    if stream {
        gen.stream()
    } else {
        gen.collect().await
    }
}

pub async fn chat_completions(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = Instant::now();
    match chat_gen(&state, body, t0) {
        Ok((gen, stream)) => respond(gen, stream).await,
        Err(e) => e.into_response(),
    }
}

fn chat_gen(state: &AppState, body: Result<Bytes, BytesRejection>, t0: Instant) -> Result<(Gen, bool), ApiError> {
    let body = body_bytes(state, body)?;
    let req: ChatRequest = parse(&body)?;
    let mut job = prepare_chat(state, &req)?;
    job.plan.logprobs = req.logprobs()?;
    let stream = job.plan.stream;
    let gen = submit_chat(state, job, Kind::Chat, "/v1/chat/completions", t0)?;
    Ok((gen, stream))
}

/// A chat request made ready for the engine: its prompt, its checked plan, the forced tool
/// call's grammar and the tool-call recogniser.
pub(crate) struct ChatJob {
    pub ids: Vec<u32>,
    pub plan: Plan,
    pub constraint: Option<Box<dyn LogitsConstraint>>,
    pub streamer: Option<ToolStreamer>,
    /// For a template that thinks: what keeps the reasoning apart from the answer.
    pub reasoning: Option<ReasoningSplitter>,
}

/// Check a chat request and render its prompt (what /v1/chat/completions and the Anthropic
/// Messages API, translated into a [`ChatRequest`], share).
pub(crate) fn prepare_chat(state: &AppState, req: &ChatRequest) -> Result<ChatJob, ApiError> {
    let plan = req.common.plan(&state.model_id, state.engine.n_ctx(), state.cfg.max_stop)?;
    let tools = declared_tools(req.tools.as_deref().unwrap_or(&[]))?;
    let choice = tool_choice(req.tool_choice.as_ref(), &tools)?;
    let messages = prompt::normalize_messages(&req.messages)?;
    let template_tools = match (&choice, req.tools.as_deref()) {
        (ToolChoice::None, _) | (_, None) => None,
        (_, Some([])) => None,
        (_, Some(t)) => Some(t),
    };
    let kwargs = req.template_kwargs()?;
    let text = prompt::render(state.template.as_ref(), &messages, template_tools, &kwargs)?;
    let ids = prompt::encode(&state.tokenizer, &text, state.engine.n_ctx(), "messages")?;
    let allowed: Vec<(String, Value)> = match &choice {
        ToolChoice::Required => tools.clone(),
        ToolChoice::Named(n) => tools.iter().filter(|(t, _)| t == n).cloned().collect(),
        _ => Vec::new(),
    };
    let schema = response_schema(req.common.response_format.as_ref())?;
    let constraint: Option<Box<dyn LogitsConstraint>> = match (allowed.is_empty(), schema) {
        (true, None) => None,
        (true, Some(s)) => Some(schema_constraint(state, &s)?),
        (false, None) => {
            let c = state
                .grammar()?
                .tool_call(&allowed)
                .map_err(|e| ApiError::invalid(format!("The tools' parameter schemas cannot be enforced for the forced call: {e}")).param("tools"))?;
            Some(Box::new(c))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid("A forced tool call (tool_choice \"required\" or a named function) and response_format cannot both constrain the output; send one.")
                .param("response_format"))
        }
    };
    let streamer = match &choice {
        ToolChoice::None => None,
        ToolChoice::Auto if tools.is_empty() => None,
        ToolChoice::Auto => Some(ToolStreamer::new(tools.iter().map(|(n, _)| n.clone()).collect())),
        _ => Some(ToolStreamer::new(allowed.iter().map(|(n, _)| n.clone()).collect())),
    };
    // A grammar governs the output from its first token: it is the answer, never reasoning.
    let reasoning =
        state.template.as_ref().and_then(|t| t.reasoning_tags()).map(|(open, close)| ReasoningSplitter::new(open, close, constraint.is_none() && prompt_opens(&text, open, close)));
    Ok(ChatJob { ids, plan, constraint, streamer, reasoning })
}

/// The constraint of `response_format`'s schema; a 400 naming what it asks for that is not
/// supported (llguidance's message, e.g. `Unimplemented keys: ["uniqueItems"]`).
fn schema_constraint(state: &AppState, schema: &Value) -> Result<Box<dyn LogitsConstraint>, ApiError> {
    let c = state.grammar()?.json_schema(schema).map_err(|e| ApiError::invalid(format!("response_format's JSON schema cannot be enforced: {e}")).param("response_format"))?;
    Ok(Box::new(c))
}

/// Submit a prepared chat request.
pub(crate) fn submit_chat(state: &AppState, job: ChatJob, kind: Kind, path: &'static str, t0: Instant) -> Result<Gen, ApiError> {
    submit(state, job.ids, job.plan, job.constraint, job.streamer, job.reasoning, kind, path, t0)
}

pub async fn completions(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = Instant::now();
    match completion_gen(&state, body, t0) {
        Ok((gen, stream)) => respond(gen, stream).await,
        Err(e) => e.into_response(),
    }
}

fn completion_gen(state: &AppState, body: Result<Bytes, BytesRejection>, t0: Instant) -> Result<(Gen, bool), ApiError> {
    let body = body_bytes(state, body)?;
    let req: CompletionRequest = parse(&body)?;
    let mut plan = req.common.plan(&state.model_id, state.engine.n_ctx(), state.cfg.max_stop)?;
    plan.logprobs = req.logprobs()?;
    let bad = || ApiError::invalid("prompt must be a string, an array of one string, or an array of token ids.").param("prompt");
    let one = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(s) => prompt::encode(&state.tokenizer, s, state.engine.n_ctx(), "prompt"),
            Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                let vocab = state.tokenizer.vocab_size() as u64;
                ids.iter()
                    .map(|i| {
                        let i = i.as_u64().unwrap_or(u64::MAX);
                        if i < vocab {
                            Ok(i as u32)
                        } else {
                            Err(ApiError::invalid(format!("Token id {i} is outside the vocabulary ({vocab}).")).param("prompt"))
                        }
                    })
                    .collect()
            }
            _ => Err(bad()),
        }
    };
    let ids = match &req.prompt {
        Value::Array(items) if items.len() == 1 && (items[0].is_string() || items[0].is_array()) => one(&items[0])?,
        Value::Array(items) if items.len() > 1 && !items[0].is_u64() => {
            return Err(ApiError::invalid("Several prompts in one request are not supported; send one.").param("prompt"))
        }
        v => one(v)?,
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("The prompt is empty.").param("prompt"));
    }
    let constraint = match response_schema(req.common.response_format.as_ref())? {
        Some(s) => Some(schema_constraint(state, &s)?),
        None => None,
    };
    let stream = plan.stream;
    let gen = submit(state, ids, plan, constraint, None, None, Kind::Completion, "/v1/completions", t0)?;
    Ok((gen, stream))
}

fn model_object(state: &AppState) -> Value {
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "resin",
        "meta": {"n_ctx": state.engine.n_ctx(), "sessions": state.engine.regions(), "home": state.engine.home_kind(), "vocab": state.tokenizer.vocab_size()},
    })
}

pub async fn models(State(state): State<AppState>) -> Response {
    Json(json!({"object": "list", "data": [model_object(&state)]})).into_response()
}

pub async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if id == state.model_id {
        Json(model_object(&state)).into_response()
    } else {
        ApiError::not_found(format!("The model '{id}' does not exist.")).param("model").code("model_not_found").into_response()
    }
}

pub async fn health(State(state): State<AppState>) -> Response {
    use std::sync::atomic::Ordering;
    let s = state.engine.stats();
    if let Some(why) = state.engine.home_down() {
        let mut body = ApiError::device_lost(why).body();
        body["status"] = json!("down");
        body["reason"] = json!(why);
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    if state.life.phase() != crate::http::Phase::Running {
        let mut body = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The server is shutting down.").code("server_shutdown").body();
        body["status"] = json!("shutting_down");
        body["active"] = json!(s.active.load(Ordering::Relaxed));
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(json!({
        "status": "ok",
        "model": state.model_id,
        "active": s.active.load(Ordering::Relaxed),
        "queued": s.queued.load(Ordering::Relaxed),
    }))
    .into_response()
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render(&state.engine)).into_response()
}

pub async fn not_found() -> Response {
    ApiError::not_found(
        "No such endpoint. This server has /v1/chat/completions, /v1/completions, /v1/models, /v1/messages, /v1/messages/count_tokens, /v1/responses, /health and /metrics.",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::generation_cap;

    #[test]
    fn generations_leave_a_quarter_of_the_connections_free() {
        assert_eq!(generation_cap(512), 384);
        assert_eq!(generation_cap(4), 3);
        assert_eq!(generation_cap(3), 2);
        assert_eq!(generation_cap(2), 1);
        // One connection cannot be shared out: the one generation may take it.
        assert_eq!(generation_cap(1), 1);
        assert_eq!(generation_cap(0), 1);
    }
}
