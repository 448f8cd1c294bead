//! Feed arbitrary bytes to the GGUF reader. It must return `Ok` or a `GgufError`; a panic, an
//! out-of-bounds read, or an allocation past libFuzzer's limit is a finding. On success every
//! metadata value and every tensor's data slice is walked, and the keys a model loader reads are
//! fetched with the typed getters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use resin_gguf::{GgufFile, Value};

fn walk(v: &Value, acc: &mut u64) {
    *acc = acc.wrapping_add(v.as_u64().unwrap_or(0));
    *acc = acc.wrapping_add(v.as_f64().map(f64::to_bits).unwrap_or(0));
    let _ = v.as_bool();
    if let Some(s) = v.as_str() {
        *acc = acc.wrapping_add(s.len() as u64);
    }
    if let Some(items) = v.as_array() {
        for it in items {
            walk(it, acc);
        }
    }
    let _ = v.display_short(3);
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let mut acc = 0u64;
    for (k, v) in f.metadata() {
        acc = acc.wrapping_add(k.len() as u64);
        walk(v, &mut acc);
        // The index must agree with the list.
        assert!(f.get(k).is_some());
    }
    let arch = f.get_str("general.architecture").ok().flatten().unwrap_or("llama").to_string();
    for key in [
        "context_length",
        "embedding_length",
        "block_count",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "rope.dimension_count",
        "vocab_size",
        "expert_count",
    ] {
        let _ = f.get_u64(&format!("{arch}.{key}"));
    }
    for key in ["attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor"] {
        let _ = f.get_f64(&format!("{arch}.{key}"));
    }
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "general.alignment", "general.file_type"] {
        let _ = f.get_u64(key);
    }
    for key in ["general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"] {
        let _ = f.get_str(key);
    }
    let _ = f.get_bool("tokenizer.ggml.add_bos_token");
    let _ = f.require("general.architecture");

    let len = f.file_len();
    for t in f.tensors() {
        assert!(f.tensor(&t.name).is_some());
        let d = f.tensor_data(t);
        assert_eq!(d.len() as u64, t.size);
        assert!(f.data_offset + t.offset + t.size <= len);
        assert_eq!(t.offset % f.alignment, 0);
        acc = acc.wrapping_add(d.first().copied().unwrap_or(0) as u64);
        acc = acc.wrapping_add(d.last().copied().unwrap_or(0) as u64);
        let (rows, cols) = t.rows_cols();
        assert_eq!((rows as u64) * (cols as u64), t.n_elements());
        assert_eq!(t.row_bytes() as u64 * rows as u64, t.size);
    }
    std::hint::black_box(acc);
});
