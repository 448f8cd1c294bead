//! gemma3's layer kinds: which layers slide over their last `window` keys and which see every
//! key, and the rope base each ropes with, as both homes read them for each layer
//! (`ModelConfig::layer_window` for the keys, `layer_rope_table` into `rope_bases` for the rope
//! table: the CPU home's forward pass and the Vulkan home's token command and windows pick
//! through these two and nothing else).
//!
//! On the real Gemma 3 270M file, which carries no `sliding_window_pattern` (so the loaders'
//! default: a global layer after every five sliding ones) and no `rope.freq_base_swa` (so
//! 10,000 for the sliding layers beside the file's 1,000,000): layers 5, 11 and 17 global, the
//! rest sliding over 512 keys. Then the loader's other forms of the pattern on small synthetic
//! files: a number, an array of flags, 0 (every layer slides), a sliding base equal to the
//! global one (one table), no window. Controls: the real file's assignment shifted by one
//! layer either way, and with the two bases swapped, must fail the same comparison.
//! (crates/cpu/tests/reference.rs runs the real file past its window against an oracle that
//! does not come from resin, with an off-by-one pattern as its control.)

use resin_gguf::synthetic::{Shape, Weights};
use resin_gguf::{GgufFile, Value, ValueType};
use resin_model::ModelConfig;

/// Each layer's keys (None: every key) and the base of the rope table it reads.
fn assignment(cfg: &ModelConfig) -> Vec<(Option<usize>, f32)> {
    let bases = cfg.rope_bases();
    (0..cfg.n_layer).map(|l| (cfg.layer_window(l), bases[cfg.layer_rope_table(l)])).collect()
}

/// `layers` layers, those in `global` seeing every key at `global_base`, the others sliding
/// over `window` keys at `local_base`.
fn expected(layers: usize, global: &[usize], window: usize, global_base: f32, local_base: f32) -> Vec<(Option<usize>, f32)> {
    (0..layers).map(|l| if global.contains(&l) { (None, global_base) } else { (Some(window), local_base) }).collect()
}

#[test]
fn gemma3_270m_slides_on_all_but_every_sixth_layer() {
    let path = resin_hub::ensure("gemma3-270m", false).unwrap_or_else(|e| panic!("fetching gemma3-270m: {e}"));
    let file = GgufFile::open(&path).unwrap();
    // What the default is derived from: no pattern, no sliding base in the file.
    assert!(file.get("gemma3.attention.sliding_window_pattern").is_none());
    assert!(file.get("gemma3.rope.freq_base_swa").is_none());
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(cfg.n_layer, 18);
    assert_eq!(cfg.rope_bases(), [1_000_000.0, 10_000.0], "one table a base, global first");
    let want = expected(18, &[5, 11, 17], 512, 1_000_000.0, 10_000.0);
    assert_eq!(assignment(&cfg), want);
    for (l, &(_, base)) in want.iter().enumerate() {
        assert_eq!(cfg.layer_rope_base(l), base, "layer {l}'s rope base");
    }
    // A layer past the last reads the global table and every key (a home never asks, but the
    // answer must not index past the flags).
    assert_eq!((cfg.layer_window(18), cfg.layer_rope_table(18)), (None, 0));

    // Controls: the global layers one earlier, one later, and the bases swapped.
    let swa = cfg.swa.clone().unwrap();
    for (what, rotate) in [("one layer later", 1usize), ("one layer earlier", 17)] {
        let mut layers = swa.layers.clone();
        layers.rotate_right(rotate);
        let shifted = ModelConfig { swa: Some(resin_model::SlidingWindow { layers, ..swa.clone() }), ..cfg.clone() };
        assert_ne!(assignment(&shifted), want, "control ({what}) passed");
    }
    let swapped = ModelConfig { rope_base: swa.rope_base, swa: Some(resin_model::SlidingWindow { rope_base: cfg.rope_base, ..swa.clone() }), ..cfg.clone() };
    assert_ne!(assignment(&swapped), want, "control (bases swapped) passed");
}

const SHAPE: Shape = Shape { layers: 7, d: 32, heads: 2, heads_kv: 1, head_dim: 16, ff: 48 };

/// A small gemma3 file with `meta` set besides its shape (f32 weights; only the config is read).
fn file_with(meta: &[(&str, Value)]) -> GgufFile {
    let mut w = Weights::new(0x2545_f491_4f6c_dd1d);
    w.mat("token_embd.weight", 16, SHAPE.d, 0.1);
    let (d, hd) = (SHAPE.d, SHAPE.head_dim);
    w.blocks(&SHAPE, &[("attn_norm", d), ("ffn_norm", d), ("post_attention_norm", d), ("post_ffw_norm", d), ("attn_q_norm", hd), ("attn_k_norm", hd)]);
    let mut g = SHAPE.writer("gemma3", 64);
    g.set("gemma3.rope.freq_base", Value::F32(1e6));
    g.set("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    for (k, v) in meta {
        g.set(format!("gemma3.{k}"), v.clone());
    }
    GgufFile::from_bytes(w.write(g)).unwrap()
}

fn synthetic(meta: &[(&str, Value)]) -> ModelConfig {
    ModelConfig::from_gguf(&file_with(meta)).unwrap()
}

#[test]
fn the_loader_reads_each_form_of_the_pattern() {
    let window = || ("attention.sliding_window", Value::U32(8));
    let pattern = |v: Value| ("attention.sliding_window_pattern", v);
    let swa_base = |b: f32| ("rope.freq_base_swa", Value::F32(b));
    // A number n: every n-th layer global (the n-th, 2n-th, ...).
    let cfg = synthetic(&[window(), pattern(Value::U32(3)), swa_base(5e4)]);
    assert_eq!(assignment(&cfg), expected(7, &[2, 5], 8, 1e6, 5e4));
    // No pattern: gemma3's default of 6.
    let cfg = synthetic(&[window(), swa_base(5e4)]);
    assert_eq!(assignment(&cfg), expected(7, &[5], 8, 1e6, 5e4));
    // Flags, one a layer: true slides.
    let flags = [true, false, false, true, true, false, true];
    let cfg = synthetic(&[window(), pattern(Value::Array(ValueType::Bool, flags.iter().map(|&b| Value::Bool(b)).collect())), swa_base(5e4)]);
    assert_eq!(assignment(&cfg), expected(7, &[1, 2, 5], 8, 1e6, 5e4));
    // 0: every layer slides, and only the sliding base has a layer.
    let cfg = synthetic(&[window(), pattern(Value::U32(0)), swa_base(5e4)]);
    assert_eq!(assignment(&cfg), expected(7, &[], 8, 1e6, 5e4));
    // A sliding base equal to the global one: one table for every layer.
    let cfg = synthetic(&[window(), swa_base(1e6)]);
    assert_eq!(cfg.rope_bases(), [1e6]);
    assert_eq!(assignment(&cfg), expected(7, &[5], 8, 1e6, 1e6));
    assert!((0..7).all(|l| cfg.layer_rope_table(l) == 0));
    // No sliding base in the file: 10,000.
    let cfg = synthetic(&[window()]);
    assert_eq!(assignment(&cfg), expected(7, &[5], 8, 1e6, 1e4));
    // No window (or 0): every layer global, whatever the pattern says.
    for meta in [vec![pattern(Value::U32(3))], vec![("attention.sliding_window", Value::U32(0)), pattern(Value::U32(3))]] {
        let cfg = synthetic(&meta);
        assert!(cfg.swa.is_none());
        assert_eq!(assignment(&cfg), expected(7, &[0, 1, 2, 3, 4, 5, 6], 8, 1e6, 1e6));
    }
}

#[test]
fn the_loader_refuses_a_pattern_it_cannot_read() {
    let window = || ("attention.sliding_window", Value::U32(8));
    let too_few = Value::Array(ValueType::Bool, vec![Value::Bool(true); 6]);
    let not_flags = Value::Array(ValueType::String, vec![Value::String("yes".into()); 7]);
    for (what, v) in [("six flags for seven layers", too_few), ("strings, not flags", not_flags), ("a string", Value::String("6".into()))] {
        let file = file_with(&[window(), ("attention.sliding_window_pattern", v)]);
        let err = ModelConfig::from_gguf(&file).expect_err(what);
        assert!(err.to_string().contains("sliding_window_pattern"), "{what}: {err}");
    }
}
