//! Chat templates rendered by resin must equal Python Jinja2's renders under Hugging Face's
//! settings, byte for byte. The expected renders (and the template texts) are in
//! tests/data/chat/*.json, written by scripts/gen_chat_renders.py.

use std::path::PathBuf;

use resin_model::ChatTemplate;
use serde_json::Value;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat")
}

fn load(name: &str) -> Value {
    let path = data_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn template(doc: &Value) -> ChatTemplate {
    ChatTemplate::new(doc["template"].as_str().unwrap(), doc["bos_token"].as_str(), doc["eos_token"].as_str()).unwrap()
}

/// Renders every case of one data file; returns how many there were.
fn check(name: &str) -> usize {
    let doc = load(name);
    let tmpl = template(&doc);
    let cases = doc["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    let mut bad = Vec::new();
    for case in cases {
        let messages = case["messages"].as_array().unwrap();
        let tools = case["tools"].as_array().map(|t| t.as_slice());
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let want = case["expected"].as_str().unwrap();
        let kwargs = case["kwargs"].as_object().cloned().unwrap_or_default();
        match tmpl.render_with(messages, tools, agp, &kwargs) {
            Ok(got) if got == want => {}
            Ok(got) => bad.push(format!("{} / {}:\n--- want\n{want}\n--- got\n{got}\n---", name, case["name"])),
            Err(e) => bad.push(format!("{} / {}: {e}", name, case["name"])),
        }
    }
    assert!(bad.is_empty(), "{} of {} renders differ:\n{}", bad.len(), cases.len(), bad.join("\n"));
    cases.len()
}

#[test]
fn smollm2_template() {
    assert_eq!(check("smollm2"), 5);
}

#[test]
fn qwen25_coder_template() {
    assert_eq!(check("qwen2.5-coder"), 5);
}

/// Qwen3's template (it thinks): `enable_thinking: false` writes the empty think block, an
/// assistant turn's `reasoning_content` (or `<think>` in its content) renders as Qwen3 renders it.
#[test]
fn qwen3_template() {
    assert_eq!(check("qwen3"), 8);
    let doc = load("qwen3");
    let tmpl = template(&doc);
    assert_eq!(tmpl.reasoning_tags(), Some(("<think>", "</think>")));
    let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
    let mut off = serde_json::Map::new();
    off.insert("enable_thinking".into(), Value::Bool(false));
    assert!(tmpl.render_with(&msgs, None, true, &off).unwrap().ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(tmpl.render(&msgs, None, true).unwrap().ends_with("<|im_start|>assistant\n"));
    // Templates that do not think say so.
    assert_eq!(template(&load("qwen2.5-coder")).reasoning_tags(), None);
    assert_eq!(template(&load("smollm2")).reasoning_tags(), None);
}

#[test]
fn synthetic_template() {
    assert_eq!(check("synthetic"), 5);
    assert_eq!(check("synthetic-no-bos"), 2);
}

#[test]
fn raise_exception_is_an_error() {
    let doc = load("synthetic");
    let tmpl = template(&doc);
    let msgs = [serde_json::json!({"role": "narrator", "content": "x"})];
    let err = tmpl.render(&msgs, None, true).unwrap_err().to_string();
    assert!(err.contains("bad role: narrator"), "{err}");
}

#[test]
fn extra_variables_override() {
    let tmpl = ChatTemplate::new("{{ bos_token }}|{{ enable_thinking }}|{{ messages | length }}", Some("<s>"), None).unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), Value::Bool(false));
    extra.insert("bos_token".into(), Value::String("[BOS]".into()));
    assert_eq!(tmpl.render_with(&[], None, false, &extra).unwrap(), "[BOS]|False|0");
}

/// The templates in the data files are those of the real GGUFs (when present, this also checks
/// from_gguf reads the template and the bos/eos texts).
#[test]
fn from_gguf_matches_data() {
    for (name, data) in [("smollm2-135m", "smollm2"), ("qwen2.5-coder-0.5b", "qwen2.5-coder")] {
        let path = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
        let f = resin_gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tmpl = ChatTemplate::from_gguf(&f).unwrap().expect("the model has a chat template");
        let doc = load(data);
        assert_eq!(tmpl.source(), doc["template"].as_str().unwrap());
        let msgs = doc["cases"][0]["messages"].as_array().unwrap();
        assert_eq!(tmpl.render(msgs, None, true).unwrap(), doc["cases"][0]["expected"].as_str().unwrap());
    }
}
