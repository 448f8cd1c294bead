//! Reasoning output end to end, over real HTTP, on a small synthetic Qwen3 model: the qwen3
//! architecture with random weights, Qwen3's vocabulary (Qwen2.5's, fetched with the registry's
//! Qwen2.5-Coder-0.5B, plus the four tokens Qwen3 added: `<tool_response>`, `</tool_response>`,
//! `<think>`, `</think>`) and Qwen3's real chat template (testdata/templates/qwen3.jinja).
//!
//! Random weights never write `<think>` of their own accord, so the split of the reasoning is
//! exercised through a generation prompt that opens it (Qwen3-2507 Thinking's template, which
//! ends with `<|im_start|>assistant\n<think>\n`): everything the model writes is then reasoning,
//! which must come back as `reasoning_content` / a `thinking` block / a `reasoning` item and
//! never as content. The
//! template pass-through is checked on Qwen3's own template: `enable_thinking: false` (and
//! Anthropic's `thinking: disabled`) adds the empty think block's four tokens to the prompt.

mod common;

use std::sync::{Arc, OnceLock};

use resin_core::{Counters, KvCodec};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{AppState, ModelInfo, ServerConfig};
use serde_json::{json, Value as Json};

const QWEN3_TEMPLATE: &str = include_str!("../../../testdata/templates/qwen3.jinja");
/// Qwen3's generation prompt block, and Qwen3-2507 Thinking's, which opens the reasoning.
const HYBRID_PROMPT: &str =
    "    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}";
const THINKING_PROMPT: &str = "    {{- '<|im_start|>assistant\\n<think>\\n' }}";

const D: usize = 64;
const H: usize = 4;
const HKV: usize = 2;
const HD: usize = 16;
const FF: usize = 128;
const L: usize = 2;

/// The synthetic Qwen3 file's bytes (about 40 MB), made once per test binary.
fn model_bytes() -> Vec<u8> {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES
        .get_or_init(|| {
            let qwen = resin_hub::ensure("qwen2.5-coder-0.5b", false).unwrap_or_else(|e| panic!("fetching Qwen2.5-Coder-0.5B for its vocabulary: {e}"));
            let vocab = GgufFile::open(&qwen).expect("opening Qwen2.5-Coder");
            let mut g = GgufWriter::new();
            let u = |v: usize| Value::U32(v as u32);
            g.set("general.architecture", Value::String("qwen3".into()));
            g.set("general.name", Value::String("synthetic-qwen3-tiny".into()));
            g.set("qwen3.block_count", u(L));
            g.set("qwen3.embedding_length", u(D));
            g.set("qwen3.attention.head_count", u(H));
            g.set("qwen3.attention.head_count_kv", u(HKV));
            g.set("qwen3.attention.key_length", u(HD));
            g.set("qwen3.attention.value_length", u(HD));
            g.set("qwen3.feed_forward_length", u(FF));
            g.set("qwen3.context_length", u(4096));
            g.set("qwen3.rope.freq_base", Value::F32(1_000_000.0));
            g.set("qwen3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
            let mut n_vocab = 0;
            for (k, v) in vocab.metadata() {
                if !k.starts_with("tokenizer.") {
                    continue;
                }
                let v = match (k.as_str(), v) {
                    ("tokenizer.ggml.tokens", Value::Array(t, items)) => {
                        let mut items = items.clone();
                        for (id, text) in [(151665, "<tool_response>"), (151666, "</tool_response>"), (151667, "<think>"), (151668, "</think>")] {
                            items[id] = Value::String(text.into());
                        }
                        n_vocab = items.len();
                        Value::Array(*t, items)
                    }
                    ("tokenizer.ggml.token_type", Value::Array(t, items)) => {
                        let mut items = items.clone();
                        // User-defined, as in Qwen3's GGUFs.
                        items[151665..=151668].fill(Value::I32(4));
                        Value::Array(*t, items)
                    }
                    ("tokenizer.chat_template", _) => Value::String(QWEN3_TEMPLATE.into()),
                    _ => v.clone(),
                };
                g.set(k.clone(), v);
            }
            assert_eq!(n_vocab, 151936);
            let mut seed = 0x5eed_0f31_u64;
            let mut rnd = |n: usize, scale: f32, base: f32| -> Vec<u8> {
                (0..n)
                    .flat_map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (base + ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale).to_le_bytes()
                    })
                    .collect()
            };
            let mut tensors: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
            let mut mat = |name: String, rows: usize, cols: usize, scale: f32, t: &mut Vec<(String, Vec<u64>, Vec<u8>)>| {
                let b = rnd(rows * cols, scale, 0.0);
                t.push((name, vec![cols as u64, rows as u64], b));
            };
            mat("token_embd.weight".into(), n_vocab, D, 1.0, &mut tensors);
            for l in 0..L {
                mat(format!("blk.{l}.attn_q.weight"), H * HD, D, 0.3, &mut tensors);
                mat(format!("blk.{l}.attn_k.weight"), HKV * HD, D, 0.3, &mut tensors);
                mat(format!("blk.{l}.attn_v.weight"), HKV * HD, D, 0.3, &mut tensors);
                mat(format!("blk.{l}.attn_output.weight"), D, H * HD, 0.2, &mut tensors);
                mat(format!("blk.{l}.ffn_gate.weight"), FF, D, 0.3, &mut tensors);
                mat(format!("blk.{l}.ffn_up.weight"), FF, D, 0.3, &mut tensors);
                mat(format!("blk.{l}.ffn_down.weight"), D, FF, 0.2, &mut tensors);
            }
            let mut vecs = vec![("output_norm.weight".to_string(), D)];
            for l in 0..L {
                vecs.push((format!("blk.{l}.attn_norm.weight"), D));
                vecs.push((format!("blk.{l}.ffn_norm.weight"), D));
                vecs.push((format!("blk.{l}.attn_q_norm.weight"), HD));
                vecs.push((format!("blk.{l}.attn_k_norm.weight"), HD));
            }
            for (name, n) in vecs {
                let b = rnd(n, 0.2, 1.0);
                tensors.push((name, vec![n as u64], b));
            }
            for (name, dims, _) in &tensors {
                g.add_tensor(name.clone(), dims, GgmlType::F32).unwrap();
            }
            let refs: Vec<&[u8]> = tensors.iter().map(|t| t.2.as_slice()).collect();
            g.write_all_to_vec(&refs).unwrap()
        })
        .clone()
}

struct Server {
    base: String,
    http: reqwest::Client,
}

/// A server on the synthetic model; `template`: the chat template to serve it with (None: the
/// file's own, Qwen3's).
fn start(template: Option<&str>) -> Server {
    let file = Arc::new(GgufFile::from_bytes(model_bytes()).expect("reading the model"));
    let cfg = ModelConfig::from_gguf(&file).expect("model config");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let from_file = ChatTemplate::from_gguf(&file).expect("chat template").expect("the file has a template");
    assert_eq!(from_file.source(), QWEN3_TEMPLATE);
    let template = match template {
        Some(src) => ChatTemplate::new(src, None, Some("<|im_end|>")).expect("template"),
        None => from_file,
    };
    let home =
        CpuHome::new(file.clone(), cfg, &CpuOptions { n_ctx: Some(512), regions: 2, codec: KvCodec::F16, threads: Some(2) }, Arc::new(Counters::default())).expect("cpu home");
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
    assert_eq!(v["content"], json!([{"type": "thinking", "thinking": reasoning, "signature": ""}]), "{v}");
    assert_eq!(v["stop_reason"], "max_tokens", "{v}");

    // Anthropic, streamed: content_block_start (thinking), thinking_delta..., content_block_stop.
    let events = s.stream("/v1/messages", &messages(json!({"stream": true}))).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"], "{names:?}");
    assert_eq!(events[2].1["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
    let mut t = String::new();
    let mut i = 3;
    while names[i] == "content_block_delta" {
        assert_eq!(events[i].1["index"], 0);
        assert_eq!(events[i].1["delta"]["type"], "thinking_delta");
        t += events[i].1["delta"]["thinking"].as_str().unwrap();
        i += 1;
    }
    assert_eq!(t, reasoning);
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
