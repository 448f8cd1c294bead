//! The server end to end on the real SmolLM2-135M (CPU home), over real HTTP on 127.0.0.1.
//!
//! Each test starts its own server (its own engine) so gauges and queues are its own.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use resin_core::{Counters, KvCodec};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{AppState, ModelInfo, ServerConfig};
use serde_json::{json, Value};

/// Where the test model is (the one place that knows).
/// The real SmolLM2, fetched by the hub on first use; a model that cannot be fetched fails.
fn smollm2_path() -> Option<PathBuf> {
    Some(resin_hub::ensure("smollm2-135m", false).unwrap_or_else(|e| panic!("fetching SmolLM2-135M: {e}")))
}

struct Opts {
    regions: usize,
    n_ctx: usize,
    max_queue: usize,
    api_key: Option<String>,
    max_body: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Opts { regions: 4, n_ctx: 256, max_queue: 64, api_key: None, max_body: 64 << 10 }
    }
}

struct Server {
    base: String,
    http: reqwest::Client,
}

/// Load the model, start an engine and a server on 127.0.0.1:0 in a thread of its own.
fn start(o: Opts) -> Option<Server> {
    let path = smollm2_path()?;
    let file = Arc::new(GgufFile::open(&path).expect("opening the model"));
    let cfg = ModelConfig::from_gguf(&file).expect("model config");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let template = ChatTemplate::from_gguf(&file).expect("chat template");
    let home = CpuHome::new(
        file.clone(),
        cfg,
        &CpuOptions { n_ctx: Some(o.n_ctx), regions: o.regions, codec: KvCodec::F16, threads: None, progress: None },
        Arc::new(Counters::default()),
    )
    .expect("cpu home");
    let engine = Engine::start(Box::new(home), tokenizer.clone(), EngineConfig { max_queue: o.max_queue, ..EngineConfig::default() });
    let cfg = ServerConfig { api_key: o.api_key, max_body_bytes: o.max_body, ..ServerConfig::default() };
    let state = AppState::new(engine, ModelInfo { id: "smollm2".into(), tokenizer, template }, cfg);
    Some(Server { base: common::spawn(state), http: reqwest::Client::new() })
}

impl Server {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.http.get(format!("{}{path}", self.base)).send().await.expect("request");
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    /// A streamed request: every `data:` payload, in order.
    async fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("request");
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let text = r.text().await.expect("body");
        assert!(text.ends_with("data: [DONE]\n\n"), "stream must end with [DONE]: {text:?}");
        text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.strip_prefix("data: ").expect("data line").to_string()).collect()
    }

    async fn metric(&self, name: &str) -> f64 {
        let (_, m) = self.get_text("/metrics").await;
        m.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(f64::NAN)
    }
}

fn chat_body(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens, "stream": stream})
}

/// The streamed chat text, and the last chunk's finish reason.
fn chat_stream_text(events: &[String]) -> (String, Option<String>, Option<Value>) {
    let mut text = String::new();
    let mut reason = None;
    let mut usage = None;
    for e in events {
        if e == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(e).expect("chunk json");
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        if let Some(c) = v["choices"].get(0) {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                reason = Some(r.to_string());
            }
        }
    }
    (text, reason, usage)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_openai_errors_and_the_server_keeps_serving() {
    let Some(s) = start(Opts { n_ctx: 64, ..Opts::default() }) else {
        return;
    };
    let url = format!("{}/v1/chat/completions", s.base);
    let check = |status: u16, body: &Value, want: u16| {
        assert_eq!(status, want, "{body}");
        let e = &body["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{body}");
    };
    // Invalid JSON.
    let r = s.http.post(&url).header("content-type", "application/json").body("{nope").send().await.unwrap();
    let st = r.status().as_u16();
    check(st, &r.json().await.unwrap(), 400);
    // Wrong types.
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": "hi"})).await;
    check(st, &b, 400);
    assert_eq!(b["error"]["param"], "messages");
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})).await;
    check(st, &b, 400);
    assert_eq!(b["error"]["param"], "temperature");
    // Unknown model.
    let (st, b) = s.post("/v1/chat/completions", &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})).await;
    check(st, &b, 404);
    assert_eq!(b["error"]["code"], "model_not_found");
    // max_tokens out of range.
    for m in [0, -5, 100_000] {
        let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": m})).await;
        check(st, &b, 400);
        assert_eq!(b["error"]["param"], "max_tokens");
    }
    // n other than 1.
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "n": 3})).await;
    check(st, &b, 400);
    // A prompt longer than the context: 400 with the counts.
    let long = "word ".repeat(200);
    let (st, b) = s.post("/v1/completions", &json!({"prompt": long, "max_tokens": 4})).await;
    check(st, &b, 400);
    let msg = b["error"]["message"].as_str().unwrap();
    let numbers: Vec<u64> = msg.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    assert!(numbers.contains(&64) && numbers.iter().any(|&n| n > 64), "the counts: {msg}");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    // A prompt too long whatever its tokens: refused by its length, before it is tokenized.
    let huge = "a".repeat(60 << 10);
    let bodies = [
        ("/v1/completions", json!({"prompt": huge, "max_tokens": 4}), "prompt"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": huge}], "max_tokens": 4}), "messages"),
    ];
    for (path, body, param) in bodies {
        let (st, b) = s.post(path, &body).await;
        check(st, &b, 400);
        assert_eq!(b["error"]["code"], "context_length_exceeded", "{path}");
        assert_eq!(b["error"]["param"], param, "{path}");
        assert!(b["error"]["message"].as_str().unwrap().contains("at least"), "{path}: {b}");
    }
    // Oversize body.
    let big = json!({"prompt": "a".repeat(100 << 10)});
    let (st, b) = s.post("/v1/completions", &big).await;
    check(st, &b, 413);
    // Bad tool choice, bad roles.
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})).await;
    check(st, &b, 400);
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "robot", "content": "x"}]})).await;
    check(st, &b, 400);
    // Unknown endpoint.
    let r = s.http.get(format!("{}/v1/nothing", s.base)).send().await.unwrap();
    let st = r.status().as_u16();
    check(st, &r.json().await.unwrap(), 404);
    // And it still serves.
    let (st, b) = s.post("/v1/chat/completions", &chat_body("Hi", 4, false)).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["object"], "chat.completion");
    assert_eq!(b["usage"]["completion_tokens"].as_u64().unwrap() + b["usage"]["prompt_tokens"].as_u64().unwrap(), b["usage"]["total_tokens"].as_u64().unwrap());
    let (st, m) = s.get_text("/metrics").await;
    assert_eq!(st, 200);
    assert!(m.contains("resin_requests_total{path=\"/v1/chat/completions\",status=\"400\"}"), "{m}");
    assert!(m.contains("resin_requests_total{path=\"/v1/completions\",status=\"413\"}"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_v1_only() {
    let Some(s) = start(Opts { api_key: Some("sekret-key".into()), ..Opts::default() }) else {
        return;
    };
    let models = format!("{}/v1/models", s.base);
    let r = s.http.get(&models).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["code"], "invalid_api_key");
    assert_eq!(s.http.get(&models).bearer_auth("wrong").send().await.unwrap().status().as_u16(), 401);
    assert_eq!(s.http.get(&models).bearer_auth("sekret-ke").send().await.unwrap().status().as_u16(), 401);
    let r = s.http.get(&models).bearer_auth("sekret-key").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["data"][0]["id"], "smollm2");
    let r = s.http.post(format!("{}/v1/chat/completions", s.base)).json(&chat_body("Hi", 2, false)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(s.get_text("/health").await.0, 200);
    assert_eq!(s.get_text("/metrics").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_equals_whole_under_greedy() {
    let Some(s) = start(Opts::default()) else {
        return;
    };
    // Chat.
    let (st, whole) = s.post("/v1/chat/completions", &chat_body("What is the capital of France?", 24, false)).await;
    assert_eq!(st, 200, "{whole}");
    let mut body = chat_body("What is the capital of France?", 24, true);
    body["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/chat/completions", &body).await;
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (text, reason, usage) = chat_stream_text(&events);
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    assert!(!text.is_empty());
    assert_eq!(reason.as_deref(), whole["choices"][0]["finish_reason"].as_str());
    let usage = usage.expect("a usage chunk");
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[k], whole["usage"][k], "{k}");
    }
    // The usage chunk has no choices and comes last before [DONE].
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]));

    // Completions, with a stop string that must not leak.
    let prompt = "The capital of France is";
    let (st, whole) = s.post("/v1/completions", &json!({"prompt": prompt, "temperature": 0, "max_tokens": 16})).await;
    assert_eq!(st, 200, "{whole}");
    let full = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(full.contains("Paris"), "{full:?}");
    let events = s.stream("/v1/completions", &json!({"prompt": prompt, "temperature": 0, "max_tokens": 16, "stream": true})).await;
    let mut text = String::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["object"], "text_completion");
        text += v["choices"][0]["text"].as_str().unwrap();
    }
    assert_eq!(text, full);
    // Stop at "Paris": the text before it, none of it after (streamed and whole).
    let cut = full.find("Paris").unwrap();
    let stop_body = json!({"prompt": prompt, "temperature": 0, "max_tokens": 16, "stop": ["Paris"]});
    let (_, stopped) = s.post("/v1/completions", &stop_body).await;
    assert_eq!(stopped["choices"][0]["text"].as_str().unwrap(), &full[..cut]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    let mut sb = stop_body.clone();
    sb["stream"] = json!(true);
    let events = s.stream("/v1/completions", &sb).await;
    let text: String = events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()).collect();
    assert_eq!(text, &full[..cut]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_the_counters() {
    let Some(s) = start(Opts::default()) else {
        return;
    };
    let (st, _) = s.post("/v1/chat/completions", &chat_body("Hello!", 6, false)).await;
    assert_eq!(st, 200);
    let (st, m) = s.get_text("/metrics").await;
    assert_eq!(st, 200);
    for name in [
        "resin_requests_total{path=\"/v1/chat/completions\",status=\"200\"} 1",
        "resin_prompt_tokens_total",
        "resin_generated_tokens_total",
        "resin_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "resin_inter_token_latency_seconds_count",
        "resin_queue_depth 0",
        "resin_active_sessions",
        "resin_nrow_steps_total",
        "resin_grouped_steps_total",
        "resin_wide_steps_total",
        "resin_prefill_windows_total",
        "resin_prefill_segment_windows_total",
        "resin_peel_steps_total",
        "resin_prompt_tokens_prefilled_total",
        "# TYPE resin_declines_total counter",
    ] {
        assert!(m.contains(name), "/metrics lacks {name}:\n{m}");
    }
    assert!(s.metric("resin_generated_tokens_total").await >= 1.0);
    assert!(s.metric("resin_prompt_tokens_prefilled_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_frees_its_session() {
    let Some(s) = start(Opts::default()) else {
        return;
    };
    let body = json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true, "stop": []});
    let r = s.http.post(format!("{}/v1/completions", s.base)).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut chunks = r.bytes_stream();
    // Wait until a token has come: the session is active.
    let mut got = 0;
    while got < 2 {
        let c = chunks.next().await.expect("a chunk").expect("bytes");
        got += c.iter().filter(|&&b| b == b'\n').count() / 2;
    }
    assert_eq!(s.metric("resin_active_sessions").await, 1.0);
    drop(chunks);
    let t0 = Instant::now();
    loop {
        if s.metric("resin_active_sessions").await == 0.0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the session was not freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Fewer than all 200 tokens were generated.
    assert!(s.metric("resin_generated_tokens_total").await < 200.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after() {
    let Some(s) = start(Opts { regions: 1, max_queue: 1, ..Opts::default() }) else {
        return;
    };
    let body = json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0});
    let url = format!("{}/v1/completions", s.base);
    let reqs = (0..4).map(|_| s.http.post(&url).json(&body).send());
    let resps = futures_util::future::join_all(reqs).await;
    let mut busy = 0;
    let mut ok = 0;
    for r in resps {
        let r = r.unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            503 => {
                assert!(r.headers().get("retry-after").is_some());
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["error"]["type"], "server_error");
                busy += 1;
            }
            other => panic!("status {other}"),
        }
    }
    assert!(ok >= 1 && busy >= 1, "ok {ok}, busy {busy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_streams_each_equal_to_its_prompt_alone() {
    let Some(s) = start(Opts { regions: 32, n_ctx: 128, ..Opts::default() }) else {
        return;
    };
    let subjects = ["cats", "the sea", "winter", "bread", "trains", "music", "the moon", "gardens"];
    let prompts: Vec<String> = (0..32).map(|i| format!("Write one sentence about {} (number {i}).", subjects[i % subjects.len()])).collect();
    let max_tokens = 12;
    let mut alone = Vec::new();
    for p in &prompts {
        let (st, b) = s.post("/v1/chat/completions", &chat_body(p, max_tokens, false)).await;
        assert_eq!(st, 200, "{b}");
        alone.push(b["choices"][0]["message"]["content"].as_str().unwrap().to_string());
    }
    let s = Arc::new(s);
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let s = s.clone();
            let body = chat_body(p, max_tokens, true);
            tokio::spawn(async move { chat_stream_text(&s.stream("/v1/chat/completions", &body).await) })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let (text, reason, _) = t.await.unwrap();
        assert!(reason.is_some(), "stream {i} did not finish");
        assert_eq!(text, alone[i], "stream {i} differs from its prompt run alone");
    }
    // More than 8 rows a step: balanced groups of token commands, or wide steps (the home
    // decides which).
    let grouped = s.metric("resin_grouped_steps_total").await;
    let wide = s.metric("resin_wide_steps_total").await;
    assert!(grouped + wide >= 1.0, "32 streams should have stepped in groups or wide steps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_are_valid_calls() {
    let Some(s) = start(Opts { n_ctx: 512, ..Opts::default() }) else {
        return;
    };
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city",
            "parameters": {"type": "object", "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"}
            }, "required": ["unit", "days"]}
        }
    }, {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]}}
    }]);
    let messages = json!([{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]);
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_time"}})] {
        let body = json!({"messages": messages, "tools": tools, "tool_choice": choice, "temperature": 0, "max_tokens": 60});
        let (st, b) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(st, 200, "{b}");
        let c = &b["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{b}");
        let call = &c["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match call["function"]["name"].as_str().unwrap() {
            "get_weather" => {
                assert!(args["unit"] == "celsius" || args["unit"] == "fahrenheit", "{args}");
                assert!(args["days"].is_i64(), "{args}");
            }
            "get_time" => assert!(args["utc"].is_boolean(), "{args}"),
            n => panic!("unexpected tool {n}"),
        }
        if choice.is_object() {
            assert_eq!(call["function"]["name"], "get_time");
        }

        // Streamed: the call comes as tool_calls deltas (id and name, then arguments).
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let events = s.stream("/v1/chat/completions", &sb).await;
        let mut name = None;
        let mut streamed_args = String::new();
        let mut reason = None;
        for e in events.iter().filter(|e| *e != "[DONE]") {
            let v: Value = serde_json::from_str(e).unwrap();
            let ch = &v["choices"][0];
            if let Some(tc) = ch["delta"].get("tool_calls") {
                assert_eq!(tc[0]["index"], 0);
                if let Some(n) = tc[0]["function"]["name"].as_str() {
                    assert!(tc[0]["id"].as_str().unwrap().starts_with("call_"));
                    name = Some(n.to_string());
                }
                streamed_args += tc[0]["function"]["arguments"].as_str().unwrap_or("");
            }
            if let Some(r) = ch["finish_reason"].as_str() {
                reason = Some(r.to_string());
            }
        }
        assert_eq!(reason.as_deref(), Some("tool_calls"));
        assert_eq!(name.as_deref(), call["function"]["name"].as_str());
        assert_eq!(streamed_args, call["function"]["arguments"].as_str().unwrap());
    }

    // A round trip: the call and its result go back in; the model answers in text.
    let body = json!({
        "messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function", "function": {"name": "get_time", "arguments": "{\"utc\": true}"}}]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "12:00"}
        ],
        "tools": tools, "tool_choice": "none", "temperature": 0, "max_tokens": 16
    });
    let (st, b) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{b}");
    assert!(b["choices"][0]["message"]["content"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_follow_the_greedy_output_streamed_and_whole() {
    let Some(s) = start(Opts { n_ctx: 512, ..Opts::default() }) else {
        return;
    };
    let mut body = chat_body("Name three colors.", 16, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(4);
    let (st, b) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{b}");
    let content = b["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert!(!content.is_empty());
    let mut text = String::new();
    for e in &content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 4, "{e}");
        // Greedy, no mask: the chosen token heads its top list, with the largest logprob.
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp, "{e}");
        assert!(lp <= 0.0);
        assert!(top.windows(2).all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()), "{e}");
        assert!(top.iter().map(|t| t["logprob"].as_f64().unwrap().exp()).sum::<f64>() <= 1.0 + 1e-4, "{e}");
        text += e["token"].as_str().unwrap();
    }
    assert_eq!(text, b["choices"][0]["message"]["content"].as_str().unwrap());

    // Streamed: the same entries, in chunks.
    body["stream"] = json!(true);
    let mut streamed = Vec::new();
    for e in s.stream("/v1/chat/completions", &body).await.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(c) = v["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(c.iter().cloned());
        }
    }
    assert_eq!(streamed, content);

    // A forced tool call (the grammar masks the row): the values are the raw model's, so the
    // chosen token may rank below its top list, never above its head.
    let tools = json!([{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"]}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Time?"}], "tools": tools, "tool_choice": "required", "temperature": 0, "max_tokens": 40, "logprobs": true, "top_logprobs": 2});
    let (st, b) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "tool_calls", "{b}");
    let content = b["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty());
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= e["top_logprobs"][0]["logprob"].as_f64().unwrap() + 1e-6, "{e}");
    }

    // Out of range, or top_logprobs alone: 400 in OpenAI's shape.
    for bad in [json!({"logprobs": true, "top_logprobs": 21}), json!({"top_logprobs": 1})] {
        let mut body = chat_body("hi", 2, false);
        body.as_object_mut().unwrap().extend(bad.as_object().unwrap().clone());
        let (st, b) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(st, 400, "{b}");
        assert_eq!(b["error"]["param"], "top_logprobs", "{b}");
    }
}
