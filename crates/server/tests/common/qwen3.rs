//! A small synthetic Qwen3 GGUF for the reasoning tests (crates/server/tests/thinking.rs, and
//! through `resin serve`, crates/resin/tests/serve_openai.rs): the qwen3 architecture (q/k
//! norms) with tiny f32 weights, Qwen3's vocabulary (Qwen2.5-Coder-0.5B's, fetched from the
//! registry, plus the four user-defined tokens Qwen3 added: `<tool_response>`,
//! `</tool_response>`, `<think>`, `</think>`) and Qwen3's real chat template
//! (testdata/templates/qwen3.jinja).
//!
//! Two kinds of weights. [`Weights::Random`]: random, so the model never writes `<think>` of
//! its own accord. [`Weights::Thinker`]: a bigram machine that thinks. Its attention and
//! feed-forward outputs are zero (the layers still run), so the last hidden state is the
//! current token's embedding; the tokens of [`THINKER_CHAIN`] have one-hot embeddings and the
//! (untied) output matrix maps each to the next one with a logit margin of about 30 over the
//! whole vocabulary, so from the end of Qwen3's generation prompt (`<|im_start|>assistant\n`)
//! the model writes, greedy or sampled at temperature 1, exactly
//! `<think>The user wants four.</think>\n\nFour!` and then `<|im_end|>`. With thinking off the
//! prompt ends with the template's empty think block (`...</think>\n\n`), from whose last token
//! the chain goes on to `Four!`: the answer alone.
#![allow(dead_code)]

use resin_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use resin_model::Tokenizer;

pub const QWEN3_TEMPLATE: &str = include_str!("../../../../testdata/templates/qwen3.jinja");

/// What the thinker writes after Qwen3's generation prompt, and its reasoning and answer.
pub const THINKER_OUTPUT: &str = "<think>The user wants four.</think>\n\nFour!";
pub const THINKER_REASONING: &str = "The user wants four.";
pub const THINKER_ANSWER: &str = "Four!";
/// The thinker's chain, one token a piece: each piece's token is followed by the next's.
pub const THINKER_CHAIN: [&str; 12] = ["\n", "<think>", "The", " user", " wants", " four", ".", "</think>", "\n\n", "Four", "!", "<|im_end|>"];

const D: usize = 64;
const H: usize = 4;
const HKV: usize = 2;
const HD: usize = 16;
const FF: usize = 128;
const L: usize = 2;
const THINK_OPEN: usize = 151667;
const THINK_CLOSE: usize = 151668;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weights {
    Random,
    Thinker,
}

/// The synthetic Qwen3 file's bytes (about 40 MB; the thinker's 80, its output matrix untied).
pub fn qwen3_file(weights: Weights) -> Vec<u8> {
    let qwen = resin_hub::ensure("qwen2.5-coder-0.5b", false).unwrap_or_else(|e| panic!("fetching Qwen2.5-Coder-0.5B for its vocabulary: {e}"));
    let vocab = GgufFile::open(&qwen).expect("opening Qwen2.5-Coder");
    let mut g = GgufWriter::new();
    let u = |v: usize| Value::U32(v as u32);
    g.set("general.architecture", Value::String("qwen3".into()));
    let name = match weights {
        Weights::Random => "synthetic-qwen3-tiny",
        Weights::Thinker => "synthetic-qwen3-thinker",
    };
    g.set("general.name", Value::String(name.into()));
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
                for (id, text) in [(151665, "<tool_response>"), (151666, "</tool_response>"), (THINK_OPEN, "<think>"), (THINK_CLOSE, "</think>")] {
                    items[id] = Value::String(text.into());
                }
                n_vocab = items.len();
                Value::Array(*t, items)
            }
            ("tokenizer.ggml.token_type", Value::Array(t, items)) => {
                let mut items = items.clone();
                // User-defined, as in Qwen3's GGUFs.
                items[151665..=THINK_CLOSE].fill(Value::I32(4));
                Value::Array(*t, items)
            }
            ("tokenizer.chat_template", _) => Value::String(QWEN3_TEMPLATE.into()),
            _ => v.clone(),
        };
        g.set(k.clone(), v);
    }
    assert_eq!(n_vocab, 151936);
    // The chain's token ids (the tags are the added tokens; the rest Qwen2.5's own).
    let chain: Vec<usize> = match weights {
        Weights::Random => Vec::new(),
        Weights::Thinker => {
            let tok = Tokenizer::from_gguf(&vocab).expect("Qwen2.5's tokenizer");
            THINKER_CHAIN
                .iter()
                .map(|p| match *p {
                    "<think>" => THINK_OPEN,
                    "</think>" => THINK_CLOSE,
                    "<|im_end|>" => tok.encode(p, false, true).expect("encoding")[0] as usize,
                    p => {
                        let ids = tok.encode(p, false, false).expect("encoding");
                        assert_eq!(ids.len(), 1, "{p:?} is not one token: {ids:?}");
                        ids[0] as usize
                    }
                })
                .collect()
        }
    };
    let inputs = &chain[..chain.len().saturating_sub(1)];
    assert!(inputs.iter().enumerate().all(|(i, t)| !inputs[..i].contains(t)), "a chain token twice: {chain:?}");
    assert!(inputs.len() <= D);

    let mut seed = 0x5eed_0f31_u64;
    let mut rnd = |n: usize, scale: f32, base: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                base + ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    };
    let thinker = weights == Weights::Thinker;
    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> = Vec::new();
    let mut mat = |name: String, rows: usize, cols: usize, scale: f32, t: &mut Vec<(String, Vec<u64>, Vec<f32>)>| {
        let v = rnd(rows * cols, scale, 0.0);
        t.push((name, vec![cols as u64, rows as u64], v));
    };
    mat("token_embd.weight".into(), n_vocab, D, 1.0, &mut tensors);
    if thinker {
        mat("output.weight".into(), n_vocab, D, 0.01, &mut tensors);
    }
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
        let v = rnd(n, 0.2, 1.0);
        tensors.push((name, vec![n as u64], v));
    }
    if thinker {
        for (name, _, v) in tensors.iter_mut() {
            match name.as_str() {
                // One-hot embeddings for the chain's tokens: row t (D values) is e_k.
                "token_embd.weight" => {
                    for (k, &t) in inputs.iter().enumerate() {
                        let row = &mut v[t * D..(t + 1) * D];
                        row.fill(0.0);
                        row[k] = 1.0;
                    }
                }
                // Token k of the chain is followed by token k + 1: the final norm makes e_k
                // about 8 e_k, so its logit is about 32, the others' at most 0.1.
                "output.weight" => {
                    for (k, &next) in chain[1..].iter().enumerate() {
                        v[next * D + k] = 4.0;
                    }
                }
                // The layers add nothing to the residual stream.
                n if n.ends_with("attn_output.weight") || n.ends_with("ffn_down.weight") => v.fill(0.0),
                _ => {}
            }
        }
    }
    for (name, dims, _) in &tensors {
        g.add_tensor(name.clone(), dims, GgmlType::F32).unwrap();
    }
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.2.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    g.write_all_to_vec(&refs).unwrap()
}
