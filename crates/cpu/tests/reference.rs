//! The CPU home against an independent float32 numpy forward pass (testdata/reference, made by
//! scripts/reference_forward.py with the `gguf` package): prompt ids, greedy continuations up
//! to the reference's first near-tie, and the first step's top-200 logits within relative L2
//! 1e-2, with a control (a perturbed weight) that must fail the same bar.
//!
//! The CPU home quantizes activations to 8 bits for the integer dot products (as llama.cpp
//! does), so it parts from float32 after a near-tie, and its logits sit a little past 1e-2 of a
//! float32 pass: measured on 2026-12-02 over five prompts, top-200 relative L2 1.2e-2 to 2.3e-2
//! (SmolLM2), 0.9e-2 to 1.5e-2 (Qwen2.5-Coder-0.5B and 1.5B). The bar it meets is 3e-2.
//!
//! Gemma 3 270M is more sensitive to that rounding: its post-norms RMS-normalise the attention
//! and FFN outputs, so their rounding noise reaches the residual at full size rather than as a
//! small addition to it. Its top-200 errors reach past 3e-2 on some prompts and move about as
//! much when the mirror is f32 instead of f16 (noise, not a bias), so its bar is 5e-2 and its
//! control scales the final norm by 12%, well past that bar.
//!
//! Gemma 3 270M again past its 512-key sliding window (testdata/reference/gemma3-270m-long.json),
//! with the window widened past the prompt and an off-by-one pattern of global layers as the
//! controls.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use resin_core::{Counters, Home, KvCodec, RegionId, Row, Segment, StepAll};
use resin_cpu::{CpuHome, CpuOptions};
use resin_gguf::GgufFile;
use resin_model::{ModelConfig, SlidingWindow, Tokenizer};
use serde_json::Value;

/// Relative L2 error allowed on the first step's top-200 logits (8-bit activations; see above).
const LOGIT_BAR: f64 = 3e-2;
/// The control scales the final norm's weights by this: a 6% error the bar must catch.
const CONTROL_SCALE: f32 = 1.06;
/// Gemma 3's bar and control (see above).
const GEMMA_LOGIT_BAR: f64 = 5e-2;
const GEMMA_CONTROL_SCALE: f32 = 1.12;
/// Greedy ids are compared up to the first step whose reference top-2 margin is below this.
/// The reference files mark near-ties at 0.1; 8-bit activations move this small model's
/// logits by up to ~0.2 (seen: flips at margins of 0.19), so the bar this home meets is 0.3.
const NEAR_TIE: f64 = 0.3;
/// A run must compare at least this many greedy tokens before a near-tie.
const MIN_TOKENS: usize = 5;

fn reference(model: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/reference").join(format!("{model}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn home_for(file: Arc<GgufFile>) -> CpuHome {
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    home_with(file, cfg, 256)
}

fn home_with(file: Arc<GgufFile>, cfg: ModelConfig, n_ctx: usize) -> CpuHome {
    CpuHome::new(file, cfg, &CpuOptions { n_ctx: Some(n_ctx), regions: 1, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default())).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn top_logits_error(logits: &[f32], case: &Value) -> f64 {
    let top = &case["top_logits"];
    let (num, den) = ids(&top["ids"]).iter().zip(top["values"].as_array().unwrap()).fold((0.0, 0.0), |(n, d), (&i, v)| {
        let want = v.as_f64().unwrap();
        (n + (logits[i as usize] as f64 - want).powi(2), d + want * want)
    });
    (num / den).sqrt()
}

/// Greedy-decode `steps` tokens after `prompt`; returns the ids and the first step's logits.
fn greedy(home: &mut CpuHome, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f32>) {
    let r = RegionId(0);
    let first = home.prefill(&[Segment { region: r, start: 0, tokens: prompt }]).unwrap().data;
    let mut out = vec![common::argmax(&first)];
    for i in 1..steps {
        let l = home.step_logits(&[Row { region: r, token: out[i - 1], pos: (prompt.len() + i - 1) as u32 }]).unwrap();
        out.push(common::argmax(l.row(0)));
    }
    (out, first)
}

fn check_model(name: &str) {
    check_model_within(name, LOGIT_BAR, CONTROL_SCALE);
}

fn check_model_within(name: &str, logit_bar: f64, control_scale: f32) {
    let reference = reference(name);
    let path = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut home = home_for(file.clone());
    let steps = reference["greedy_steps"].as_u64().unwrap() as usize;
    let mut longest = 0;
    let mut first_case_logits = None;
    for case in reference["cases"].as_array().unwrap() {
        let prompt_text = case["prompt"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        assert_eq!(tok.encode(prompt_text, true, false).unwrap(), prompt, "{name}: prompt ids of {prompt_text:?}");
        let want = ids(&case["greedy_ids"]);
        let margins: Vec<f64> = case["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let upto = margins.iter().position(|&m| m < NEAR_TIE).unwrap_or(steps).min(steps);
        let (got, logits) = greedy(&mut home, &prompt, upto.max(1));
        assert_eq!(got[..upto], want[..upto], "{name}: greedy ids of {prompt_text:?} before the first near-tie (step {upto})");
        longest = longest.max(upto);
        let err = top_logits_error(&logits, case);
        eprintln!("{name}: {prompt_text:?}: {upto} tokens equal, top-200 logits relative L2 {err:.2e}");
        assert!(err < logit_bar, "{name}: {prompt_text:?}: top-200 logits relative L2 {err:.3e} >= {logit_bar}");
        first_case_logits.get_or_insert((prompt, case.clone()));
    }
    assert!(longest >= MIN_TOKENS, "{name}: no prompt compared {MIN_TOKENS} tokens before a near-tie");

    // Control: the same model with output_norm.weight scaled by control_scale must fail the bar.
    let (prompt, case) = first_case_logits.unwrap();
    let mut bytes = file.bytes().to_vec();
    let t = file.tensor(resin_model::OUTPUT_NORM).unwrap();
    assert_eq!(t.ty, resin_gguf::GgmlType::F32);
    let start = (file.data_offset + t.offset) as usize;
    for w in bytes[start..start + t.size as usize].chunks_exact_mut(4) {
        let v = f32::from_le_bytes(w.try_into().unwrap()) * control_scale;
        w.copy_from_slice(&v.to_le_bytes());
    }
    let mut perturbed = home_for(Arc::new(GgufFile::from_bytes(bytes).unwrap()));
    let (_, logits) = greedy(&mut perturbed, &prompt, 1);
    let err = top_logits_error(&logits, &case);
    eprintln!("{name}: control (output norm x{control_scale}): relative L2 {err:.2e}");
    assert!(err >= logit_bar, "{name}: the perturbed model passed the bar ({err:.3e}); the bar cannot fail");
}

#[test]
fn smollm2_135m_matches_the_float32_reference() {
    check_model("smollm2-135m");
}

#[test]
fn gemma3_270m_matches_the_float32_reference() {
    check_model_within("gemma3-270m", GEMMA_LOGIT_BAR, GEMMA_CONTROL_SCALE);
}

#[test]
fn qwen25_coder_05b_matches_the_float32_reference() {
    check_model("qwen2.5-coder-0.5b");
}

/// Runs whenever the 1.1 GB file can be fetched.
#[test]
fn qwen25_coder_15b_matches_the_float32_reference() {
    match resin_hub::ensure("qwen2.5-coder-1.5b", false) {
        Ok(_) => check_model("qwen2.5-coder-1.5b"),
        Err(e) => eprintln!("SKIPPED: qwen2.5-coder-1.5b could not be fetched: {e}"),
    }
}

/// The long prompt's text: the first this many lines of testdata/text/paradise-lost.txt.
const LONG_LINES: usize = 72;

/// Gemma 3 270M past its 512-key window, against the float32 reference over the same ids
/// (testdata/reference/gemma3-270m-long.json): BOS and the poem's first LONG_LINES lines,
/// 689 tokens, so in prefill the last 177 rows' sliding layers (and every decode step's) have
/// dropped their oldest keys, BOS among them, while the global layers keep every key. Greedy
/// ids up to the reference's first near-tie (this home's bar, 0.3) and the first step's top-200
/// logits within Gemma's bar. Controls, each of which must fail the logit bar: the window
/// widened past the prompt (the same layers and rope bases: only the keys past the window
/// change), and the global layers one earlier (4, 10, 16: an off-by-one pattern).
#[test]
fn gemma3_270m_past_its_window_matches_the_float32_reference() {
    let reference = reference("gemma3-270m-long");
    let path = resin_hub::ensure("gemma3-270m", false).unwrap_or_else(|e| panic!("fetching gemma3-270m: {e}"));
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let swa = cfg.swa.clone().expect("gemma3-270m slides");
    let case = &reference["cases"][0];
    let prompt = ids(&case["prompt_ids"]);
    let text = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/text/paradise-lost.txt")).unwrap();
    let text: String = text.split_inclusive('\n').take(LONG_LINES).collect();
    let encoded = Tokenizer::from_gguf(&file).unwrap().encode(&text, true, false).unwrap();
    let joined = encoded.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    assert_eq!(encoded, prompt, "the fixture's prompt ids are not this text's (regenerate it with --prompt-ids {joined})");
    assert!(prompt.len() >= swa.window + 128, "the prompt does not reach far past the window");

    let steps = reference["greedy_steps"].as_u64().unwrap() as usize;
    let margins: Vec<f64> = case["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
    let upto = margins.iter().position(|&m| m < NEAR_TIE).unwrap_or(steps).min(steps);
    let n_ctx = prompt.len() + steps;
    let t0 = std::time::Instant::now();
    let (got, logits) = greedy(&mut home_with(file.clone(), cfg.clone(), n_ctx), &prompt, upto.max(1));
    let err = top_logits_error(&logits, case);
    eprintln!("gemma3-270m, {} tokens: {upto} greedy tokens equal, top-200 logits relative L2 {err:.2e} [{:.1}s]", prompt.len(), t0.elapsed().as_secs_f64());
    assert_eq!(got[..upto], ids(&case["greedy_ids"])[..upto], "greedy ids past the window before the first near-tie (step {upto})");
    assert!(upto >= MIN_TOKENS, "only {upto} tokens compared before a near-tie");
    assert!(err < GEMMA_LOGIT_BAR, "top-200 logits relative L2 {err:.3e} >= {GEMMA_LOGIT_BAR}");

    let wide = SlidingWindow { window: n_ctx, ..swa.clone() };
    let mut layers = swa.layers.clone();
    layers.rotate_left(1);
    let shifted = SlidingWindow { layers, ..swa.clone() };
    assert_eq!((0..cfg.n_layer).filter(|&l| !shifted.layers[l]).collect::<Vec<_>>(), [4, 10, 16]);
    for (what, control) in [("window past the prompt", wide), ("global layers one earlier", shifted)] {
        let (_, logits) = greedy(&mut home_with(file.clone(), ModelConfig { swa: Some(control), ..cfg.clone() }, n_ctx), &prompt, 1);
        let err = top_logits_error(&logits, case);
        eprintln!("gemma3-270m, control ({what}): relative L2 {err:.2e}");
        assert!(err >= GEMMA_LOGIT_BAR, "control ({what}) passed the bar ({err:.3e})");
    }
}
