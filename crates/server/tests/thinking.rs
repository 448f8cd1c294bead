//! Reasoning output end to end, over real HTTP, on small synthetic Qwen3 models (common/qwen3.rs):
//! the qwen3 architecture, Qwen3's vocabulary (Qwen2.5's, fetched with the registry's
//! Qwen2.5-Coder-0.5B, plus the four tokens Qwen3 added: `<tool_response>`, `</tool_response>`,
//! `<think>`, `</think>`) and Qwen3's real chat template (testdata/templates/qwen3.jinja).
//!
//! With random weights the model never writes `<think>` of its own accord: there the split is
//! exercised through a generation prompt that opens it (Qwen3-2507 Thinking's template, which
//! ends with `<|im_start|>assistant\n<think>\n`), so everything the model writes is reasoning,
//! which must come back as `reasoning_content` / a `thinking` block / a `reasoning` item and
//! never as content, and the template pass-through is checked on Qwen3's own template:
//! `enable_thinking: false` (and Anthropic's `thinking: disabled`) adds the empty think block's
//! four tokens to the prompt. The thinker's weights make it write
//! `<think>The user wants four.</think>\n\nFour!` itself on Qwen3's own template: its reasoning
//! must be split off on every route, streamed and not, Anthropic's thinking block signed, and
//! the signed block sent back must reach the prompt (an altered one must not).

mod common;
#[path = "common/qwen3.rs"]
mod qwen3;

use std::sync::{Arc, OnceLock};

use qwen3::{qwen3_file, Weights, QWEN3_TEMPLATE};
use resin_core::{Counters, KvCodec};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{AppState, ModelInfo, ServerConfig};
use serde_json::{json, Value as Json};

/// Qwen3's generation prompt block, and Qwen3-2507 Thinking's, which opens the reasoning.
const HYBRID_PROMPT: &str =
    "    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}";
const THINKING_PROMPT: &str = "    {{- '<|im_start|>assistant\\n<think>\\n' }}";

/// The synthetic Qwen3 files' bytes, made once per test binary.
fn model_bytes(weights: Weights) -> Vec<u8> {
    static RANDOM: OnceLock<Vec<u8>> = OnceLock::new();
    static THINKER: OnceLock<Vec<u8>> = OnceLock::new();
    let cell = match weights {
        Weights::Random => &RANDOM,
        Weights::Thinker => &THINKER,
    };
    cell.get_or_init(|| qwen3_file(weights)).clone()
}

struct Server {
    base: String,
    http: reqwest::Client,
}

/// A server on the synthetic model; `template`: the chat template to serve it with (None: the
/// file's own, Qwen3's).
fn start(template: Option<&str>) -> Server {
    start_with(Weights::Random, template)
}

fn start_with(weights: Weights, template: Option<&str>) -> Server {
    let file = Arc::new(GgufFile::from_bytes(model_bytes(weights)).expect("reading the model"));
    let cfg = ModelConfig::from_gguf(&file).expect("model config");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let from_file = ChatTemplate::from_gguf(&file).expect("chat template").expect("the file has a template");
    assert_eq!(from_file.source(), QWEN3_TEMPLATE);
    let template = match template {
        Some(src) => ChatTemplate::new(src, None, Some("<|im_end|>")).expect("template"),
        None => from_file,
    };
    let home = CpuHome::new(file.clone(), cfg, &CpuOptions { n_ctx: Some(512), regions: 2, codec: KvCodec::F16, threads: Some(2), progress: None }, Arc::new(Counters::default()))
        .expect("cpu home");
    let engine = Engine::start(Box::new(home), tokenizer.clone(), EngineConfig::default());
    let state = AppState::new(engine, ModelInfo { id: "qwen3-tiny".into(), tokenizer, template: Some(template) }, ServerConfig::default());
    Server { base: common::spawn(state), http: reqwest::Client::new() }
}

impl Server {
    async fn post(&self, path: &str, body: &Json) -> (u16, Json) {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("request");
        (r.status().as_u16(), r.json().await.unwrap_or(Json::Null))
    }

    /// A streamed request's events: (event name, data) in order.
    async fn stream(&self, path: &str, body: &Json) -> Vec<(String, Json)> {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("request");
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.expect("body");
        let mut out = Vec::new();
        for e in text.split("\n\n").filter(|e| !e.is_empty()) {
            let mut name = String::new();
            let mut data = Json::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = if d == "[DONE]" { json!("[DONE]") } else { serde_json::from_str(d).expect("event json") };
                }
            }
            out.push((name, data));
        }
        out
    }
}

fn chat(extra: Json) -> Json {
    let mut b = json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0, "max_tokens": 12});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn messages(extra: Json) -> Json {
    let mut b = json!({"model": "qwen3-tiny", "messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0, "max_tokens": 12});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// The thinking block's deltas from `events[i]` on (block `index`): its text, its signature
/// (the one signature_delta, which must come last) and the index of the event after them.
fn thinking_deltas(events: &[(String, Json)], mut i: usize, index: usize) -> (String, String, usize) {
    let mut t = String::new();
    while events[i].0 == "content_block_delta" && events[i].1["delta"]["type"] == "thinking_delta" {
        assert_eq!(events[i].1["index"], index);
        t += events[i].1["delta"]["thinking"].as_str().unwrap();
        i += 1;
    }
    let d = &events[i].1;
    assert_eq!((&events[i].0[..], &d["index"], &d["delta"]["type"]), ("content_block_delta", &json!(index), &json!("signature_delta")), "{d}");
    (t, d["delta"]["signature"].as_str().unwrap().to_string(), i + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_thinking_reaches_qwen3s_template() {
    let s = start(None);
    // The empty think block Qwen3's template writes when thinking is off: <think>, "\n\n",
    // </think>, "\n\n".
    let count = |thinking: Json| {
        let s = &s;
        async move {
            let mut b = json!({"messages": [{"role": "user", "content": "What is 2+2?"}]});
            if !thinking.is_null() {
                b["thinking"] = thinking;
            }
            let (st, v) = s.post("/v1/messages/count_tokens", &b).await;
            assert_eq!(st, 200, "{v}");
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let base = count(Json::Null).await;
    assert_eq!(count(json!({"type": "disabled"})).await, base + 4);
    assert_eq!(count(json!({"type": "enabled", "budget_tokens": 1024})).await, base);

    let (st, on) = s.post("/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(st, 200, "{on}");
    let (st, off) = s.post("/v1/chat/completions", &chat(json!({"chat_template_kwargs": {"enable_thinking": false}}))).await;
    assert_eq!(st, 200, "{off}");
    assert_eq!(off["usage"]["prompt_tokens"].as_u64().unwrap(), on["usage"]["prompt_tokens"].as_u64().unwrap() + 4);
    assert_eq!(on["usage"]["prompt_tokens"].as_u64().unwrap(), base);
    // A template that thinks answers with reasoning_content (null: this model wrote no <think>).
    for v in [&on, &off] {
        let m = &v["choices"][0]["message"];
        assert!(m.get("reasoning_content").is_some_and(|r| r.is_null() || r.is_string()), "{v}");
        assert!(m["content"].is_string(), "{v}");
    }

    // Bad kwargs are 400s naming the field; Anthropic's bad thinking is Anthropic's error.
    for bad in [json!("x"), json!([1]), json!({"messages": []}), json!({"add_generation_prompt": false})] {
        let (st, v) = s.post("/v1/chat/completions", &chat(json!({"chat_template_kwargs": bad}))).await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], "chat_template_kwargs", "{v}");
    }
    let (st, v) = s.post("/v1/messages", &messages(json!({"thinking": {"type": "sometimes"}}))).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["type"], "error", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_never_reaches_the_content() {
    let thinking = QWEN3_TEMPLATE.replace(HYBRID_PROMPT, THINKING_PROMPT);
    assert_ne!(thinking, QWEN3_TEMPLATE);
    let s = start(Some(&thinking));

    // Whole: the prompt opened the reasoning, the output (cut by max_tokens) is all reasoning.
    let (st, v) = s.post("/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning: {v}")).to_string();
    assert!(!reasoning.is_empty() && !reasoning.contains("<think>"), "{v}");
    assert_eq!(m["content"], "", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");

    // Streamed: the same reasoning in delta.reasoning_content, no content but the opening "".
    let events = s.stream("/v1/chat/completions", &chat(json!({"stream": true}))).await;
    let (mut r, mut c) = (String::new(), String::new());
    for (_, e) in &events {
        if e == "[DONE]" {
            continue;
        }
        let d = &e["choices"][0]["delta"];
        r += d["reasoning_content"].as_str().unwrap_or("");
        c += d["content"].as_str().unwrap_or("");
    }
    assert_eq!(r, reasoning);
    assert_eq!(c, "");
    assert_eq!(events.last().unwrap().1, "[DONE]");

    // Anthropic, whole: one thinking block, no text.
    let (st, v) = s.post("/v1/messages", &messages(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let signature = v["content"][0]["signature"].as_str().unwrap_or_default().to_string();
    assert_eq!(signature.len(), 44, "a base64 HMAC-SHA256: {v}");
    assert_eq!(v["content"], json!([{"type": "thinking", "thinking": reasoning, "signature": signature}]), "{v}");
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");

    // Anthropic, streamed: content_block_start (thinking), thinking_delta..., the signature,
    // content_block_stop.
    let events = s.stream("/v1/messages", &messages(json!({"stream": true}))).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"], "{names:?}");
    assert_eq!(events[2].1["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    let (t, sig, i) = thinking_deltas(&events, 3, 0);
    assert_eq!((t, sig), (reasoning.clone(), signature));
    assert_eq!(names[i..], ["content_block_stop", "message_delta", "message_stop"], "{names:?}");

    // Responses, whole: a reasoning item with all of it, then the message, whose text is empty.
    let resp = |extra: Json| {
        let mut b = json!({"input": "What is 2+2?", "temperature": 0, "max_output_tokens": 12});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (st, v) = s.post("/v1/responses", &resp(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "incomplete", "{v}");
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 2, "{v}");
    assert_eq!((&out[0]["type"], &out[0]["content"][0]["text"]), (&json!("reasoning"), &json!(reasoning)), "{v}");
    assert_eq!((&out[1]["type"], &out[1]["content"][0]["text"]), (&json!("message"), &json!("")), "{v}");
    assert!(v["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().is_some_and(|n| n > 0), "{v}");

    // Responses, streamed: reasoning_text deltas only, then the empty message; the final
    // response's output is the whole one's.
    let events = s.stream("/v1/responses", &resp(json!({"stream": true}))).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert!(!names.contains(&"response.output_text.delta"), "{names:?}");
    let t: String = events.iter().filter(|(n, _)| n == "response.reasoning_text.delta").map(|(_, e)| e["delta"].as_str().unwrap()).collect();
    assert_eq!(t, reasoning);
    let (last, end) = events.last().unwrap();
    assert_eq!(last, "response.incomplete");
    let items = |o: &Json| o.as_array().unwrap().iter().map(|i| (i["type"].clone(), i["content"][0]["text"].clone())).collect::<Vec<_>>();
    assert_eq!(items(&end["response"]["output"]), items(&v["output"]), "{end}");

    // Under a grammar the output is the answer, not reasoning.
    let (st, v) = s.post("/v1/chat/completions", &chat(json!({"response_format": {"type": "json_object"}, "max_tokens": 24}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(m["reasoning_content"].is_null(), "{v}");
    assert!(m["content"].as_str().is_some_and(|c| c.starts_with('{')), "{v}");
}

/// The thinker (see common/qwen3.rs) writes `<think>...</think>` itself, through the whole
/// generation path (prefill, decode, sampling, detokenizing, streaming), on Qwen3's own
/// template: the reasoning it generates is split off on every route, streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_own_thinking_is_split_off() {
    use qwen3::{THINKER_ANSWER as ANSWER, THINKER_REASONING as REASONING};
    let s = start_with(Weights::Thinker, None);
    let ask = |extra: Json| {
        let mut b = chat(json!({"max_tokens": 32}));
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };

    // The model's raw output, through completions on the rendered prompt: it opens the tag itself.
    let (st, raw) = s.post("/v1/completions", &json!({"prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "temperature": 0, "max_tokens": 32})).await;
    assert_eq!(st, 200, "{raw}");
    assert_eq!(raw["choices"][0]["text"], qwen3::THINKER_OUTPUT, "{raw}");
    let generated = raw["usage"]["completion_tokens"].clone();

    // Chat, whole: greedy and sampled, the reasoning apart from the answer.
    for extra in [json!({}), json!({"temperature": 1.0, "seed": 7})] {
        let (st, v) = s.post("/v1/chat/completions", &ask(extra)).await;
        assert_eq!(st, 200, "{v}");
        let m = &v["choices"][0]["message"];
        assert_eq!((&m["reasoning_content"], &m["content"]), (&json!(REASONING), &json!(ANSWER)), "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], generated, "{v}");
    }
    // Streamed: the same, every reasoning delta before the first content delta.
    let events = s.stream("/v1/chat/completions", &ask(json!({"stream": true}))).await;
    let (mut r, mut c) = (String::new(), String::new());
    for (_, e) in events.iter().filter(|(_, e)| e != "[DONE]") {
        let d = &e["choices"][0]["delta"];
        let piece = d["reasoning_content"].as_str().unwrap_or("");
        assert!(piece.is_empty() || c.is_empty(), "reasoning after the answer began: {e}");
        r += piece;
        c += d["content"].as_str().unwrap_or("");
    }
    assert_eq!((r.as_str(), c.as_str()), (REASONING, ANSWER));
    // Thinking off: the template's empty think block, the answer alone.
    let (st, v) = s.post("/v1/chat/completions", &ask(json!({"chat_template_kwargs": {"enable_thinking": false}}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!((&v["choices"][0]["message"]["reasoning_content"], &v["choices"][0]["message"]["content"]), (&Json::Null, &json!(ANSWER)), "{v}");

    // Anthropic, whole: a signed thinking block, then the text.
    let (st, v) = s.post("/v1/messages", &messages(json!({"max_tokens": 32}))).await;
    assert_eq!(st, 200, "{v}");
    let signature = v["content"][0]["signature"].as_str().unwrap_or_default().to_string();
    assert_eq!(signature.len(), 44, "{v}");
    assert_eq!(v["content"], json!([{"type": "thinking", "thinking": REASONING, "signature": signature}, {"type": "text", "text": ANSWER}]), "{v}");
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    // Streamed: the thinking block (its signature last), then the text block.
    let events = s.stream("/v1/messages", &messages(json!({"max_tokens": 32, "stream": true}))).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"], "{names:?}");
    let (t, sig, mut i) = thinking_deltas(&events, 3, 0);
    assert_eq!((t.as_str(), sig.as_str()), (REASONING, signature.as_str()));
    assert_eq!((names[i], &events[i].1["index"]), ("content_block_stop", &json!(0)));
    assert_eq!(events[i + 1].1["content_block"], json!({"type": "text", "text": ""}));
    i += 2;
    let mut text = String::new();
    while names[i] == "content_block_delta" {
        assert_eq!((&events[i].1["index"], &events[i].1["delta"]["type"]), (&json!(1), &json!("text_delta")));
        text += events[i].1["delta"]["text"].as_str().unwrap();
        i += 1;
    }
    assert_eq!(text, ANSWER);
    assert_eq!(names[i..], ["content_block_stop", "message_delta", "message_stop"], "{names:?}");
    assert_eq!(events[i + 1].1["delta"]["stop_reason"], "end_turn");

    // The signed block sent back in a tool loop reaches the template (Qwen3 renders the
    // reasoning of the assistant turns after the last user query); altered, it is accepted
    // and left out, as an unsigned one is.
    let loop_with = |thinking: &str, signature: &str| {
        json!({"model": "qwen3-tiny", "max_tokens": 32, "temperature": 0, "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking, "signature": signature},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]}]})
    };
    let count = |b: Json| {
        let s = &s;
        async move {
            let mut b = b;
            b.as_object_mut().unwrap().remove("max_tokens");
            let (st, v) = s.post("/v1/messages/count_tokens", &b).await;
            assert_eq!(st, 200, "{v}");
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let signed = count(loop_with(REASONING, &signature)).await;
    let altered = count(loop_with("The user wants five.", &signature)).await;
    let unsigned = count(loop_with(REASONING, "")).await;
    // The signed one adds "<think>\n" + the reasoning (5 tokens) + "\n</think>\n\n".
    assert!(signed > unsigned + 5 && altered == unsigned, "signed {signed}, altered {altered}, unsigned {unsigned}");
    for sig in [signature.as_str(), "", "not base64!"] {
        let (st, v) = s.post("/v1/messages", &loop_with(REASONING, sig)).await;
        assert_eq!(st, 200, "{v}");
    }

    // Responses, whole and streamed: a reasoning item, then the message.
    let resp = json!({"input": "What is 2+2?", "temperature": 0, "max_output_tokens": 32});
    let (st, v) = s.post("/v1/responses", &resp).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    let items = |o: &Json| o.as_array().unwrap().iter().map(|i| (i["type"].clone(), i["content"][0]["text"].clone())).collect::<Vec<_>>();
    assert_eq!(items(&v["output"]), [(json!("reasoning"), json!(REASONING)), (json!("message"), json!(ANSWER))], "{v}");
    let mut streamed = resp.clone();
    streamed["stream"] = json!(true);
    let events = s.stream("/v1/responses", &streamed).await;
    let deltas = |kind: &str| events.iter().filter(|(n, _)| n == kind).map(|(_, e)| e["delta"].as_str().unwrap()).collect::<String>();
    assert_eq!((deltas("response.reasoning_text.delta").as_str(), deltas("response.output_text.delta").as_str()), (REASONING, ANSWER));
    let (last, end) = events.last().unwrap();
    assert_eq!(last, "response.completed");
    assert_eq!(items(&end["response"]["output"]), items(&v["output"]), "{end}");
}
