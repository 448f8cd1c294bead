//! `resin synth` / `resin inspect` on tiny synthetic shapes.

use std::path::{Path, PathBuf};

use resin::synth::{synth_with, tensor_plan, use_more_bits, SynthArch, SynthSpec, SynthType, SynthVocab, WEIGHT_STD};
use resin_gguf::{formats, GgmlType, GgufFile, GgufWriter, Value, ValueType};

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("resin-synth-test-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A vocabulary-only GGUF with `n` tokens (a few tokenizer keys, one non-tokenizer key that must
/// not be copied).
fn write_tiny_vocab(path: &Path, n: usize) {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.name", Value::String("tiny-vocab".into()));
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.set("tokenizer.ggml.pre", Value::String("llama-bpe".into()));
    let tokens: Vec<Value> = (0..n).map(|i| Value::String(format!("tok{i}"))).collect();
    w.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens));
    w.set("tokenizer.ggml.token_type", Value::Array(ValueType::I32, (0..n).map(|_| Value::I32(1)).collect()));
    w.set("tokenizer.ggml.merges", Value::Array(ValueType::String, vec![Value::String("t o".into())]));
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.set("tokenizer.chat_template", Value::String("{% for m in messages %}\n{{ m.content }}{% endfor %}".into()));
    let bytes = w.write_all_to_vec(&[]).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn tiny_spec(vocab: &Path, layers: usize) -> SynthSpec {
    SynthSpec {
        name: "synthetic-tiny".into(),
        arch: SynthArch::Llama,
        hidden: 256,
        layers,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 512,
        moe: None,
        context_length: 4096,
        rope_base: 500000.0,
        rms_eps: 1e-5,
        tied_embeddings: true,
        weight_std: WEIGHT_STD,
        vocab: SynthVocab::File(vocab.to_path_buf()),
        min_vocab: 0,
        swa: None,
    }
}

/// The expected table, written out independently of `tensor_plan`.
fn expected(spec: &SynthSpec, ty: SynthType, n_vocab: u64) -> Vec<(String, Vec<u64>, GgmlType)> {
    let (h, q, kv, f) = (spec.hidden as u64, (spec.heads * spec.head_dim) as u64, (spec.kv_heads * spec.head_dim) as u64, spec.ffn as u64);
    let (base, six) = match ty {
        SynthType::F32 => (GgmlType::F32, GgmlType::F32),
        SynthType::Q8_0 => (GgmlType::Q8_0, GgmlType::Q8_0),
        SynthType::Q4_K_M => (GgmlType::Q4_K, GgmlType::Q6_K),
    };
    let n = spec.layers;
    let more = |i: usize| i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2;
    let mut v = vec![("token_embd.weight".to_string(), vec![h, n_vocab], six)];
    for i in 0..n {
        let m = if more(i) { six } else { base };
        v.push((format!("blk.{i}.attn_norm.weight"), vec![h], GgmlType::F32));
        v.push((format!("blk.{i}.attn_q.weight"), vec![h, q], base));
        v.push((format!("blk.{i}.attn_k.weight"), vec![h, kv], base));
        v.push((format!("blk.{i}.attn_v.weight"), vec![h, kv], m));
        v.push((format!("blk.{i}.attn_output.weight"), vec![q, h], base));
        v.push((format!("blk.{i}.ffn_norm.weight"), vec![h], GgmlType::F32));
        v.push((format!("blk.{i}.ffn_gate.weight"), vec![h, f], base));
        v.push((format!("blk.{i}.ffn_up.weight"), vec![h, f], base));
        v.push((format!("blk.{i}.ffn_down.weight"), vec![f, h], m));
    }
    v.push(("output_norm.weight".to_string(), vec![h], GgmlType::F32));
    v
}

fn check_file(path: &Path, spec: &SynthSpec, ty: SynthType, n_vocab: u64) -> GgufFile {
    let f = GgufFile::open(path).unwrap();
    assert_eq!(f.version, 3);
    let got: Vec<(String, Vec<u64>, GgmlType)> = f.tensors().iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect();
    assert_eq!(got, expected(spec, ty, n_vocab));
    let plan: Vec<(String, Vec<u64>, GgmlType)> = tensor_plan(spec, ty, n_vocab as usize).into_iter().map(|t| (t.name, t.dims, t.ty)).collect();
    assert_eq!(got, plan);
    assert!(f.tensor("output.weight").is_none(), "tied embeddings: no output.weight");

    let u = |k: &str| f.get_u64(k).unwrap().unwrap_or_else(|| panic!("missing {k}"));
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_str("general.name").unwrap(), Some(spec.name.as_str()));
    assert_eq!(
        u("general.file_type"),
        match ty {
            SynthType::F32 => 0,
            SynthType::Q8_0 => 7,
            SynthType::Q4_K_M => 15,
        }
    );
    assert_eq!(u("llama.block_count"), spec.layers as u64);
    assert_eq!(u("llama.embedding_length"), spec.hidden as u64);
    assert_eq!(u("llama.feed_forward_length"), spec.ffn as u64);
    assert_eq!(u("llama.attention.head_count"), spec.heads as u64);
    assert_eq!(u("llama.attention.head_count_kv"), spec.kv_heads as u64);
    assert_eq!(u("llama.rope.dimension_count"), spec.head_dim as u64);
    assert_eq!(u("llama.context_length"), spec.context_length);
    assert_eq!(u("llama.vocab_size"), n_vocab);
    assert_eq!(f.get_f64("llama.rope.freq_base").unwrap(), Some(500000.0));
    assert!((f.get_f64("llama.attention.layer_norm_rms_epsilon").unwrap().unwrap() - 1e-5).abs() < 1e-12);
    assert_eq!(f.get("tokenizer.ggml.tokens").and_then(Value::as_array).map(<[Value]>::len), Some(n_vocab as usize));
    assert!(f.get("tokenizer.ggml.model").is_some() && f.get("tokenizer.ggml.merges").is_some());

    // Norms are 1.0; matrices dequantize to N(0, 0.02).
    for t in f.tensors() {
        let n = t.n_elements() as usize;
        let mut vals = vec![0f32; n];
        formats::dequantize(t.ty, f.tensor_data(t), &mut vals).unwrap();
        if t.ty == GgmlType::F32 {
            assert!(vals.iter().all(|&v| v == 1.0), "{}", t.name);
            continue;
        }
        let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let std = (vals.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(mean.abs() < 0.003, "{}: mean {mean}", t.name);
        assert!((std - 0.02).abs() < 0.0015, "{}: std {std}", t.name);
    }
    f
}

#[test]
fn tiny_q8_0_reads_back_with_the_right_shapes_and_weights() {
    let d = tmp_dir("q8");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 256);
    let spec = tiny_spec(&vocab, 4);
    let out = d.join("tiny-q8_0.gguf");
    synth_with(&spec, SynthType::Q8_0, &out, 1, false).unwrap();
    assert!(!d.join("tiny-q8_0.gguf.tmp").exists());
    let f = check_file(&out, &spec, SynthType::Q8_0, 256);
    // Tokenizer keys copied, others not.
    assert_eq!(f.get_u64("tokenizer.ggml.bos_token_id").unwrap(), Some(1));
    assert!(f.get("tokenizer.chat_template").is_some());
    assert_eq!(f.get_str("general.name").unwrap(), Some("synthetic-tiny"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn tiny_q4_k_m_follows_the_llama_cpp_mix() {
    let d = tmp_dir("q4km");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 256);
    let spec = tiny_spec(&vocab, 8);
    let out = d.join("tiny-q4_k_m.gguf");
    synth_with(&spec, SynthType::Q4_K_M, &out, 7, false).unwrap();
    let f = check_file(&out, &spec, SynthType::Q4_K_M, 256);
    // 8 layers: use_more_bits holds for 0, 3, 6, 7.
    assert_eq!((0..8).filter(|&i| use_more_bits(i, 8)).collect::<Vec<_>>(), vec![0, 3, 6, 7]);
    for i in 0..8 {
        let want = if [0, 3, 6, 7].contains(&i) { GgmlType::Q6_K } else { GgmlType::Q4_K };
        assert_eq!(f.tensor(&format!("blk.{i}.attn_v.weight")).unwrap().ty, want, "layer {i}");
        assert_eq!(f.tensor(&format!("blk.{i}.ffn_down.weight")).unwrap().ty, want, "layer {i}");
        assert_eq!(f.tensor(&format!("blk.{i}.attn_q.weight")).unwrap().ty, GgmlType::Q4_K);
        assert_eq!(f.tensor(&format!("blk.{i}.ffn_up.weight")).unwrap().ty, GgmlType::Q4_K);
    }
    assert_eq!(f.tensor("token_embd.weight").unwrap().ty, GgmlType::Q6_K);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn same_seed_same_bytes_whatever_the_thread_count() {
    let d = tmp_dir("det");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 512);
    let spec = tiny_spec(&vocab, 2);
    let (a, b, c) = (d.join("a.gguf"), d.join("b.gguf"), d.join("c.gguf"));
    synth_with(&spec, SynthType::Q4_K_M, &a, 5, false).unwrap();
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    one.install(|| synth_with(&spec, SynthType::Q4_K_M, &b, 5, false)).unwrap();
    synth_with(&spec, SynthType::Q4_K_M, &c, 6, false).unwrap();
    let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
    assert!(a == b, "same seed, different bytes");
    assert_eq!(a.len(), c.len());
    assert!(a != c, "different seeds, same bytes");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_specs_and_vocabularies_are_refused() {
    let d = tmp_dir("bad");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 256);
    let out = d.join("x.gguf");
    let mut spec = tiny_spec(&vocab, 2);
    // Not a multiple of 32: Q4_K's rows have no block format to fall back to.
    spec.hidden = 80;
    assert!(synth_with(&spec, SynthType::Q4_K_M, &out, 0, false).is_err());
    let spec = tiny_spec(&d.join("missing.gguf"), 2);
    assert!(synth_with(&spec, SynthType::Q8_0, &out, 0, false).is_err());
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn inspect_summarises_a_synthetic_file() {
    let d = tmp_dir("inspect");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 256);
    let spec = tiny_spec(&vocab, 2);
    let out = d.join("tiny.gguf");
    synth_with(&spec, SynthType::Q4_K_M, &out, 3, false).unwrap();
    let mut text = Vec::new();
    resin::inspect::inspect(&out, &mut text, true).unwrap();
    let text = String::from_utf8(text).unwrap();
    for want in [
        "architecture  llama",
        "synthetic-tiny",
        "15 (mostly Q4_K_M)",
        "layers      2",
        "embedding   256",
        "kv heads    2",
        "rope base   500000",
        "pre         llama-bpe",
        "vocab       256",
        "bos         1 \"tok1\"",
        "chat tmpl   yes",
        "general.quantization_version",
        "Q6_K",
        "Q4_K",
        "blk.1.ffn_down.weight",
        "bits per parameter",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let mut short = Vec::new();
    resin::inspect::inspect(&out, &mut short, false).unwrap();
    assert!(!String::from_utf8(short).unwrap().contains("blk.1.ffn_down.weight"));

    let bad = d.join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    let err = resin::inspect::inspect(&bad, &mut Vec::new(), false).unwrap_err();
    assert!(format!("{err:#}").contains("not a GGUF"), "{err:#}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// With the real Llama-3 vocabulary (set RESIN_TEST_VOCAB to ggml-vocab-llama-bpe.gguf).
#[test]
fn real_vocabulary_when_available() {
    let Ok(vocab) = std::env::var("RESIN_TEST_VOCAB") else {
        eprintln!("RESIN_TEST_VOCAB not set: skipped");
        return;
    };
    let d = tmp_dir("real");
    let spec = tiny_spec(Path::new(&vocab), 2);
    let out = d.join("real.gguf");
    synth_with(&spec, SynthType::Q8_0, &out, 0, false).unwrap();
    let src = GgufFile::open(&vocab).unwrap();
    let n = src.get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap().len() as u64;
    let f = check_file(&out, &spec, SynthType::Q8_0, n);
    for (k, v) in src.metadata().iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// The tiny MoE shapes: llama.cpp's tensor names and shapes, the keys resin's config reads back,
/// the router in F32, and a byte-level vocabulary that encodes any text.
#[test]
fn tiny_moe_shapes_read_back_as_moe_models() {
    use resin::synth::SynthShape;
    let d = tmp_dir("moe");
    for (shape, arch) in [(SynthShape::Qwen3MoeTiny, resin_model::Arch::Qwen3Moe), (SynthShape::MixtralTiny, resin_model::Arch::Llama)] {
        let out = d.join(format!("{shape}.gguf"));
        resin::synth::synth(shape, SynthType::Q8_0, SynthVocab::ByteLevel, &out, 1, false).unwrap();
        let f = GgufFile::open(&out).unwrap();
        let cfg = resin_model::ModelConfig::from_gguf(&f).unwrap();
        assert_eq!(cfg.arch, arch);
        assert_eq!(cfg.moe, Some(resin_model::Moe { n_expert: 8, n_expert_used: 2 }));
        assert_eq!((cfg.n_embd, cfg.n_ff, cfg.n_layer, cfg.vocab), (256, 256, 3, 259));
        assert_eq!(cfg.qk_norm, arch == resin_model::Arch::Qwen3Moe);
        assert_eq!(cfg.tied_output, arch == resin_model::Arch::Llama);
        let t = |n: &str| f.tensor(n).unwrap_or_else(|| panic!("{shape}: {n}"));
        assert_eq!(t("blk.2.ffn_gate_inp.weight").dims, vec![256, 8]);
        assert_eq!(t("blk.2.ffn_gate_inp.weight").ty, GgmlType::F32);
        assert_eq!(t("blk.2.ffn_gate_exps.weight").dims, vec![256, 256, 8]);
        assert_eq!(t("blk.2.ffn_up_exps.weight").dims, vec![256, 256, 8]);
        assert_eq!(t("blk.2.ffn_down_exps.weight").dims, vec![256, 256, 8]);
        assert_eq!(t("blk.2.ffn_down_exps.weight").ty, GgmlType::Q8_0);
        assert!(f.tensor("blk.0.ffn_gate.weight").is_none());
        let mut text = Vec::new();
        resin::inspect::inspect(&out, &mut text, false).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("experts     8") && text.contains("experts/row 2"), "{text}");
        let tok = resin_model::Tokenizer::from_gguf(&f).unwrap();
        let ids = tok.encode("héllo, wörld", false, false).unwrap();
        assert_eq!(ids.len(), "héllo, wörld".len(), "a byte a token: {ids:?}");
        assert_eq!(tok.decode(&ids, false), "héllo, wörld");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `--layers`: the shape's tensors for fewer layers, and no model of none.
#[test]
fn a_shape_takes_fewer_layers() {
    use resin::synth::SynthShape;
    let d = tmp_dir("layers");
    let out = d.join("one.gguf");
    resin::synth::synth_layers(SynthShape::Qwen3MoeTiny, SynthType::Q8_0, SynthVocab::ByteLevel, &out, 1, 1, false).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let cfg = resin_model::ModelConfig::from_gguf(&f).unwrap();
    assert_eq!((cfg.n_layer, cfg.n_embd, cfg.moe.map(|m| m.n_expert)), (1, 256, Some(8)));
    assert!(f.tensor("blk.0.ffn_gate_exps.weight").is_some() && f.tensor("blk.1.attn_q.weight").is_none());
    let err = resin::synth::synth_layers(SynthShape::Qwen3MoeTiny, SynthType::Q8_0, SynthVocab::ByteLevel, &d.join("none.gguf"), 1, 0, false).unwrap_err();
    assert!(err.to_string().contains("at least one layer"), "{err}");
    assert!(!d.join("none.gguf").exists());
}

/// Q4_K_M of MoE shapes follows llama.cpp: ffn_down_exps Q6_K where use_more_bits holds, and
/// with exactly 8 experts (Mixtral) attn_k / attn_v Q8_0 and attn_output Q5_K; the router F32.
#[test]
fn moe_q4_k_m_follows_the_llama_cpp_mix() {
    use resin::synth::{SynthMoe, SynthShape};
    let mixtral = SynthShape::MixtralTiny.spec(SynthVocab::ByteLevel);
    let plan = tensor_plan(&mixtral, SynthType::Q4_K_M, 259);
    let ty = |p: &[resin::synth::PlannedTensor], n: &str| p.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}")).ty;
    for i in 0..3 {
        let more = if use_more_bits(i, 3) { GgmlType::Q6_K } else { GgmlType::Q4_K };
        assert_eq!(ty(&plan, &format!("blk.{i}.attn_k.weight")), GgmlType::Q8_0);
        assert_eq!(ty(&plan, &format!("blk.{i}.attn_v.weight")), GgmlType::Q8_0);
        assert_eq!(ty(&plan, &format!("blk.{i}.attn_output.weight")), GgmlType::Q5_K);
        assert_eq!(ty(&plan, &format!("blk.{i}.ffn_down_exps.weight")), more);
        assert_eq!(ty(&plan, &format!("blk.{i}.ffn_gate_exps.weight")), GgmlType::Q4_K);
        assert_eq!(ty(&plan, &format!("blk.{i}.ffn_gate_inp.weight")), GgmlType::F32);
    }
    let big = SynthShape::Qwen3Moe30B.spec(SynthVocab::File("unused.gguf".into()));
    assert_eq!(big.moe, Some(SynthMoe { experts: 128, used: 8, ffn: 768 }));
    let plan = tensor_plan(&big, SynthType::Q4_K_M, 151936);
    assert_eq!(plan.len(), 2 + 48 * 12 + 1);
    for i in 0..48 {
        let more = if use_more_bits(i, 48) { GgmlType::Q6_K } else { GgmlType::Q4_K };
        assert_eq!(ty(&plan, &format!("blk.{i}.attn_v.weight")), more);
        assert_eq!(ty(&plan, &format!("blk.{i}.attn_k.weight")), GgmlType::Q4_K);
        assert_eq!(ty(&plan, &format!("blk.{i}.ffn_down_exps.weight")), more);
        assert_eq!(ty(&plan, &format!("blk.{i}.ffn_up_exps.weight")), GgmlType::Q4_K);
    }
    let find = |n: &str| plan.iter().find(|t| t.name == n).unwrap().dims.clone();
    assert_eq!(find("blk.47.ffn_gate_exps.weight"), vec![2048, 768, 128]);
    assert_eq!(find("blk.47.ffn_down_exps.weight"), vec![768, 2048, 128]);
    assert_eq!(find("blk.0.attn_q.weight"), vec![2048, 4096]);
    assert_eq!(find("output.weight"), vec![2048, 151936]);
    assert_eq!(ty(&plan, "output.weight"), GgmlType::Q6_K);
    assert_eq!(ty(&plan, "token_embd.weight"), GgmlType::Q4_K);
}

/// A vocabulary shorter than the shape's rows is padded with unused tokens.
#[test]
fn short_vocabularies_are_padded_to_min_vocab() {
    use resin::synth::SynthShape;
    let d = tmp_dir("pad");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 100);
    let mut spec = SynthShape::MixtralTiny.spec(SynthVocab::File(vocab));
    spec.min_vocab = 320;
    let out = d.join("padded.gguf");
    synth_with(&spec, SynthType::Q8_0, &out, 0, false).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let toks = f.get("tokenizer.ggml.tokens").and_then(Value::as_array).unwrap();
    assert_eq!(toks.len(), 320);
    assert_eq!(toks[319].as_str(), Some("[PAD319]"));
    assert_eq!(f.get("tokenizer.ggml.token_type").and_then(Value::as_array).unwrap().len(), 320);
    assert_eq!(f.tensor("token_embd.weight").unwrap().dims, vec![256, 320]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The Gemma 3 270M shape: the keys and tensors llama.cpp's gemma3 loader reads, and resin's
/// config reads back its layers, sliding-window pattern and rope bases. The vocabulary is a tiny
/// one left unpadded so that the file stays small; the padded plan is checked without writing.
#[test]
fn gemma3_270m_reads_back_with_its_sliding_window_layers() {
    use resin::synth::{SynthShape, SynthSwa};
    let d = tmp_dir("gemma");
    let vocab = d.join("vocab.gguf");
    write_tiny_vocab(&vocab, 300);
    let mut spec = SynthShape::Gemma3_270M.spec(SynthVocab::File(vocab.clone()));
    assert_eq!(spec.min_vocab, 262144);
    assert_eq!(spec.swa, Some(SynthSwa { window: 512, every: 6, rope_base: 10000.0 }));
    spec.min_vocab = 0;
    let out = d.join("gemma3-270m.gguf");
    synth_with(&spec, SynthType::Q4_K_M, &out, 1, false).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("gemma3"));
    assert_eq!(f.get_u64("gemma3.attention.sliding_window").unwrap(), Some(512));
    assert_eq!(f.get_f64("gemma3.rope.freq_base_swa").unwrap(), Some(10000.0));
    // A converted gemma3 file leaves the pattern to the loaders' default.
    assert!(f.get("gemma3.attention.sliding_window_pattern").is_none());

    let cfg = resin_model::ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(cfg.arch, resin_model::Arch::Gemma3);
    assert_eq!((cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff), (18, 640, 4, 1, 256, 2048));
    assert_eq!((cfg.vocab, cfg.ctx_train), (300, 32768));
    assert!(cfg.tied_output && cfg.qk_norm && cfg.post_norms);
    assert_eq!(cfg.ffn_act, resin_model::FfnAct::GeluTanh);
    assert!((cfg.rms_eps - 1e-6).abs() < 1e-12);
    let swa = cfg.swa.as_ref().expect("sliding-window layers");
    assert_eq!(swa.window, 512);
    let global: Vec<usize> = (0..18).filter(|&l| cfg.layer_window(l).is_none()).collect();
    assert_eq!(global, vec![5, 11, 17]);
    for l in 0..18 {
        let want = if global.contains(&l) { 1_000_000.0 } else { 10_000.0 };
        assert_eq!(cfg.layer_rope_base(l), want, "layer {l}");
    }
    assert_eq!(cfg.rope_bases(), vec![1_000_000.0, 10_000.0]);
    let mut text = Vec::new();
    resin::inspect::inspect(&out, &mut text, false).unwrap();
    assert!(String::from_utf8(text).unwrap().contains("architecture  gemma3"));

    // Without a gemma3 vocabulary the shape is refused.
    let err = resin::synth::synth(SynthShape::Gemma3_270M, SynthType::Q8_0, SynthVocab::ByteLevel, &d.join("no.gguf"), 0, false).unwrap_err();
    assert!(format!("{err:#}").contains("gemma3 vocabulary"), "{err:#}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Gemma 3's Q4_K_M follows llama-quantize, fallbacks included (its hidden sizes are not whole
/// Q4_K blocks): the mix of Google's own gemma-3-270m Q4_K_M file, and the 1B's table.
#[test]
fn gemma3_q4_k_m_takes_llama_quantize_fallbacks() {
    use resin::synth::SynthShape;
    let ty = |p: &[resin::synth::PlannedTensor], n: &str| p.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}")).ty;
    let dims = |p: &[resin::synth::PlannedTensor], n: &str| p.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n}")).dims.clone();
    for (shape, h, n, ff) in [(SynthShape::Gemma3_270M, 640u64, 18, 2048u64), (SynthShape::Gemma3_1B, 1152, 26, 6912)] {
        let spec = shape.spec(SynthVocab::File("unused.gguf".into()));
        let plan = tensor_plan(&spec, SynthType::Q4_K_M, 262144);
        assert_eq!(plan.len(), 1 + n * 13 + 1, "{shape}: no output.weight");
        assert_eq!(dims(&plan, "token_embd.weight"), vec![h, 262144]);
        assert_eq!(ty(&plan, "token_embd.weight"), GgmlType::Q8_0);
        for i in 0..n {
            let p = format!("blk.{i}.");
            let more = use_more_bits(i, n);
            assert_eq!(ty(&plan, &format!("{p}attn_q.weight")), GgmlType::Q5_0);
            assert_eq!(ty(&plan, &format!("{p}attn_k.weight")), GgmlType::Q5_0);
            assert_eq!(ty(&plan, &format!("{p}attn_v.weight")), if more { GgmlType::Q8_0 } else { GgmlType::Q5_0 });
            assert_eq!(ty(&plan, &format!("{p}attn_output.weight")), GgmlType::Q4_K);
            assert_eq!(ty(&plan, &format!("{p}ffn_gate.weight")), GgmlType::Q5_0);
            assert_eq!(ty(&plan, &format!("{p}ffn_up.weight")), GgmlType::Q5_0);
            assert_eq!(ty(&plan, &format!("{p}ffn_down.weight")), if more { GgmlType::Q6_K } else { GgmlType::Q4_K });
            assert_eq!(dims(&plan, &format!("{p}attn_q.weight")), vec![h, 1024]);
            assert_eq!(dims(&plan, &format!("{p}attn_k.weight")), vec![h, 256]);
            assert_eq!(dims(&plan, &format!("{p}attn_output.weight")), vec![1024, h]);
            assert_eq!(dims(&plan, &format!("{p}ffn_down.weight")), vec![ff, h]);
            for norm in ["attn_q_norm", "attn_k_norm"] {
                assert_eq!(dims(&plan, &format!("{p}{norm}.weight")), vec![256]);
            }
            for norm in ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"] {
                assert_eq!(dims(&plan, &format!("{p}{norm}.weight")), vec![h]);
                assert_eq!(ty(&plan, &format!("{p}{norm}.weight")), GgmlType::F32);
            }
        }
        // Q8_0 needs no fallback: every matrix Q8_0.
        let q8 = tensor_plan(&spec, SynthType::Q8_0, 262144);
        assert!(q8.iter().all(|t| t.ty == if t.ones { GgmlType::F32 } else { GgmlType::Q8_0 }), "{shape}");
    }
    // The 270M's counts as in Google's Q4_K_M file: half its attn_v / ffn_down get more bits.
    assert_eq!((0..18).filter(|&i| use_more_bits(i, 18)).count(), 9);
}
