//! OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`).
//!
//! A request is translated into the server's chat request (its `input` items into chat
//! messages, its flat function tools into chat tools, `text.format` into `response_format`)
//! and goes through the same pipeline as /v1/chat/completions: chat template, grammar
//! (structured outputs, forced calls), reasoning splitter, tool-call recogniser, engine. Only
//! the answer's shape is the Responses API's: output items (`reasoning`, `message` with
//! `output_text`, `function_call`), `status`, `usage`, and the streamed events
//! (`response.created` ... `response.completed`, each with its `sequence_number`).
//!
//! A response is stored (unless `store: false`) with its conversation: the items it was given
//! (after its predecessor's) and the items it produced, all in the Responses API's own item
//! shape. `previous_response_id` prepends that conversation to the new input. Instructions are
//! not carried over (OpenAI's rule): each request's `instructions` become the system message in
//! front, so a continuation with the same instructions renders a prompt that starts with the
//! stored one's, and the engine reuses the K/V rows of that prefix as it does for any
//! conversation. The store keeps a bounded number of responses and drops the oldest first.
//! Every stored item has an `id` (the server makes one for an input item sent without), so
//! `input_items` can list a response's input (the chain's earlier items, then its own) a page at
//! a time, with OpenAI's cursor (`after`, `limit`, `order`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use resin_engine::{Finish, FinishReason, GenEvent};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generate::{event_stream, next_event, random_id, shutdown_error, EventSource, Gen, Kind, Output, TokenClock};
use crate::handlers::{body_bytes, prepare_chat, submit_chat};
use crate::openai::{parse, ChatRequest, CommonRequest};
use crate::tools::ToolCall;
use crate::{AppState, Usage};

/// One item of a conversation, in the Responses API's shape (shared between the stored
/// responses of one chain).
type Item = Arc<Value>;

/// A stored response: what `GET` returns and the conversation a continuation prepends.
struct Stored {
    response: Value,
    conversation: Vec<Item>,
    /// How many of `conversation`'s items were the response's input (its predecessor's
    /// conversation and the request's items; the rest are its output).
    inputs: usize,
}

/// The stored responses, at most `max` of them; the oldest is dropped first.
pub struct ResponseStore {
    max: usize,
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    order: VecDeque<String>,
    map: HashMap<String, Stored>,
}

impl ResponseStore {
    pub fn new(max: usize) -> Self {
        ResponseStore { max, inner: Mutex::new(StoreInner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, id: String, stored: Stored) {
        if self.max == 0 {
            return;
        }
        let mut s = self.lock();
        while s.map.len() >= self.max {
            match s.order.pop_front() {
                Some(old) => {
                    s.map.remove(&old);
                }
                None => break,
            }
        }
        s.order.push_back(id.clone());
        s.map.insert(id, stored);
    }

    fn conversation(&self, id: &str) -> Option<Vec<Item>> {
        self.lock().map.get(id).map(|s| s.conversation.clone())
    }

    fn response(&self, id: &str) -> Option<Value> {
        self.lock().map.get(id).map(|s| s.response.clone())
    }

    /// The items a stored response was generated from, oldest first.
    fn input_items(&self, id: &str) -> Option<Vec<Item>> {
        self.lock().map.get(id).map(|s| s.conversation[..s.inputs.min(s.conversation.len())].to_vec())
    }

    fn remove(&self, id: &str) -> bool {
        let mut s = self.lock();
        if s.map.remove(id).is_some() {
            s.order.retain(|o| o != id);
            true
        } else {
            false
        }
    }

    /// How many responses are held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The request body of /v1/responses. Unknown fields are ignored, as on the other routes;
/// the known ones this server cannot honour are refused by name (see [`refuse_unsupported`]).
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    text: Option<Value>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Extensions the chat route takes too.
    top_k: Option<i64>,
    seed: Option<i64>,
    stream: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    parallel_tool_calls: Option<bool>,
    max_tool_calls: Option<i64>,
    metadata: Option<Value>,
    user: Option<String>,
    /// `{"effort": ...}`: `none` turns a thinking template's thinking off (`enable_thinking`).
    reasoning: Option<Value>,
    chat_template_kwargs: Option<Value>,
    truncation: Option<String>,
    background: Option<bool>,
    conversation: Option<Value>,
    prompt: Option<Value>,
    include: Option<Vec<String>>,
    top_logprobs: Option<i64>,
}

fn invalid(m: impl Into<String>, param: impl Into<String>) -> ApiError {
    ApiError::invalid(m).param(param)
}

/// Fields whose meaning this server cannot give: a 400 naming each, never silence.
fn refuse_unsupported(r: &ResponsesRequest) -> Result<(), ApiError> {
    if r.background == Some(true) {
        return Err(invalid("background: true is not supported; this server answers in the request (stream it for progress).", "background"));
    }
    if r.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(invalid("conversation is not supported; continue a response with previous_response_id.", "conversation"));
    }
    if r.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(invalid("prompt (stored prompt templates) is not supported; send instructions and input.", "prompt"));
    }
    if r.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(invalid("truncation \"auto\" is not supported; an input longer than the context is refused (truncation \"disabled\").", "truncation"));
    }
    if r.top_logprobs.is_some_and(|k| k != 0) {
        return Err(invalid("top_logprobs is not supported on /v1/responses; use /v1/chat/completions for log-probabilities.", "top_logprobs"));
    }
    // Reasoning needs no opt-in here (a thinking template's reasoning is its own item);
    // anything else asks for data this server does not produce.
    if let Some(bad) = r.include.iter().flatten().find(|i| i.as_str() != "reasoning.encrypted_content") {
        return Err(invalid(format!("include {bad:?} is not supported (this server has no built-in tools and no log-probabilities on /v1/responses)."), "include"));
    }
    if r.max_tool_calls.is_some_and(|n| n < 1) {
        return Err(invalid("max_tool_calls must be at least 1.", "max_tool_calls"));
    }
    Ok(())
}

/// The text of a message's content: a string, or its text parts joined (`input_text`,
/// `output_text`, a refusal's text); any other part (images, files, audio) is refused.
fn content_text(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let pat = format!("{at}[{j}]");
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("input_text");
                let field = match kind {
                    "input_text" | "output_text" | "text" => "text",
                    "refusal" => "refusal",
                    other => return Err(invalid(format!("{pat}: content parts of type {other:?} are not supported; this model reads text."), pat)),
                };
                let t = p.get(field).and_then(Value::as_str).ok_or_else(|| invalid(format!("{pat}: a {kind} part needs a string '{field}'."), pat.clone()))?;
                texts.push(t);
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(invalid(format!("{at} must be a string or an array of content parts."), at)),
    }
}

/// The `input` as a list of items: a string is one user message.
fn input_items(input: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![json!({"type": "message", "role": "user", "content": s})]),
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(_) => Err(invalid("input must be a string or an array of input items.", "input")),
    }
}

/// An input item as it is stored and listed (`GET /v1/responses/{id}/input_items`): with an
/// `id` (made where the client sent none) and, for a message, the API's full item shape (its
/// `type`, `status`, and its text as one content part). Its meaning is unchanged: it renders
/// the same prompt. Anything that is not an object is left for [`items_to_messages`] to refuse.
fn recorded(item: Value) -> Value {
    let Value::Object(mut o) = item else { return item };
    let kind = o.get("type").and_then(Value::as_str).unwrap_or("message").to_string();
    if kind == "message" {
        o.insert("type".into(), json!("message"));
        if let Some(Value::String(text)) = o.get("content") {
            let part = if o.get("role").and_then(Value::as_str) == Some("assistant") { text_part(text) } else { json!({"type": "input_text", "text": text}) };
            o.insert("content".into(), json!([part]));
        }
        o.entry("status").or_insert_with(|| json!("completed"));
    }
    let has_id = matches!(o.get("id"), Some(Value::String(i)) if !i.is_empty());
    if !has_id {
        let prefix = match kind.as_str() {
            "message" => "msg_",
            "function_call" => "fc_",
            "function_call_output" => "fco_",
            "reasoning" => "rs_",
            _ => "item_",
        };
        o.insert("id".into(), json!(random_id(prefix)));
    }
    Value::Object(o)
}

/// A conversation's items (`at(i)` names item `i` in errors) as the server's chat messages:
/// messages as turns, `function_call` items as the assistant turn's tool calls (joined onto the
/// assistant message just before them, as one chat turn), `function_call_output` items as tool
/// messages, a `reasoning` item as the next assistant turn's `reasoning_content`.
fn items_to_messages(items: &[Item], at: &dyn Fn(usize) -> String) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn that later function calls may join.
    let mut assistant_open = false;
    for (i, item) in items.iter().enumerate() {
        let at = at(i);
        let obj = item.as_object().ok_or_else(|| invalid(format!("{at} must be an object."), at.clone()))?;
        let kind = obj.get("type").and_then(Value::as_str).unwrap_or("message");
        let field = |f: &str| format!("{at}.{f}");
        let string = |f: &str| -> Result<String, ApiError> {
            obj.get(f).and_then(Value::as_str).map(str::to_string).ok_or_else(|| invalid(format!("{}: a string is required.", field(f)), field(f)))
        };
        match kind {
            "message" => {
                let role = string("role")?;
                let role = match role.as_str() {
                    "user" | "assistant" | "system" | "developer" => role,
                    r => return Err(invalid(format!("{}: {r:?} is not one of user, assistant, system, developer.", field("role")), field("role"))),
                };
                let text = content_text(obj.get("content"), &field("content"))?;
                let mut m = json!({"role": role, "content": text});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                }
                assistant_open = role == "assistant";
                out.push(m);
            }
            "function_call" => {
                let call_id = string("call_id")?;
                let name = string("name")?;
                let arguments = match obj.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None => "{}".to_string(),
                    Some(_) => return Err(invalid(format!("{}: a JSON string is required.", field("arguments")), field("arguments"))),
                };
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                if !assistant_open {
                    let mut m = json!({"role": "assistant", "content": ""});
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                    out.push(m);
                    assistant_open = true;
                }
                let last = out.last_mut().and_then(Value::as_object_mut).ok_or_else(|| ApiError::internal("no assistant turn to join"))?;
                match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => {
                        last.insert("tool_calls".into(), json!([call]));
                    }
                }
            }
            "function_call_output" => {
                let call_id = string("call_id")?;
                let output = match obj.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(Some(v), &field("output"))?,
                    _ => return Err(invalid(format!("{}: a string (or an array of text parts) is required.", field("output")), field("output"))),
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                assistant_open = false;
            }
            "reasoning" => {
                let mut texts = Vec::new();
                for part in obj.get("content").and_then(Value::as_array).into_iter().flatten() {
                    texts.extend(part.get("text").and_then(Value::as_str));
                }
                if texts.is_empty() {
                    for part in obj.get("summary").and_then(Value::as_array).into_iter().flatten() {
                        texts.extend(part.get("text").and_then(Value::as_str));
                    }
                }
                reasoning = Some(texts.join("\n"));
            }
            "item_reference" => return Err(invalid(format!("{at}: item_reference is not supported; continue with previous_response_id or send the item itself."), at)),
            other => {
                return Err(invalid(format!("{at}: items of type {other:?} are not supported (this server takes message, function_call, function_call_output and reasoning)."), at))
            }
        }
    }
    Ok(out)
}

/// The Responses API's flat function tools as chat tools; built-in tools are refused by name.
fn translate_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tools[{i}]");
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if kind != "function" {
                return Err(invalid(format!("{at}: tools of type {kind:?} are not supported; this server runs no built-in tools (declare function tools)."), at));
            }
            let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| invalid(format!("{at}.name: a string is required."), format!("{at}.name")))?;
            // Chat's key order (name, description, parameters): the template renders the tools
            // as JSON, so the same tools render the same prompt on both routes.
            let mut f = Map::new();
            f.insert("name".into(), json!(name));
            if let Some(d) = t.get("description").and_then(Value::as_str) {
                f.insert("description".into(), json!(d));
            }
            f.insert("parameters".into(), t.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})));
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// The Responses API's tool_choice as chat's.
fn translate_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) | Value::Null => Ok(c.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| invalid("tool_choice.name: a string is required for type \"function\".", "tool_choice"))?;
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            Some(other) => Err(invalid(
                format!("tool_choice of type {other:?} is not supported (\"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}})."),
                "tool_choice",
            )),
            None => Err(invalid("tool_choice as an object needs a 'type'.", "tool_choice")),
        },
        _ => Err(invalid("tool_choice must be a string or an object.", "tool_choice")),
    }
}

/// `text.format` as chat's `response_format` (None: free text).
fn translate_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.filter(|t| !t.is_null()) else { return Ok(None) };
    if !text.is_object() {
        return Err(invalid("text must be an object ({\"format\": {...}}).", "text"));
    }
    let Some(f) = text.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut js = Map::new();
            js.insert("name".into(), f.get("name").cloned().unwrap_or_else(|| json!("output")));
            js.insert(
                "schema".into(),
                f.get("schema").cloned().ok_or_else(|| invalid("text.format.schema: a JSON schema is required for type \"json_schema\".", "text.format.schema"))?,
            );
            if let Some(s) = f.get("strict") {
                js.insert("strict".into(), s.clone());
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(invalid("text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"name\", \"schema\", \"strict\"}.", "text.format")),
    }
}

/// What a response echoes of its request, and what its end needs (storing it).
struct Ctx {
    id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    previous_response_id: Option<String>,
    temperature: f32,
    top_p: f32,
    tools: Vec<Value>,
    tool_choice: Value,
    text: Value,
    store: bool,
    metadata: Value,
    user: Option<String>,
    parallel_tool_calls: bool,
    max_tool_calls: Option<usize>,
    /// The conversation so far (the predecessor's, then this request's input items), to which
    /// the output is added when the response is stored.
    conversation: Vec<Item>,
}

impl Ctx {
    /// The response object, `status` one of in_progress, completed, incomplete, failed.
    fn response(&self, status: &str, output: Vec<Value>, usage: Value, error: Value) -> Value {
        let incomplete = if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null},
            "store": self.store,
            "temperature": self.temperature,
            "text": self.text,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": self.user,
            "metadata": self.metadata,
        })
    }

    /// Keep a finished response (unless `store: false`) with its conversation.
    fn store(&self, state: &AppState, response: &Value, output: &[Value]) {
        if !self.store {
            return;
        }
        let mut conversation = self.conversation.clone();
        let inputs = conversation.len();
        conversation.extend(output.iter().cloned().map(Arc::new));
        state.responses.insert(self.id.clone(), Stored { response: response.clone(), conversation, inputs });
    }

    /// The calls the request allows: all, the first (`parallel_tool_calls: false`), or
    /// `max_tool_calls` of them.
    fn limit_calls(&self, mut calls: Vec<ToolCall>) -> Vec<ToolCall> {
        let max = if self.parallel_tool_calls { self.max_tool_calls.unwrap_or(usize::MAX) } else { 1 };
        calls.truncate(max);
        calls
    }
}

/// Renames the chat route's parameter names in an error to the Responses API's.
fn rename_params(mut e: ApiError) -> ApiError {
    if let Some(p) = e.param.take() {
        let p = match p.as_str() {
            "messages" => "input".to_string(),
            "response_format" => "text.format".to_string(),
            "max_tokens" => "max_output_tokens".to_string(),
            _ => p,
        };
        e.param = Some(p);
    }
    e.message = e.message.replace("response_format", "text.format");
    e
}

/// Check a request and make it the server's chat request, with what its response echoes.
fn translate(state: &AppState, r: ResponsesRequest) -> Result<(ChatRequest, Ctx), ApiError> {
    refuse_unsupported(&r)?;
    let n_ctx = state.engine.n_ctx();
    if let Some(m) = r.max_output_tokens {
        if m < 1 || m as u64 > n_ctx as u64 {
            return Err(invalid(format!("max_output_tokens must be between 1 and the context length {n_ctx} (got {m})."), "max_output_tokens"));
        }
    }
    // The stored conversation first, then this request's input.
    let mut conversation: Vec<Item> = match &r.previous_response_id {
        Some(id) => state.responses.conversation(id).ok_or_else(|| {
            ApiError::not_found(format!("Previous response with id '{id}' not found (it was never stored, was stored with store: false, or is no longer held)."))
                .param("previous_response_id")
                .code("previous_response_not_found")
        })?,
        None => Vec::new(),
    };
    let held = conversation.len();
    let input = input_items(r.input.as_ref())?;
    if input.is_empty() && held == 0 {
        return Err(invalid("input: at least one input item (or a string) is required.", "input"));
    }
    conversation.extend(input.into_iter().map(recorded).map(Arc::new));
    let mut messages = Vec::new();
    if let Some(i) = r.instructions.as_deref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    let at = |i: usize| if i < held { format!("previous_response_id (item {i})") } else { format!("input[{}]", i - held) };
    messages.extend(items_to_messages(&conversation, &at)?);
    if messages.is_empty() {
        return Err(invalid("input: at least one message is required.", "input"));
    }
    let tools = r.tools.as_deref().map(translate_tools).transpose()?;
    let tool_choice = r.tool_choice.as_ref().map(translate_tool_choice).transpose()?;
    let response_format = translate_format(r.text.as_ref())?;
    let mut kwargs = match r.chat_template_kwargs {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err(invalid("chat_template_kwargs must be an object of template variables.", "chat_template_kwargs")),
    };
    if let Some(effort) = r.reasoning.as_ref().and_then(|x| x.get("effort")).and_then(Value::as_str) {
        kwargs.entry("enable_thinking").or_insert(json!(effort != "none"));
    }
    let temperature = r.temperature.unwrap_or(1.0);
    let top_p = r.top_p.unwrap_or(1.0);
    let common = CommonRequest {
        model: r.model.clone(),
        // OpenAI's defaults for this API.
        temperature: Some(temperature),
        top_p: Some(top_p),
        top_k: r.top_k,
        seed: r.seed,
        max_tokens: r.max_output_tokens,
        stream: r.stream,
        response_format,
        ..CommonRequest::default()
    };
    let chat =
        ChatRequest { messages, tools, tool_choice, logprobs: None, top_logprobs: None, chat_template_kwargs: (!kwargs.is_empty()).then_some(Value::Object(kwargs)), common };
    let ctx = Ctx {
        id: random_id("resp_"),
        created_at: now_secs(),
        model: state.model_id.clone(),
        instructions: r.instructions,
        max_output_tokens: r.max_output_tokens,
        previous_response_id: r.previous_response_id,
        temperature,
        top_p,
        tools: r.tools.unwrap_or_default(),
        tool_choice: r.tool_choice.filter(|c| !c.is_null()).unwrap_or_else(|| json!("auto")),
        text: r.text.filter(|t| t.get("format").is_some_and(|f| !f.is_null())).unwrap_or_else(|| json!({"format": {"type": "text"}})),
        store: r.store.unwrap_or(true),
        metadata: r.metadata.filter(|m| !m.is_null()).unwrap_or_else(|| json!({})),
        user: r.user,
        parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
        max_tool_calls: r.max_tool_calls.map(|n| n as usize),
        conversation,
    };
    Ok((chat, ctx))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `POST /v1/responses`.
pub async fn create(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let t0 = Instant::now();
    let gen = body_bytes(&state, body).and_then(|b| parse::<ResponsesRequest>(&b)).and_then(|r| {
        let (req, ctx) = translate(&state, r)?;
        let job = prepare_chat(&state, &req).map_err(rename_params)?;
        let stream = job.plan.stream;
        Ok((submit_chat(&state, job, Kind::Chat, "/v1/responses", t0).map_err(rename_params)?, ctx, stream))
    });
    match gen {
        Ok((gen, ctx, true)) => stream(gen, ctx),
        Ok((gen, ctx, false)) => collect(gen, ctx).await,
        Err(e) => e.into_response(),
    }
}

fn no_such_response(id: &str) -> ApiError {
    ApiError::not_found(format!("No response with id '{id}' is held (never stored, stored with store: false, deleted, or dropped as the store filled).")).param("response_id")
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn retrieve(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.responses.response(&id) {
        Some(r) => Json(r).into_response(),
        None => no_such_response(&id).into_response(),
    }
}

/// The query of `GET /v1/responses/{id}/input_items`, checked: (limit, ascending, after, before).
fn list_query(pairs: &[(String, String)]) -> Result<(usize, bool, Option<String>, Option<String>), ApiError> {
    let (mut limit, mut asc, mut after, mut before) = (20, false, None, None);
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => {
                limit = v.parse::<usize>().ok().filter(|n| (1..=100).contains(n)).ok_or_else(|| invalid(format!("limit must be an integer from 1 to 100 (got {v:?})."), "limit"))?
            }
            "order" => {
                asc = match v.as_str() {
                    "asc" => true,
                    "desc" => false,
                    _ => return Err(invalid(format!("order must be \"asc\" or \"desc\" (got {v:?})."), "order")),
                }
            }
            "after" => after = Some(v.clone()),
            "before" => before = Some(v.clone()),
            "include" | "include[]" if v != "reasoning.encrypted_content" => {
                return Err(invalid(format!("include {v:?} is not supported (this server has no built-in tools and no log-probabilities on /v1/responses)."), "include"))
            }
            // Other keys are ignored, as unknown body fields are.
            _ => {}
        }
    }
    if after.is_some() && before.is_some() {
        return Err(invalid("Send either after or before, not both.", "before"));
    }
    Ok((limit, asc, after, before))
}

/// `GET /v1/responses/{id}/input_items`: the items a stored response was generated from (its
/// predecessors' input and output, then its own input), as OpenAI's list object, `desc`
/// (newest first) unless `order=asc`, a page of `limit` (default 20, at most 100) after (or
/// before) the item `after` (`before`) names.
pub async fn list_input_items(State(state): State<AppState>, Path(id): Path<String>, query: Result<Query<Vec<(String, String)>>, QueryRejection>) -> Response {
    let page = || -> Result<Value, ApiError> {
        let Query(pairs) = query.map_err(|e| ApiError::invalid(format!("The query string cannot be read: {e}")))?;
        let (limit, asc, after, before) = list_query(&pairs)?;
        let mut items = state.responses.input_items(&id).ok_or_else(|| no_such_response(&id))?;
        if !asc {
            items.reverse();
        }
        let item_id = |i: &Item| i.get("id").and_then(Value::as_str).map(str::to_string);
        let find = |cursor: &str, param: &str| {
            items.iter().position(|i| item_id(i).as_deref() == Some(cursor)).ok_or_else(|| invalid(format!("No input item with id '{cursor}' in response '{id}'."), param))
        };
        let (start, end) = match (&after, &before) {
            (Some(a), _) => {
                let s = find(a, "after")? + 1;
                (s, (s + limit).min(items.len()))
            }
            (_, Some(b)) => {
                let e = find(b, "before")?;
                (e.saturating_sub(limit), e)
            }
            _ => (0, limit.min(items.len())),
        };
        // More in the direction of the paging: past the page's end (after), before its start (before).
        let has_more = if before.is_some() { start > 0 } else { end < items.len() };
        let data: Vec<Value> = items[start..end].iter().map(|i| (**i).clone()).collect();
        let first = data.first().and_then(|i| i.get("id").cloned()).unwrap_or(Value::Null);
        let last = data.last().and_then(|i| i.get("id").cloned()).unwrap_or(Value::Null);
        Ok(json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}))
    };
    match page() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if state.responses.remove(&id) {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        no_such_response(&id).into_response()
    }
}

/// The response's usage; `reasoning`: the reasoning text, whose tokens are counted apart.
fn usage(state: &AppState, f: &Finish, reasoning: &str) -> Value {
    let reasoning_tokens = if reasoning.is_empty() { 0 } else { state.tokenizer.encode(reasoning, false, false).map(|t| t.len()).unwrap_or(0).min(f.completion_tokens) };
    json!({
        "input_tokens": f.prompt_tokens,
        "input_tokens_details": {"cached_tokens": f.reused_tokens},
        "output_tokens": f.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// The response's status: incomplete when `max_output_tokens` cut it (and it made no call).
fn status(f: &Finish, calls: &[ToolCall]) -> &'static str {
    match f.reason {
        FinishReason::Length if calls.is_empty() => "incomplete",
        _ => "completed",
    }
}

/// The output items' ids, made as the items are.
struct Ids {
    reasoning: String,
    message: String,
}

impl Ids {
    fn new() -> Self {
        Ids { reasoning: random_id("rs_"), message: random_id("msg_") }
    }
}

fn fc_id(c: &ToolCall) -> String {
    match c.id.strip_prefix("call_") {
        Some(r) => format!("fc_{r}"),
        None => format!("fc_{}", c.id),
    }
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": [text_part(text)]})
}

fn call_item(c: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"id": fc_id(c), "type": "function_call", "call_id": c.id, "name": c.name, "arguments": arguments, "status": status})
}

/// The output items, in order: the reasoning (where there is some), the message (where there
/// is text, or nothing else), the calls. The stream opens the same items in the same order.
fn output_items(ids: &Ids, reasoning: &str, content: &str, calls: &[ToolCall], status: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(reasoning_item(&ids.reasoning, reasoning, "completed"));
    }
    if !content.is_empty() || calls.is_empty() {
        out.push(message_item(&ids.message, content, status));
    }
    out.extend(calls.iter().map(|c| call_item(c, &c.arguments, "completed")));
    out
}

async fn collect(mut gen: Gen, ctx: Ctx) -> Response {
    let (text, _, finish) = match gen.run_to_end().await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let Output { reasoning, content, calls } = gen.split_output(text);
    let calls = ctx.limit_calls(calls);
    let reasoning = reasoning.unwrap_or_default();
    let st = status(&finish, &calls);
    let output = output_items(&Ids::new(), &reasoning, &content, &calls, st);
    let body = ctx.response(st, output.clone(), usage(&gen.state, &finish, &reasoning), Value::Null);
    ctx.store(&gen.state, &body, &output);
    let mut r = Json(body).into_response();
    r.extensions_mut().insert(Usage { prompt: finish.prompt_tokens, completion: finish.completion_tokens });
    r
}

/// The output item a stream has open, taking text deltas.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

struct RespSse {
    gen: Gen,
    ctx: Ctx,
    ids: Ids,
    pending: VecDeque<Bytes>,
    seq: u64,
    open: Option<Open>,
    /// Output items added so far (the next one's `output_index`).
    items: usize,
    /// The finished items, in order.
    done_items: Vec<Value>,
    reasoning: String,
    content: String,
    message_opened: bool,
    done: bool,
    finished: Option<&'static str>,
    clock: TokenClock,
}

fn stream(gen: Gen, ctx: Ctx) -> Response {
    let mut s = RespSse {
        gen,
        ctx,
        ids: Ids::new(),
        pending: VecDeque::new(),
        seq: 0,
        open: None,
        items: 0,
        done_items: Vec::new(),
        reasoning: String::new(),
        content: String::new(),
        message_opened: false,
        done: false,
        finished: None,
        clock: TokenClock { last: None, tokens: 0 },
    };
    let r = s.ctx.response("in_progress", Vec::new(), Value::Null, Value::Null);
    s.event("response.created", json!({"response": r}));
    s.event("response.in_progress", json!({"response": r}));
    event_stream(s)
}

impl EventSource for RespSse {
    fn next_bytes(&mut self) -> impl std::future::Future<Output = Option<Bytes>> + Send {
        RespSse::next_bytes(self)
    }
}

impl RespSse {
    /// Queue one event: its `type` and `sequence_number` added to `data`.
    fn event(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.pending.push_back(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    /// The open item's id and output index.
    fn open_item(&self, kind: Open) -> (String, usize) {
        let id = match kind {
            Open::Reasoning => self.ids.reasoning.clone(),
            Open::Message => self.ids.message.clone(),
        };
        (id, self.items - 1)
    }

    fn start(&mut self, kind: Open) {
        self.close();
        let index = self.items;
        self.items += 1;
        self.open = Some(kind);
        let (item, part) = match kind {
            Open::Reasoning => {
                (json!({"id": self.ids.reasoning, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}), json!({"type": "reasoning_text", "text": ""}))
            }
            Open::Message => {
                self.message_opened = true;
                (json!({"id": self.ids.message, "type": "message", "role": "assistant", "status": "in_progress", "content": []}), text_part(""))
            }
        };
        let (id, _) = self.open_item(kind);
        self.event("response.output_item.added", json!({"output_index": index, "item": item}));
        self.event("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}));
    }

    /// `t` as a delta of an item of `kind`, starting it (and closing the other) first where needed.
    fn delta(&mut self, kind: Open, t: String) {
        if t.is_empty() {
            return;
        }
        if self.open != Some(kind) {
            self.start(kind);
        }
        let (id, index) = self.open_item(kind);
        match kind {
            Open::Reasoning => {
                self.reasoning.push_str(&t);
                self.event("response.reasoning_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t}));
            }
            Open::Message => {
                self.content.push_str(&t);
                self.event("response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}));
            }
        }
    }

    /// Finish the open item, if one is; `status` is the message's.
    fn close_with(&mut self, status: &str) {
        let Some(kind) = self.open.take() else { return };
        let (id, index) = self.open_item(kind);
        let item = match kind {
            Open::Reasoning => {
                let text = self.reasoning.clone();
                self.event("response.reasoning_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}));
                self.event("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "reasoning_text", "text": text}}));
                reasoning_item(&id, &text, "completed")
            }
            Open::Message => {
                let text = self.content.clone();
                self.event("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                self.event("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}));
                message_item(&id, &text, status)
            }
        };
        self.event("response.output_item.done", json!({"output_index": index, "item": item}));
        self.done_items.push(item);
    }

    fn close(&mut self) {
        self.close_with("completed");
    }

    fn fail(&mut self, e: &ApiError, finished: &'static str) {
        let code = if e.status.as_u16() == 503 { "server_shutdown" } else { "server_error" };
        self.event("error", json!({"code": code, "message": e.message, "param": null}));
        let r = self.ctx.response("failed", std::mem::take(&mut self.done_items), Value::Null, json!({"code": "server_error", "message": e.message}));
        self.event("response.failed", json!({"response": r}));
        self.finished = Some(finished);
        self.done = true;
    }

    fn end(&mut self, f: Finish) {
        self.gen.state.metrics.ttft.observe(f.time_to_first_token);
        let (held, calls) = self.gen.finish_pieces();
        let calls = self.ctx.limit_calls(calls);
        let st = status(&f, &calls);
        self.delta(Open::Reasoning, held.reasoning);
        self.delta(Open::Message, held.content);
        // A response with neither text nor calls still has its (empty) message.
        if !self.message_opened && calls.is_empty() {
            self.start(Open::Message);
        }
        self.close_with(st);
        for c in &calls {
            let index = self.items;
            self.items += 1;
            let id = fc_id(c);
            self.event("response.output_item.added", json!({"output_index": index, "item": call_item(c, "", "in_progress")}));
            self.event("response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": c.arguments}));
            self.event("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "name": c.name, "arguments": c.arguments}));
            let item = call_item(c, &c.arguments, "completed");
            self.event("response.output_item.done", json!({"output_index": index, "item": item}));
            self.done_items.push(item);
        }
        let output = std::mem::take(&mut self.done_items);
        let r = self.ctx.response(st, output.clone(), usage(&self.gen.state, &f, &self.reasoning), Value::Null);
        self.ctx.store(&self.gen.state, &r, &output);
        let kind = if st == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.event(kind, json!({"response": r}));
        self.finished = Some(if st == "incomplete" {
            "length"
        } else if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        });
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
                    self.fail(&shutdown_error(), "server_shutdown");
                    continue;
                }
            };
            match ev {
                Some(GenEvent::Delta { ids, text, .. }) => {
                    self.clock.tick(&self.gen.state, ids.len());
                    let shown = self.gen.push_piece(text);
                    self.delta(Open::Reasoning, shown.reasoning);
                    self.delta(Open::Message, shown.content);
                }
                Some(GenEvent::Done(f)) => self.end(f),
                Some(GenEvent::Error(e)) => self.fail(&ApiError::internal(format!("Generation failed: {e}")), "error"),
                None => self.fail(&ApiError::internal("The engine stopped during this generation."), "error"),
            }
        }
    }
}

impl Drop for RespSse {
    fn drop(&mut self) {
        self.gen.log_stream_end(self.finished, self.done && self.pending.is_empty(), self.gen.prompt_tokens, self.clock.tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(v: Value) -> Vec<Item> {
        v.as_array().unwrap().iter().cloned().map(Arc::new).collect()
    }

    fn msgs(v: Value) -> Result<Vec<Value>, ApiError> {
        items_to_messages(&items(v), &|i| format!("input[{i}]"))
    }

    #[test]
    fn items_become_chat_turns() {
        let m = msgs(json!([
            {"role": "developer", "content": "be brief"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "look it up"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]))
        .unwrap();
        assert_eq!(m[0], json!({"role": "developer", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather in Paris?"}));
        assert_eq!(m[2]["content"], "Let me look.");
        assert_eq!(m[2]["reasoning_content"], "look it up");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[2]["tool_calls"][0], json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}));
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}));
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "call_2", "content": "noon"}));
        assert_eq!(m.len(), 5);
        // A call with no assistant message before it makes its own turn.
        let m = msgs(json!([{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])).unwrap();
        assert_eq!(m[1]["role"], "assistant");
        assert_eq!(m[1]["tool_calls"][0]["id"], "c");
    }

    #[test]
    fn unsupported_items_are_named() {
        let e = msgs(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])).unwrap_err();
        assert!(e.message.contains("input_image") && e.param.as_deref() == Some("input[0].content[0]"), "{e:?}");
        let e = msgs(json!([{"type": "web_search_call", "id": "ws"}])).unwrap_err();
        assert!(e.message.contains("web_search_call"), "{e:?}");
        assert!(msgs(json!([{"type": "item_reference", "id": "x"}])).is_err());
        assert!(msgs(json!([{"role": "wizard", "content": "x"}])).is_err());
        assert!(msgs(json!([{"type": "function_call", "name": "f"}])).unwrap_err().message.contains("call_id"));
    }

    #[test]
    fn tools_choices_and_formats_translate() {
        let t = translate_tools(&[json!({"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true})]).unwrap();
        assert_eq!(t[0], json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}));
        let e = translate_tools(&[json!({"type": "web_search"})]).unwrap_err();
        assert!(e.message.contains("web_search") && e.param.as_deref() == Some("tools[0]"), "{e:?}");
        assert!(translate_tools(&[json!({"type": "function"})]).is_err());
        assert_eq!(translate_tool_choice(&json!("required")).unwrap(), json!("required"));
        assert_eq!(translate_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(), json!({"type": "function", "function": {"name": "f"}}));
        assert!(translate_tool_choice(&json!({"type": "file_search"})).unwrap_err().message.contains("file_search"));
        assert_eq!(translate_format(None).unwrap(), None);
        assert_eq!(translate_format(Some(&json!({"format": {"type": "text"}}))).unwrap(), None);
        assert_eq!(translate_format(Some(&json!({"format": {"type": "json_object"}}))).unwrap(), Some(json!({"type": "json_object"})));
        let s = json!({"type": "object"});
        assert_eq!(
            translate_format(Some(&json!({"format": {"type": "json_schema", "name": "x", "schema": s, "strict": true}}))).unwrap(),
            Some(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}))
        );
        assert!(translate_format(Some(&json!({"format": {"type": "json_schema", "name": "x"}}))).is_err());
        assert!(translate_format(Some(&json!({"format": {"type": "xml"}}))).is_err());
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let req = |extra: Value| {
            let mut v = json!({"input": "hi"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let r: ResponsesRequest = serde_json::from_value(v).unwrap();
            refuse_unsupported(&r).map_err(|e| e.param.unwrap_or_default())
        };
        assert_eq!(req(json!({})), Ok(()));
        assert_eq!(req(json!({"background": false, "truncation": "disabled", "include": ["reasoning.encrypted_content"]})), Ok(()));
        assert_eq!(req(json!({"background": true})), Err("background".into()));
        assert_eq!(req(json!({"conversation": "conv_1"})), Err("conversation".into()));
        assert_eq!(req(json!({"truncation": "auto"})), Err("truncation".into()));
        assert_eq!(req(json!({"include": ["file_search_call.results"]})), Err("include".into()));
        assert_eq!(req(json!({"top_logprobs": 3})), Err("top_logprobs".into()));
    }

    #[test]
    fn input_items_are_recorded_with_ids() {
        let r = recorded(json!({"role": "user", "content": "hi"}));
        assert_eq!(r["type"], "message");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["content"], json!([{"type": "input_text", "text": "hi"}]));
        assert!(r["id"].as_str().is_some_and(|i| i.starts_with("msg_")), "{r}");
        let a = recorded(json!({"type": "message", "role": "assistant", "content": "ok", "id": "msg_mine"}));
        assert_eq!((&a["id"], &a["content"][0]["type"]), (&json!("msg_mine"), &json!("output_text")));
        let o = recorded(json!({"type": "function_call_output", "call_id": "c", "output": "sunny"}));
        assert!(o["id"].as_str().is_some_and(|i| i.starts_with("fco_")) && o.get("status").is_none(), "{o}");
        // Recording changes nothing of what the item renders; non-objects pass to be refused.
        let items = |v: Vec<Value>| v.into_iter().map(Arc::new).collect::<Vec<_>>();
        let plain = vec![json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "yo"})];
        let rec: Vec<Value> = plain.iter().cloned().map(recorded).collect();
        let at = |i: usize| format!("input[{i}]");
        assert_eq!(items_to_messages(&items(plain), &at).unwrap(), items_to_messages(&items(rec), &at).unwrap());
        assert_eq!(recorded(json!(3)), json!(3));
    }

    #[test]
    fn list_queries_are_checked() {
        let q = |pairs: &[(&str, &str)]| list_query(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>()).map_err(|e| e.param.unwrap_or_default());
        assert_eq!(q(&[]), Ok((20, false, None, None)));
        assert_eq!(q(&[("limit", "100"), ("order", "asc"), ("after", "msg_1"), ("include", "reasoning.encrypted_content")]), Ok((100, true, Some("msg_1".into()), None)));
        for (k, v) in [("limit", "0"), ("limit", "101"), ("limit", "x"), ("order", "up"), ("include", "file_search_call.results")] {
            assert_eq!(q(&[(k, v)]), Err(k.to_string()), "{k}={v}");
        }
        assert_eq!(q(&[("after", "a"), ("before", "b")]), Err("before".into()));
    }

    #[test]
    fn the_store_drops_the_oldest() {
        let s = ResponseStore::new(2);
        let put = |id: &str| s.insert(id.into(), Stored { response: json!({"id": id}), conversation: Vec::new(), inputs: 0 });
        put("a");
        put("b");
        put("c");
        assert!(s.response("a").is_none() && s.response("b").is_some() && s.response("c").is_some());
        assert!(s.remove("b") && !s.remove("b"));
        put("d");
        put("e");
        assert_eq!(s.len(), 2);
        assert!(s.response("c").is_none());
        let none = ResponseStore::new(0);
        none.insert("x".into(), Stored { response: json!({}), conversation: Vec::new(), inputs: 0 });
        assert!(none.is_empty());
    }

    #[test]
    fn output_items_in_order() {
        let ids = Ids { reasoning: "rs_1".into(), message: "msg_1".into() };
        let call = ToolCall { id: "call_abc".into(), name: "f".into(), arguments: "{}".into() };
        let out = output_items(&ids, "think", "", std::slice::from_ref(&call), "completed");
        assert_eq!(out.iter().map(|i| i["type"].as_str().unwrap()).collect::<Vec<_>>(), ["reasoning", "function_call"]);
        assert_eq!(out[1]["id"], "fc_abc");
        assert_eq!(out[1]["call_id"], "call_abc");
        let out = output_items(&ids, "", "", &[], "incomplete");
        assert_eq!(out, vec![message_item("msg_1", "", "incomplete")]);
    }
}
