//! How long the forced tool call's mask (`ToolCallConstraint`) takes a token on this host: the
//! mask is computed on the host over the whole vocabulary before each constrained draw, so it
//! adds to every step of a stream that must call a tool. Walks a call's tokens (the model's own
//! tokenization of the call text), timing each step's mask, with a registry model's vocabulary
//! (default Qwen2.5-Coder-0.5B, 151,936 tokens):
//!   cargo run --release -p resin-server --example mask_speed [-- NAME|FILE.gguf]

use std::sync::Arc;
use std::time::Instant;

use resin_engine::LogitsConstraint;
use resin_gguf::GgufFile;
use resin_model::Tokenizer;
use resin_server::grammar::{compile, TokenTable, ToolCallConstraint};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let path = if name.ends_with(".gguf") { name.into() } else { resin_hub::ensure(&name, false)? };
    let file = GgufFile::open(&path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let t0 = Instant::now();
    let bytes = (0..tok.vocab_size() as u32).map(|id| tok.token_bytes(id, false)).collect();
    let table = Arc::new(TokenTable::new(bytes, tok.stop_ids()));
    println!("vocabulary {} tokens, table built in {:.1} ms", table.vocab(), t0.elapsed().as_secs_f64() * 1e3);
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
    let call = r#"{"name": "get_weather", "arguments": {"city": "Paris, France", "unit": "celsius", "days": 3, "tags": ["rain", "wind speed"], "detailed": true}}"#;
    let ids = tok.encode(call, false, false)?;
    let mut c = ToolCallConstraint::new(table.clone(), compile(&tools));
    let mut logits = vec![0f32; table.vocab()];
    let mut times = Vec::new();
    for &id in &ids {
        logits.iter_mut().for_each(|l| *l = 0.0);
        let t = Instant::now();
        c.mask(&mut logits);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        let allowed = logits.iter().filter(|l| l.is_finite()).count();
        let piece = String::from_utf8_lossy(&tok.token_bytes(id, false)).into_owned();
        println!("{:>9.0} us  {allowed:>6} allowed  {piece:?}", times.last().unwrap());
        if !logits[id as usize].is_finite() {
            anyhow::bail!("the mask refused the call's own token {piece:?}");
        }
        c.accept(id);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!("{} steps: mean {mean:.0} us, median {:.0} us, max {:.0} us a mask", times.len(), sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
    Ok(())
}
