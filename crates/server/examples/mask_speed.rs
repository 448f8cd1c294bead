//! How long the grammar's mask (llguidance, `GrammarConstraint`) takes a token on this host:
//! the mask is computed on the host over the whole vocabulary before each constrained draw,
//! so it adds to every step of a stream with a `response_format` schema or a forced tool
//! call. Walks a forced call's tokens and a structured output's (the model's own tokenization
//! of each text), timing each step's mask, with a registry model's vocabulary (default
//! Qwen2.5-Coder-0.5B, 151,936 tokens):
//!   cargo run --release -p resin-server --example mask_speed [-- NAME|FILE.gguf]

use std::time::Instant;

use resin_engine::LogitsConstraint;
use resin_gguf::GgufFile;
use resin_model::Tokenizer;
use resin_server::grammar::{GrammarConstraint, GrammarEnv};
use serde_json::json;

/// Time the mask at each of `text`'s tokens; the steps' times in microseconds.
fn walk(tok: &Tokenizer, vocab: usize, mut c: GrammarConstraint, text: &str, show: bool) -> anyhow::Result<Vec<f64>> {
    let ids = tok.encode(text, false, false)?;
    let mut logits = vec![0f32; vocab];
    let mut times = Vec::new();
    for &id in &ids {
        logits.iter_mut().for_each(|l| *l = 0.0);
        let t = Instant::now();
        c.mask(&mut logits);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        let piece = String::from_utf8_lossy(&tok.token_bytes(id, false)).into_owned();
        if show {
            println!("{:>9.0} us  {allowed:>6} allowed  {piece:?}", times.last().unwrap());
        }
        if !logits[id as usize].is_finite() {
            anyhow::bail!("the mask refused the text's own token {piece:?}");
        }
        c.accept(id);
    }
    Ok(times)
}

fn summary(what: &str, times: &[f64]) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!("{what}: {} steps: mean {mean:.0} us, median {:.0} us, max {:.0} us a mask", times.len(), sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
}

fn main() -> anyhow::Result<()> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let path = if name.ends_with(".gguf") { name.into() } else { resin_hub::ensure(&name, false)? };
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let t0 = Instant::now();
    let env = GrammarEnv::from_tokenizer(&tok)?;
    println!("vocabulary {} tokens, grammar environment built in {:.1} ms", env.vocab(), t0.elapsed().as_secs_f64() * 1e3);
    let tools = vec![
        (
            "get_weather".to_string(),
            json!({"type": "object", "properties": {
                "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"}, "detailed": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}),
        ),
        ("search".to_string(), json!({"type": "object"})),
    ];
    let call = r#"{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius", "days": 3, "detailed": true, "tags": ["rain", "wind speed"]}}"#;
    let t = Instant::now();
    let c = env.tool_call(&tools).map_err(anyhow::Error::msg)?;
    println!("tool-call grammar compiled in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let call_times = walk(&tok, env.vocab(), c, call, true)?;
    let schema = json!({"type": "object", "properties": {
        "customer": {"type": "object", "properties": {"name": {"type": "string"}, "tier": {"enum": ["free", "pro", "enterprise"]}, "age": {"type": "integer"}},
            "required": ["name", "tier"], "additionalProperties": false},
        "items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "quantity", "price"], "additionalProperties": false}},
        "paid": {"type": "boolean"}}, "required": ["customer", "items", "paid"], "additionalProperties": false});
    let order = r#"{"customer": {"name": "Ada Lovelace", "tier": "pro", "age": 36}, "items": [{"sku": "AB-123", "quantity": 2, "price": 19.99}, {"sku": "Z9", "quantity": 1, "price": 5}], "paid": true}"#;
    let t = Instant::now();
    let c = env.json_schema(&schema).map_err(anyhow::Error::msg)?;
    println!("order schema compiled in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let order_times = walk(&tok, env.vocab(), c, order, false)?;
    summary("forced tool call", &call_times);
    summary("order schema", &order_times);
    Ok(())
}
