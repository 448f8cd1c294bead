//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as the
//! coding agents that speak it expect: each request is translated into the server's chat
//! request (messages, tools, tool_choice, stop sequences, sampling) and goes through the same
//! pipeline as /v1/chat/completions (chat template, forced-call grammar, tool-call
//! recogniser, engine); only the answer's shape is Anthropic's: content blocks (`thinking` for
//! the reasoning of a template that thinks, `text`, `tool_use`), `stop_reason`, `usage`, the SSE events (message_start, content_block_start /
//! delta / stop, message_delta, message_stop), and errors as
//! `{"type": "error", "error": {"type", "message"}}` on every path under /v1/messages.
//!
//! Thinking blocks are signed as Anthropic's are: `signature` is base64 of an HMAC-SHA256 of
//! the thinking text under a key the process makes at start (streamed as a `signature_delta`
//! that closes the block). A thinking block sent back in an assistant turn reaches the template
//! as that turn's `reasoning_content` when its signature verifies: the model's own reasoning,
//! unaltered. One that does not (edited, signed by another server or by an earlier run of this
//! one, or unsigned) is accepted and left out of the prompt, as `redacted_thinking` blocks are:
//! a conversation carried over a restart goes on, without its old reasoning.

use std::collections::VecDeque;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use resin_engine::{Finish, FinishReason, GenEvent};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::generate::{event_stream, next_event, random_id, shutdown_error, EventSource, Gen, Kind, Output, TokenClock};
use crate::handlers::{body_bytes, prepare_chat, submit_chat};
use crate::openai::{parse, ChatRequest, CommonRequest, Stop};
use crate::tools::ToolCall;
use crate::{AppState, Usage};

/// Whether a path is one of the Messages API's (its errors take Anthropic's shape).
pub fn is_messages_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error object.
pub fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// An error as Anthropic's error response (its status, and Retry-After where it has one).
pub fn error_response(e: &ApiError) -> Response {
    let mut r = (e.status, Json(error_body(e.status, &e.message))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// An error response made elsewhere (OpenAI's shape from the HTTP layer: 401, 404, 405, 413,
/// 415, 503, ...) in Anthropic's shape, its status, headers and extensions kept. Responses
/// below 400, and those already in Anthropic's shape, pass as they are.
pub(crate) async fn reshape_error(resp: Response) -> Response {
    if resp.status().as_u16() < 400 {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let v: Option<Value> = serde_json::from_slice(&bytes).ok();
    if v.as_ref().is_some_and(|v| v["type"] == "error") {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let message = v
        .as_ref()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("The request failed: {}.", parts.status.canonical_reason().unwrap_or("error")));
    let mut r = (parts.status, Json(error_body(parts.status, &message))).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_LENGTH && k != header::CONTENT_TYPE {
            r.headers_mut().append(k, v.clone());
        }
    }
    r.extensions_mut().extend(parts.extensions);
    r
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// What a signature covers besides the text (so it signs nothing else this server might).
const SIGNED_AS: &[u8] = b"resin anthropic thinking v1\0";

/// The signature of a thinking block's text under `key`.
pub fn sign_thinking(key: &[u8], thinking: &str) -> String {
    BASE64.encode(hmac_sha256(key, &[SIGNED_AS, thinking.as_bytes()]))
}

/// Whether `signature` is `key`'s for `thinking`.
pub fn verify_thinking(key: &[u8], thinking: &str, signature: &str) -> bool {
    match BASE64.decode(signature) {
        Ok(sig) => crate::constant_time_eq(&sig, &hmac_sha256(key, &[SIGNED_AS, thinking.as_bytes()])),
        Err(_) => false,
    }
}

/// The request body of /v1/messages (and, without `max_tokens`, of count_tokens). Unknown
/// fields (`metadata`, `anthropic-beta` extras) are ignored.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    messages: Vec<Value>,
    system: Option<Value>,
    max_tokens: Option<i64>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    stream: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    /// Structured outputs: `{"type": "json_schema", "schema": {...}}` (also accepted inside
    /// `output_config` as its `format`).
    output_format: Option<Value>,
    output_config: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`: the chat template's
    /// `enable_thinking` (absent: the template's default).
    thinking: Option<Value>,
}

fn invalid(m: impl Into<String>) -> ApiError {
    ApiError::invalid(m)
}

/// A `text` field of a block, or a block list's texts joined (a system prompt, a tool
/// result's content).
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push(t),
                    (Some(kind), _) if kind != "text" => return Err(invalid(format!("{what}: blocks of type {kind:?} are not supported here; this model reads text."))),
                    _ => return Err(invalid(format!("{what}: a text block needs a string 'text'."))),
                }
            }
            Ok(out.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(invalid(format!("{what} must be a string or an array of text blocks."))),
    }
}

/// Anthropic's turns as the server's chat messages: the system prompt first; a user turn's
/// `tool_result` blocks as tool messages (in order, before its text); an assistant turn's
/// `tool_use` blocks as its tool calls, its `thinking` blocks whose signature verifies under
/// `key` as its `reasoning_content` (which a template that thinks may render; other thinking
/// blocks and `redacted_thinking` are accepted and dropped).
fn translate_messages(system: Option<&Value>, messages: &[Value], key: &[u8]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(sys) = system {
        let s = text_of(sys, "system")?;
        if !s.is_empty() {
            out.push(json!({"role": "system", "content": s}));
        }
    }
    if messages.is_empty() {
        return Err(invalid("messages: at least one message is required."));
    }
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| invalid(format!("{at}.role: a string role (user or assistant) is required.")))?;
        if role != "user" && role != "assistant" {
            return Err(invalid(format!("{at}.role: {role:?} is not one of user, assistant (the system prompt goes in 'system').")));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(b)) => b.clone(),
            None => return Err(invalid(format!("{at}.content: Field required."))),
            Some(_) => return Err(invalid(format!("{at}.content must be a string or an array of content blocks."))),
        };
        let mut texts: Vec<String> = Vec::new();
        let mut calls: Vec<Value> = Vec::new();
        let mut thoughts: Vec<String> = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content.{j}");
            let kind = b.get("type").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.type: a block type is required.")))?;
            match (role, kind) {
                (_, "text") => texts.push(b.get("text").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.text: a string is required.")))?.to_string()),
                ("assistant", "thinking") => {
                    let text = b.get("thinking").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.thinking: a string is required.")))?;
                    if verify_thinking(key, text, b.get("signature").and_then(Value::as_str).unwrap_or("")) {
                        thoughts.push(text.to_string());
                    } else {
                        tracing::info!(block = %bat, "a thinking block whose signature this server cannot verify is left out of the prompt");
                    }
                }
                (_, "thinking" | "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let id = b.get("id").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.id: a string is required.")))?;
                    let name = b.get("name").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.name: a string is required.")))?;
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    if !input.is_object() {
                        return Err(invalid(format!("{bat}.input must be an object.")));
                    }
                    calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
                }
                ("user", "tool_result") => {
                    let id = b.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| invalid(format!("{bat}.tool_use_id: a string is required.")))?;
                    let mut content = text_of(b.get("content").unwrap_or(&Value::Null), &format!("{bat}.content"))?;
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
                (_, other) => return Err(invalid(format!("{bat}: {role} blocks of type {other:?} are not supported (this server takes text, tool_use and tool_result)."))),
            }
        }
        match role {
            "assistant" => {
                let mut msg = json!({"role": "assistant", "content": texts.join("")});
                if !thoughts.is_empty() {
                    msg["reasoning_content"] = json!(thoughts.join("\n"));
                }
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
            _ => {
                // A turn of only tool results has no user text of its own.
                let only_results = texts.is_empty() && !blocks.is_empty();
                if !only_results {
                    out.push(json!({"role": "user", "content": texts.join("\n")}));
                }
            }
        }
    }
    Ok(out)
}

/// Anthropic's tools as OpenAI function tools.
fn translate_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
                return Err(invalid(format!("tools.{i}: tools of type {kind:?} (Anthropic's server tools) are not supported; declare client tools with name and input_schema.")));
            }
            let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| invalid(format!("tools.{i}.name: a string is required.")))?;
            let schema = t.get("input_schema").cloned().ok_or_else(|| invalid(format!("tools.{i}.input_schema: Field required.")))?;
            let mut f = json!({"name": name, "parameters": schema});
            if let Some(d) = t.get("description").and_then(Value::as_str) {
                f["description"] = json!(d);
            }
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// Anthropic's tool_choice as OpenAI's.
fn translate_tool_choice(c: &Value) -> Result<Value, ApiError> {
    let bad = || invalid("tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}.");
    Ok(match c.get("type").and_then(Value::as_str).ok_or_else(bad)? {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = c.get("name").and_then(Value::as_str).ok_or_else(|| invalid("tool_choice.name: a string is required for type \"tool\"."))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad()),
    })
}

/// Anthropic's structured-output format as OpenAI's `response_format`.
fn translate_output_format(f: &Value) -> Result<Value, ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("json_schema") => Ok(json!({"type": "json_schema", "json_schema": {"name": "output", "schema": f.get("schema").cloned().unwrap_or(Value::Null)}})),
        _ => Err(invalid("output_format must be {\"type\": \"json_schema\", \"schema\": {...}}.")),
    }
}

/// Anthropic's `thinking` as the chat template's `enable_thinking` (what Qwen3's template
/// reads; templates that do not think ignore it). `budget_tokens` is not enforced.
fn translate_thinking(t: &Value) -> Result<Value, ApiError> {
    match t.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Ok(json!({"enable_thinking": true})),
        Some("disabled") => Ok(json!({"enable_thinking": false})),
        _ => Err(invalid("thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}.")),
    }
}

/// The Messages request as the server's chat request. `need_max_tokens`: /v1/messages
/// requires it; count_tokens does not take it.
/// `key`: the key thinking blocks sent back are verified with.
fn translate(r: MessagesRequest, need_max_tokens: bool, key: &[u8]) -> Result<ChatRequest, ApiError> {
    if need_max_tokens && r.max_tokens.is_none() {
        return Err(invalid("max_tokens: Field required."));
    }
    let messages = translate_messages(r.system.as_ref(), &r.messages, key)?;
    let tools = r.tools.as_deref().map(translate_tools).transpose()?;
    let tool_choice = r.tool_choice.as_ref().map(translate_tool_choice).transpose()?;
    let format = r.output_format.as_ref().or_else(|| r.output_config.as_ref().and_then(|c| c.get("format"))).filter(|f| !f.is_null());
    let response_format = format.map(translate_output_format).transpose()?;
    let chat_template_kwargs = r.thinking.as_ref().filter(|t| !t.is_null()).map(translate_thinking).transpose()?;
    let common = CommonRequest {
        model: r.model,
        // Anthropic's default temperature.
        temperature: Some(r.temperature.unwrap_or(1.0)),
        top_p: r.top_p,
        top_k: r.top_k,
        max_tokens: if need_max_tokens { r.max_tokens } else { None },
        stop: r.stop_sequences.map(Stop::Many),
        stream: r.stream,
        response_format,
        ..CommonRequest::default()
    };
    Ok(ChatRequest { messages, tools, tool_choice, logprobs: None, top_logprobs: None, chat_template_kwargs, common })
}

fn parse_messages(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<MessagesRequest, ApiError> {
    let body = body_bytes(state, body)?;
    parse::<MessagesRequest>(&body).map_err(|mut e| {
        // Anthropic's errors name the field in the message (they have no `param`).
        if let Some(p) = e.param.take() {
            if !e.message.contains(&p) {
                e.message = format!("{p}: {}", e.message);
            }
        }
        e
    })
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = Instant::now();
    let gen = parse_messages(&state, body).and_then(|r| translate(r, true, &state.thinking_key)).and_then(|req| {
        let job = prepare_chat(&state, &req)?;
        let stream = job.plan.stream;
        Ok((submit_chat(&state, job, Kind::Chat, "/v1/messages", t0)?, stream))
    });
    match gen {
        Ok((gen, true)) => stream(gen),
        Ok((gen, false)) => collect(gen).await,
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as /v1/messages would render it.
pub async fn count_tokens(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let n = parse_messages(&state, body).and_then(|r| translate(r, false, &state.thinking_key)).and_then(|req| Ok(prepare_chat(&state, &req)?.ids.len()));
    match n {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(&e),
    }
}

fn stop_reason(f: &Finish, calls: &[ToolCall]) -> (&'static str, Value) {
    if !calls.is_empty() {
        return ("tool_use", Value::Null);
    }
    match (f.reason, &f.stop_string) {
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        (FinishReason::Stop, Some(s)) => ("stop_sequence", json!(s)),
        (FinishReason::Stop, None) => ("end_turn", Value::Null),
    }
}

/// A call's id as Anthropic writes them (`toolu_`).
fn tool_use_id(c: &ToolCall) -> String {
    match c.id.strip_prefix("call_") {
        Some(r) => format!("toolu_{r}"),
        None => c.id.clone(),
    }
}

fn tool_input(c: &ToolCall) -> Value {
    serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}))
}

async fn collect(mut gen: Gen) -> Response {
    let (text, _, finish) = match gen.run_to_end().await {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let Output { reasoning, content, calls } = gen.split_output(text);
    let mut blocks = Vec::new();
    if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
        let signature = sign_thinking(&gen.state.thinking_key, &r);
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": signature}));
    }
    if !content.is_empty() {
        blocks.push(json!({"type": "text", "text": content}));
    }
    for c in &calls {
        blocks.push(json!({"type": "tool_use", "id": tool_use_id(c), "name": c.name, "input": tool_input(c)}));
    }
    let (reason, seq) = stop_reason(&finish, &calls);
    let body = json!({
        "id": random_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": gen.state.model_id,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": {"input_tokens": finish.prompt_tokens, "output_tokens": finish.completion_tokens},
    });
    let mut r = Json(body).into_response();
    r.extensions_mut().insert(Usage { prompt: finish.prompt_tokens, completion: finish.completion_tokens });
    r
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// The streamed answer: Anthropic's SSE events.
fn stream(gen: Gen) -> Response {
    let id = random_id("msg_");
    let start = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": gen.state.model_id, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0},
        },
    });
    let mut pending = VecDeque::new();
    pending.push_back(event("message_start", &start));
    pending.push_back(event("ping", &json!({"type": "ping"})));
    event_stream(AnthSse { gen, pending, open: None, blocks: 0, thinking: String::new(), done: false, finished: None, clock: TokenClock { last: None, tokens: 0 } })
}

impl EventSource for AnthSse {
    fn next_bytes(&mut self) -> impl std::future::Future<Output = Option<Bytes>> + Send {
        AnthSse::next_bytes(self)
    }
}

struct AnthSse {
    gen: Gen,
    pending: VecDeque<Bytes>,
    /// The kind of the block open at index `blocks - 1`, if one is.
    open: Option<BlockKind>,
    /// Content blocks started so far.
    blocks: usize,
    /// The open thinking block's text so far (signed when it closes).
    thinking: String,
    done: bool,
    finished: Option<&'static str>,
    clock: TokenClock,
}

/// The streamed content blocks that carry text deltas.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Thinking,
    Text,
}

impl BlockKind {
    /// The block's type, the field its text goes in, and its delta's type.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            BlockKind::Thinking => ("thinking", "thinking_delta"),
            BlockKind::Text => ("text", "text_delta"),
        }
    }
}

impl AnthSse {
    /// `t` as a delta of a block of `kind`, closing the open block of the other kind and
    /// starting one of this kind first where needed.
    fn delta(&mut self, kind: BlockKind, t: String) {
        if t.is_empty() {
            return;
        }
        let (name, delta) = kind.names();
        if self.open != Some(kind) {
            self.close();
            let block = match kind {
                BlockKind::Thinking => json!({"type": name, (name): "", "signature": ""}),
                BlockKind::Text => json!({"type": name, (name): ""}),
            };
            self.pending.push_back(event("content_block_start", &json!({"type": "content_block_start", "index": self.blocks, "content_block": block})));
            self.blocks += 1;
            self.open = Some(kind);
        }
        let i = self.blocks - 1;
        if kind == BlockKind::Thinking {
            self.thinking.push_str(&t);
        }
        self.pending.push_back(event("content_block_delta", &json!({"type": "content_block_delta", "index": i, "delta": {"type": delta, (name): t}})));
    }

    /// Stop the open block, if one is; a thinking block's last delta is its signature.
    fn close(&mut self) {
        let Some(kind) = self.open.take() else { return };
        let i = self.blocks - 1;
        if kind == BlockKind::Thinking {
            let signature = sign_thinking(&self.gen.state.thinking_key, &std::mem::take(&mut self.thinking));
            self.pending.push_back(event("content_block_delta", &json!({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": signature}})));
        }
        self.pending.push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": i})));
    }

    fn fail(&mut self, e: &ApiError) {
        self.pending.push_back(event("error", &error_body(e.status, &e.message)));
        self.finished = Some("error");
        self.done = true;
    }

    fn end(&mut self, f: Finish) {
        self.gen.state.metrics.ttft.observe(f.time_to_first_token);
        let (held, calls) = self.gen.finish_pieces();
        self.delta(BlockKind::Thinking, held.reasoning);
        self.delta(BlockKind::Text, held.content);
        self.close();
        for c in &calls {
            let i = self.blocks;
            self.blocks += 1;
            let start = json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": tool_use_id(c), "name": c.name, "input": {}}});
            self.pending.push_back(event("content_block_start", &start));
            let args = serde_json::to_string(&tool_input(c)).unwrap_or_else(|_| "{}".into());
            self.pending.push_back(event("content_block_delta", &json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": args}})));
            self.pending.push_back(event("content_block_stop", &json!({"type": "content_block_stop", "index": i})));
        }
        let (reason, seq) = stop_reason(&f, &calls);
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": {"input_tokens": f.prompt_tokens, "output_tokens": f.completion_tokens},
        });
        self.pending.push_back(event("message_delta", &delta));
        self.pending.push_back(event("message_stop", &json!({"type": "message_stop"})));
        self.finished = Some(reason);
        self.done = true;
    }

    async fn next_bytes(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            let ev = match next_event(&mut self.gen.handle, &mut self.gen.phase).await {
                Ok(ev) => ev,
                Err(()) => {
                    self.fail(&shutdown_error());
                    self.finished = Some("server_shutdown");
                    continue;
                }
            };
            match ev {
                Some(GenEvent::Delta { ids, text, .. }) => {
                    self.clock.tick(&self.gen.state, ids.len());
                    let shown = self.gen.push_piece(text);
                    self.delta(BlockKind::Thinking, shown.reasoning);
                    self.delta(BlockKind::Text, shown.content);
                }
                Some(GenEvent::Done(f)) => self.end(f),
                Some(GenEvent::Error(e)) => {
                    let err = self.gen.failure(&e);
                    self.fail(&err)
                }
                None => self.fail(&ApiError::internal("The engine stopped during this generation.")),
            }
        }
    }
}

impl Drop for AnthSse {
    fn drop(&mut self) {
        self.gen.log_stream_end(self.finished, self.done && self.pending.is_empty(), self.gen.prompt_tokens, self.clock.tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"a test key";

    #[test]
    fn turns_translate_into_chat_messages() {
        let m = translate_messages(
            Some(&json!([{"type": "text", "text": "be brief"}])),
            &[
                json!({"role": "user", "content": "weather in Paris?"}),
                json!({"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "thanks"}
                ]}),
            ],
            KEY,
        )
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather in Paris?"}));
        assert_eq!(m[2]["tool_calls"][0]["function"], json!({"name": "get_weather", "arguments": {"city": "Paris"}}));
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}));
        assert_eq!(m[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(m.len(), 5);
        // A turn of tool results alone adds no user message.
        let m = translate_messages(None, &[json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": true}]})], KEY).unwrap();
        assert_eq!(m, vec![json!({"role": "tool", "tool_call_id": "t", "content": "Error: x"})]);
        assert!(translate_messages(None, &[], KEY).is_err());
        assert!(translate_messages(None, &[json!({"role": "system", "content": "x"})], KEY).is_err());
        assert!(translate_messages(None, &[json!({"role": "user", "content": [{"type": "image", "source": {}}]})], KEY).is_err());
    }

    #[test]
    fn signed_thinking_comes_back_as_reasoning() {
        let turn = |thinking: &str, signature: &str| {
            let content = json!([{"type": "thinking", "thinking": thinking, "signature": signature}, {"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "4"}]);
            translate_messages(
                None,
                &[
                    json!({"role": "user", "content": [{"type": "thinking", "thinking": "?", "signature": ""}, {"type": "text", "text": "hi"}]}),
                    json!({"role": "assistant", "content": content}),
                ],
                KEY,
            )
        };
        let sig = sign_thinking(KEY, "hmm");
        // Signed here: the assistant turn's reasoning_content; redacted thinking and a user
        // turn's thinking are accepted and dropped.
        let m = turn("hmm", &sig).unwrap();
        assert_eq!(m, vec![json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "4", "reasoning_content": "hmm"})]);
        // Altered, unsigned, signed under another key, or not base64: accepted, left out.
        let other = sign_thinking(b"another key", "hmm");
        for (t, s) in [("hmm!", sig.as_str()), ("hmm", ""), ("hmm", other.as_str()), ("hmm", "%%%"), ("hmm", &sig[..sig.len() - 4])] {
            assert_eq!(turn(t, s).unwrap()[1], json!({"role": "assistant", "content": "4"}), "{t:?} {s:?}");
        }
        let e = translate_messages(None, &[json!({"role": "assistant", "content": [{"type": "thinking", "signature": "x"}]})], KEY).unwrap_err();
        assert!(e.message.contains("messages.0.content.0.thinking"), "{e:?}");
    }

    #[test]
    fn signatures_are_hmac_sha256() {
        // RFC 4231, test case 2.
        let mac = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(&[0xaa; 131], &[b"Test Using Larger Than Block-Size Key - Hash Key First"]);
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
        let s = sign_thinking(KEY, "x");
        assert_eq!(BASE64.decode(&s).unwrap().len(), 32);
        assert!(verify_thinking(KEY, "x", &s) && !verify_thinking(KEY, "y", &s) && !verify_thinking(b"k2", "x", &s));
    }

    #[test]
    fn tools_and_choices_translate() {
        let t = translate_tools(&[json!({"name": "f", "description": "d", "input_schema": {"type": "object"}})]).unwrap();
        assert_eq!(t[0], json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}));
        assert!(translate_tools(&[json!({"type": "bash_20250124", "name": "bash"})]).is_err());
        assert!(translate_tools(&[json!({"name": "f"})]).is_err());
        assert_eq!(translate_tool_choice(&json!({"type": "any"})).unwrap(), json!("required"));
        assert_eq!(translate_tool_choice(&json!({"type": "tool", "name": "f"})).unwrap()["function"]["name"], "f");
        assert!(translate_tool_choice(&json!({"type": "sometimes"})).is_err());
    }

    #[test]
    fn thinking_maps_to_enable_thinking() {
        let req = |t: Value| {
            let r: MessagesRequest = serde_json::from_value(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "thinking": t})).unwrap();
            translate(r, true, KEY)
        };
        assert_eq!(req(json!({"type": "disabled"})).unwrap().chat_template_kwargs, Some(json!({"enable_thinking": false})));
        assert_eq!(req(json!({"type": "enabled", "budget_tokens": 1024})).unwrap().chat_template_kwargs, Some(json!({"enable_thinking": true})));
        assert_eq!(req(Value::Null).unwrap().chat_template_kwargs, None);
        assert!(req(json!({"type": "sometimes"})).is_err());
    }

    #[test]
    fn errors_have_anthropics_types() {
        assert_eq!(error_body(StatusCode::BAD_REQUEST, "m"), json!({"type": "error", "error": {"type": "invalid_request_error", "message": "m"}}));
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(error_type(StatusCode::NOT_FOUND), "not_found_error");
        assert_eq!(error_type(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
        assert_eq!(error_type(StatusCode::INTERNAL_SERVER_ERROR), "api_error");
        assert!(is_messages_path("/v1/messages") && is_messages_path("/v1/messages/count_tokens") && !is_messages_path("/v1/messagesx"));
    }
}
