//! The engine's events as a whole response or as SSE chunks in OpenAI's format.
//!
//! Both paths feed the same [`ReasoningSplitter`] (for a template that thinks) and then the same
//! [`ToolStreamer`], so a streamed answer and a whole one say the same.
//! A streamed response owns its [`GenHandle`]: when the client goes away the body is dropped,
//! the handle with it, and the engine frees the session at its next tick.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use resin_engine::{Finish, FinishReason, GenEvent, GenHandle, TokenLogprob};
use resin_model::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::http::{reached, InFlight, Phase};
use crate::reasoning::{ReasoningSplitter, Split};
use crate::tools::{ToolCall, ToolStreamer};
use crate::{AppState, LogsItself, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// One admitted generation and what its response needs.
pub struct Gen {
    pub state: AppState,
    pub handle: GenHandle,
    pub kind: Kind,
    pub tools: Option<ToolStreamer>,
    /// Keeps a thinking template's reasoning out of the content (None: all output is content).
    pub reasoning: Option<ReasoningSplitter>,
    pub include_usage: bool,
    /// Whether the response carries log-probabilities (the engine sends them with each token).
    pub logprobs: bool,
    /// When the request arrived (for the log line).
    pub t0: Instant,
    pub path: &'static str,
    pub prompt_tokens: usize,
    /// The server's shutdown phase: at [`Phase::Closing`] the generation is cancelled.
    pub phase: watch::Receiver<Phase>,
    /// Counts this generation as in flight while it lives.
    pub(crate) _in_flight: InFlight,
}

/// What a stream or a waiting request says when the shutdown grace is over.
pub(crate) fn shutdown_error() -> ApiError {
    let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_shutdown", "The server shut down before this generation finished; retry it.").code("server_shutdown");
    e.retry_after = Some(1);
    e
}

/// The next engine event, or None when the server is closing (the caller drops the handle,
/// which frees the session).
pub(crate) async fn next_event(handle: &mut GenHandle, phase: &mut watch::Receiver<Phase>) -> Result<Option<GenEvent>, ()> {
    tokio::select! {
        ev = handle.next() => Ok(ev),
        _ = reached(phase, Phase::Closing) => Err(()),
    }
}

pub(crate) fn random_id(prefix: &str) -> String {
    use rand::distributions::Alphanumeric;
    use rand::Rng;
    let r: String = rand::thread_rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("{prefix}{r}")
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn finish_reason(f: &Finish, calls: &[ToolCall]) -> &'static str {
    if !calls.is_empty() {
        return "tool_calls";
    }
    match f.reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage_json(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.reused_tokens},
    })
}

fn calls_json(calls: &[ToolCall]) -> Value {
    calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect()
}

/// A log-probability as JSON: a number, -9999 where it is not finite (OpenAI's stand-in for
/// an impossible token; JSON has no -inf).
fn lp_number(x: f32) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(-9999.0)
    }
}

/// A token's text as the logprobs list shows it (control tokens' text included; bytes that
/// are not whole UTF-8 characters replaced) and its raw bytes.
fn token_piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.token_bytes(id, true);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Chat's `logprobs.content` entries for `lps`.
fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> Vec<Value> {
    lps.iter()
        .map(|lp| {
            let (token, bytes) = token_piece(tok, lp.id);
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(id, l)| {
                    let (token, bytes) = token_piece(tok, id);
                    json!({"token": token, "logprob": lp_number(l), "bytes": bytes})
                })
                .collect();
            json!({"token": token, "logprob": lp_number(lp.logprob), "bytes": bytes, "top_logprobs": top})
        })
        .collect()
}

/// The legacy completions `logprobs` object for `lps`; `offset`: the characters of output
/// before them (advanced past them).
fn legacy_logprobs(tok: &Tokenizer, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let (mut tokens, mut values, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for lp in lps {
        let (token, _) = token_piece(tok, lp.id);
        offsets.push(*offset);
        *offset += token.chars().count();
        tokens.push(token);
        values.push(lp_number(lp.logprob));
        let top: serde_json::Map<String, Value> = lp.top.iter().map(|&(id, l)| (token_piece(tok, id).0, lp_number(l))).collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
}

/// Tracks the time between tokens for the inter-token histogram.
pub(crate) struct TokenClock {
    pub last: Option<Instant>,
    pub tokens: usize,
}

impl TokenClock {
    pub fn tick(&mut self, state: &AppState, ids: usize) {
        if ids == 0 {
            return;
        }
        let now = Instant::now();
        if let Some(l) = self.last {
            state.metrics.inter_token.observe(now - l);
        }
        self.last = Some(now);
        self.tokens += ids;
        state.metrics.tokens(0, ids);
    }
}

impl Gen {
    /// What a generation that failed with `e` answers: 503 `device_lost` when the home's
    /// device failed (the engine says so before it ends the streams), else a 500.
    pub(crate) fn failure(&self, e: &str) -> ApiError {
        match self.state.engine.home_down() {
            Some(why) => ApiError::device_lost(why),
            None => ApiError::internal(format!("Generation failed: {e}")),
        }
    }

    /// Wait for the whole generation: its text, its tokens' log-probabilities (when asked
    /// for) and how it ended; an error response where it failed or the server closed.
    pub(crate) async fn run_to_end(&mut self) -> Result<(String, Vec<TokenLogprob>, Finish), ApiError> {
        let mut text = String::new();
        let mut lps: Vec<TokenLogprob> = Vec::new();
        let mut clock = TokenClock { last: None, tokens: 0 };
        let finish = loop {
            let ev = match next_event(&mut self.handle, &mut self.phase).await {
                Ok(ev) => ev,
                Err(()) => return Err(shutdown_error()),
            };
            match ev {
                Some(GenEvent::Delta { ids, text: t, logprobs }) => {
                    clock.tick(&self.state, ids.len());
                    text.push_str(&t);
                    lps.extend(logprobs);
                }
                Some(GenEvent::Done(f)) => break f,
                Some(GenEvent::Error(e)) => return Err(self.failure(&e)),
                None => return Err(ApiError::internal("The engine stopped during this generation.")),
            }
        };
        self.state.metrics.ttft.observe(finish.time_to_first_token);
        Ok((text, lps, finish))
    }

    /// The whole output as reasoning (None where the template does not think), content and
    /// tool calls (through the tool-call recogniser, when the request has one; the reasoning
    /// never holds calls).
    pub(crate) fn split_output(&mut self, text: String) -> Output {
        let (reasoning, text) = match self.reasoning.take() {
            Some(rs) => {
                let s = rs.split(&text);
                (Some(s.reasoning), s.content)
            }
            None => (None, text),
        };
        let (content, calls) = match self.tools.take() {
            Some(mut ts) => {
                let mut shown = ts.push(&text);
                let fin = ts.finish();
                shown.push_str(&fin.content);
                (shown, fin.calls)
            }
            None => (text, Vec::new()),
        };
        Output { reasoning, content, calls }
    }

    /// A streamed piece of output through the reasoning splitter and the tool-call recogniser:
    /// the reasoning and the content that may be shown now.
    pub(crate) fn push_piece(&mut self, text: String) -> Split {
        let mut s = match self.reasoning.as_mut() {
            Some(rs) => rs.push(&text),
            None => Split { reasoning: String::new(), content: text },
        };
        if let Some(ts) = self.tools.as_mut() {
            s.content = ts.push(&s.content);
        }
        s
    }

    /// The end of a streamed output: the reasoning and content held back, and the tool calls.
    pub(crate) fn finish_pieces(&mut self) -> (Split, Vec<ToolCall>) {
        let mut s = match self.reasoning.take() {
            Some(rs) => rs.finish(),
            None => Split::default(),
        };
        match self.tools.take() {
            Some(mut ts) => {
                let mut shown = ts.push(&s.content);
                let fin = ts.finish();
                shown.push_str(&fin.content);
                s.content = shown;
                (s, fin.calls)
            }
            None => (s, Vec::new()),
        }
    }

    /// Wait for the whole generation and answer it in one response.
    pub async fn collect(mut self) -> Response {
        let (text, lps, finish) = match self.run_to_end().await {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        let Output { reasoning, content, calls } = self.split_output(text);
        let reason = finish_reason(&finish, &calls);
        let tok = &self.state.tokenizer;
        let logprobs = match (self.logprobs, self.kind) {
            (false, _) => Value::Null,
            (true, Kind::Chat) => json!({"content": chat_logprobs(tok, &lps), "refusal": null}),
            (true, Kind::Completion) => legacy_logprobs(tok, &lps, &mut 0),
        };
        let body = match self.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(r) = reasoning {
                    // DeepSeek's and vLLM's field; null where the model did not reason.
                    message["reasoning_content"] = if r.is_empty() { Value::Null } else { Value::String(r) };
                }
                if !calls.is_empty() {
                    if content.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls_json(&calls);
                }
                json!({
                    "id": random_id("chatcmpl-"),
                    "object": "chat.completion",
                    "created": now_secs(),
                    "model": self.state.model_id,
                    "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}],
                    "usage": usage_json(&finish),
                })
            }
            Kind::Completion => json!({
                "id": random_id("cmpl-"),
                "object": "text_completion",
                "created": now_secs(),
                "model": self.state.model_id,
                "choices": [{"index": 0, "text": content, "logprobs": logprobs, "finish_reason": reason}],
                "usage": usage_json(&finish),
            }),
        };
        let mut r = Json(body).into_response();
        r.extensions_mut().insert(Usage { prompt: finish.prompt_tokens, completion: finish.completion_tokens });
        r
    }

    /// Answer as server-sent events, chunk by chunk, ending with `data: [DONE]`.
    pub fn stream(self) -> Response {
        let id = random_id(if self.kind == Kind::Chat { "chatcmpl-" } else { "cmpl-" });
        let prompt_tokens = self.prompt_tokens;
        let mut s = SseState {
            gen: self,
            id,
            created: now_secs(),
            pending: VecDeque::new(),
            done: false,
            finished: None,
            clock: TokenClock { last: None, tokens: 0 },
            prompt_tokens,
            text_offset: 0,
        };
        if s.gen.kind == Kind::Chat {
            let first = s.chunk(json!({"role": "assistant", "content": ""}), None);
            s.pending.push_back(first);
        }
        event_stream(s)
    }
}

/// A stream's state that yields its next bytes of server-sent events (None: the stream ends).
pub(crate) trait EventSource: Send + 'static {
    fn next_bytes(&mut self) -> impl std::future::Future<Output = Option<Bytes>> + Send;
}

/// The response that streams `source`'s events: the event-stream headers, no proxy buffering,
/// and the stream logs its own end.
pub(crate) fn event_stream<S: EventSource>(source: S) -> Response {
    let body = futures_util::stream::unfold(source, |mut s| async move {
        let b = s.next_bytes().await?;
        Some((Ok::<Bytes, Infallible>(b), s))
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r.extensions_mut().insert(LogsItself);
    r
}

/// A whole output taken apart.
pub(crate) struct Output {
    /// The reasoning, for a template that thinks (empty where the model did not reason).
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

struct SseState {
    gen: Gen,
    id: String,
    created: u64,
    pending: VecDeque<Bytes>,
    /// No more events will come (the final chunks are queued).
    done: bool,
    /// How it ended, for the log line ("stop", "length", "tool_calls", "error").
    finished: Option<&'static str>,
    clock: TokenClock,
    prompt_tokens: usize,
    /// Characters of output the legacy logprobs' `text_offset` has counted.
    text_offset: usize,
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseState {
    /// One chunk: a chat delta or a text piece, with its finish reason.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        sse(&self.chunk_value(delta, finish))
    }

    fn chunk_value(&self, delta: Value, finish: Option<&str>) -> Value {
        let mut v = match self.gen.kind {
            Kind::Chat => json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.gen.state.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            }),
            Kind::Completion => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.gen.state.model_id,
                "choices": [{"index": 0, "text": delta, "logprobs": null, "finish_reason": finish}],
            }),
        };
        if self.gen.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// A chat delta: `reasoning_content` when there is reasoning, `content` when there is
    /// content or nothing else (a chunk that carries log-probabilities alone).
    fn chat_delta(reasoning: String, text: String) -> Value {
        match (reasoning.is_empty(), text.is_empty()) {
            (true, _) => json!({"content": text}),
            (false, true) => json!({"reasoning_content": reasoning}),
            (false, false) => json!({"reasoning_content": reasoning, "content": text}),
        }
    }

    fn piece(&mut self, reasoning: String, text: String, lps: &[TokenLogprob]) -> Bytes {
        if !self.gen.logprobs || lps.is_empty() {
            return match self.gen.kind {
                Kind::Chat => self.chunk(Self::chat_delta(reasoning, text), None),
                Kind::Completion => self.chunk(Value::String(text), None),
            };
        }
        let tok = self.gen.state.tokenizer.clone();
        let (delta, logprobs) = match self.gen.kind {
            Kind::Chat => (Self::chat_delta(reasoning, text), json!({"content": chat_logprobs(&tok, lps), "refusal": null})),
            Kind::Completion => (Value::String(text), legacy_logprobs(&tok, lps, &mut self.text_offset)),
        };
        let mut v = self.chunk_value(delta, None);
        v["choices"][0]["logprobs"] = logprobs;
        sse(&v)
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
                    self.pending.push_back(sse(&shutdown_error().body()));
                    self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.finished = Some("server_shutdown");
                    self.done = true;
                    continue;
                }
            };
            match ev {
                Some(GenEvent::Delta { ids, text, logprobs }) => {
                    self.clock.tick(&self.gen.state, ids.len());
                    let shown = self.gen.push_piece(text);
                    // A token whose text is held back (a stop string may be forming, a tool
                    // call or a reasoning tag may be starting) still sends its log-probabilities.
                    if !shown.reasoning.is_empty() || !shown.content.is_empty() || (self.gen.logprobs && !logprobs.is_empty()) {
                        let c = self.piece(shown.reasoning, shown.content, &logprobs);
                        self.pending.push_back(c);
                    }
                }
                Some(GenEvent::Done(f)) => self.end(f),
                Some(GenEvent::Error(e)) => {
                    let err = self.gen.failure(&e);
                    self.pending.push_back(sse(&err.body()));
                    self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.finished = Some(if err.code == Some("device_lost") { "device_lost" } else { "error" });
                    self.done = true;
                }
                None => {
                    let err = ApiError::internal("The engine stopped during this generation.");
                    self.pending.push_back(sse(&err.body()));
                    self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    self.finished = Some("error");
                    self.done = true;
                }
            }
        }
    }

    /// Queue the last chunks: held content or tool calls, the finish reason, usage, [DONE].
    fn end(&mut self, f: Finish) {
        self.gen.state.metrics.ttft.observe(f.time_to_first_token);
        self.prompt_tokens = f.prompt_tokens;
        let (held, calls) = self.gen.finish_pieces();
        if !held.reasoning.is_empty() || !held.content.is_empty() {
            let c = self.piece(held.reasoning, held.content, &[]);
            self.pending.push_back(c);
        }
        for (i, c) in calls.iter().enumerate() {
            let head = json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]});
            let args = json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]});
            let (a, b) = (self.chunk(head, None), self.chunk(args, None));
            self.pending.push_back(a);
            self.pending.push_back(b);
        }
        let reason = finish_reason(&f, &calls);
        let last = match self.gen.kind {
            Kind::Chat => self.chunk(json!({}), Some(reason)),
            Kind::Completion => self.chunk(Value::String(String::new()), Some(reason)),
        };
        self.pending.push_back(last);
        if self.gen.include_usage {
            let object = if self.gen.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
            let u = json!({
                "id": self.id,
                "object": object,
                "created": self.created,
                "model": self.gen.state.model_id,
                "choices": [],
                "usage": usage_json(&f),
            });
            self.pending.push_back(sse(&u));
        }
        self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.finished = Some(reason);
        self.done = true;
    }
}

impl Gen {
    /// A stream's one log line, when it ends or its client leaves: how it `finished`, unless
    /// events were still waiting to be sent (`drained` false) or it never finished.
    pub fn log_stream_end(&self, finished: Option<&'static str>, drained: bool, prompt_tokens: usize, completion_tokens: usize) {
        let outcome = match (finished, drained) {
            (Some(r), true) => r,
            (Some(_), false) | (None, _) => "client gone",
        };
        tracing::info!(
            method = "POST",
            path = self.path,
            status = 200,
            latency_ms = self.t0.elapsed().as_secs_f64() * 1e3,
            prompt_tokens,
            completion_tokens,
            outcome,
            "request (streamed)"
        );
    }
}

impl EventSource for SseState {
    fn next_bytes(&mut self) -> impl std::future::Future<Output = Option<Bytes>> + Send {
        SseState::next_bytes(self)
    }
}

impl Drop for SseState {
    fn drop(&mut self) {
        self.gen.log_stream_end(self.finished, self.done && self.pending.is_empty(), self.prompt_tokens, self.clock.tokens);
    }
}
