//! `resin inspect`: a readable summary of a GGUF file.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use resin_gguf::{GgmlType, GgufFile, Value};

/// Array items shown for metadata arrays.
const SHOWN_ITEMS: usize = 8;

/// Write a summary of the GGUF at `path` to `out`: file, version, architecture and
/// hyperparameters, tokenizer, chat template, the other metadata, tensor formats and (with
/// `show_all`) every tensor. A bad file gives the reader's error.
pub fn inspect(path: &Path, out: &mut impl Write, show_all: bool) -> Result<()> {
    let f = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    report(&f, path, out, show_all)
}

fn report(f: &GgufFile, path: &Path, out: &mut impl Write, show_all: bool) -> Result<()> {
    let mut shown: HashSet<&str> = HashSet::new();
    let mut get = |key: &'static str| -> Option<&Value> {
        shown.insert(key);
        f.get(key)
    };

    let len = f.file_len();
    writeln!(out, "file          {} ({} bytes, {})", path.display(), len, human_bytes(len))?;
    writeln!(out, "gguf          v{}, {} metadata keys, {} tensors, alignment {}", f.version, f.metadata().len(), f.tensors().len(), f.alignment)?;
    let arch = get("general.architecture").and_then(Value::as_str).unwrap_or("?").to_string();
    writeln!(out, "architecture  {arch}")?;
    if let Some(v) = get("general.name") {
        writeln!(out, "name          {}", plain(v))?;
    }
    if let Some(v) = get("general.file_type") {
        let ft = v.as_u64().map(|n| format!("{n} ({})", file_type_name(n))).unwrap_or_else(|| plain(v));
        writeln!(out, "file type     {ft}")?;
    }

    writeln!(out, "\nhyperparameters")?;
    let hp: [(&str, &str); 14] = [
        ("block_count", "layers"),
        ("embedding_length", "embedding"),
        ("attention.head_count", "heads"),
        ("attention.head_count_kv", "kv heads"),
        ("attention.key_length", "key length"),
        ("feed_forward_length", "ffn"),
        ("context_length", "context"),
        ("rope.freq_base", "rope base"),
        ("rope.dimension_count", "rope dims"),
        ("attention.layer_norm_rms_epsilon", "rms eps"),
        ("vocab_size", "vocab size"),
        ("expert_count", "experts"),
        ("expert_used_count", "experts/row"),
        ("expert_feed_forward_length", "expert ffn"),
    ];
    let arch_keys: Vec<String> = hp.iter().map(|(k, _)| format!("{arch}.{k}")).collect();
    for ((_, label), key) in hp.iter().zip(&arch_keys) {
        let v = f.get(key);
        if v.is_none() && matches!(*label, "key length" | "vocab size" | "experts" | "experts/row" | "expert ffn") {
            continue; // optional keys: only shown when present
        }
        writeln!(out, "  {label:<12}{}", v.map(plain).unwrap_or_else(|| "-".into()))?;
    }
    let arch_keys: HashSet<&str> = arch_keys.iter().map(String::as_str).collect();

    writeln!(out, "\ntokenizer")?;
    let model = get("tokenizer.ggml.model").map(plain).unwrap_or_else(|| "-".into());
    let pre = get("tokenizer.ggml.pre").map(plain).unwrap_or_else(|| "-".into());
    let n_tokens = get("tokenizer.ggml.tokens").and_then(Value::as_array).map(<[Value]>::len);
    writeln!(out, "  model       {model}")?;
    writeln!(out, "  pre         {pre}")?;
    writeln!(out, "  vocab       {}", n_tokens.map(|n| n.to_string()).unwrap_or_else(|| "-".into()))?;
    if let Some(n) = get("tokenizer.ggml.merges").and_then(Value::as_array).map(<[Value]>::len) {
        writeln!(out, "  merges      {n}")?;
    }
    let token_text = |id: &Value| -> String {
        let Some(i) = id.as_u64() else { return plain(id) };
        let text = f.get("tokenizer.ggml.tokens").and_then(Value::as_array).and_then(|a| a.get(i as usize)).and_then(Value::as_str);
        match text {
            Some(t) => format!("{i} {t:?}"),
            None => i.to_string(),
        }
    };
    for (key, label) in
        [("tokenizer.ggml.bos_token_id", "bos"), ("tokenizer.ggml.eos_token_id", "eos"), ("tokenizer.ggml.eot_token_id", "eot"), ("tokenizer.ggml.padding_token_id", "pad")]
    {
        if let Some(v) = get(key) {
            writeln!(out, "  {label:<12}{}", token_text(v))?;
        } else if matches!(label, "bos" | "eos") {
            writeln!(out, "  {label:<12}-")?;
        }
    }
    for (key, label) in [("tokenizer.ggml.add_bos_token", "add_bos"), ("tokenizer.ggml.add_eos_token", "add_eos")] {
        if let Some(v) = get(key) {
            writeln!(out, "  {label:<12}{}", plain(v))?;
        } else if label == "add_bos" {
            writeln!(out, "  {label:<12}- (unset)")?;
        }
    }
    shown.insert("tokenizer.ggml.token_type");
    shown.insert("tokenizer.ggml.scores");
    match f.get("tokenizer.chat_template").and_then(Value::as_str) {
        Some(t) => {
            shown.insert("tokenizer.chat_template");
            let first = t.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            let first: String = first.chars().take(100).collect();
            writeln!(out, "  chat tmpl   yes, {} bytes, {} lines; first: {first:?}", t.len(), t.lines().count())?;
        }
        None => writeln!(out, "  chat tmpl   none")?,
    }

    let others: Vec<&(String, Value)> = f.metadata().iter().filter(|(k, _)| !shown.contains(k.as_str()) && !arch_keys.contains(k.as_str())).collect();
    if !others.is_empty() {
        writeln!(out, "\nother metadata")?;
        let w = others.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in others {
            writeln!(out, "  {k:<w$}  {}", v.display_short(SHOWN_ITEMS))?;
        }
    }

    writeln!(out, "\ntensor formats")?;
    let mut by_ty: BTreeMap<u32, (GgmlType, usize, u64, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = by_ty.entry(t.ty.id()).or_insert((t.ty, 0, 0, 0));
        e.1 += 1;
        e.2 += t.size;
        e.3 += t.n_elements();
    }
    let (mut n, mut bytes, mut params) = (0usize, 0u64, 0u64);
    for (ty, count, b, p) in by_ty.values() {
        writeln!(out, "  {:<6} {count:>5} tensors {:>12} {:>14} params", ty.name(), human_bytes(*b), group(*p))?;
        n += count;
        bytes += b;
        params += p;
    }
    writeln!(out, "  {:<6} {n:>5} tensors {:>12} {:>14} params ({})", "total", human_bytes(bytes), group(params), human_count(params))?;
    if params > 0 {
        writeln!(out, "  {:.3} bits per parameter", bytes as f64 * 8.0 / params as f64)?;
    }

    if show_all {
        writeln!(out, "\ntensors (shape in ggml order, row length first)")?;
        let w = f.tensors().iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in f.tensors() {
            let shape = t.dims.iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
            writeln!(out, "  {:<w$}  {shape:<16} {:<6} {:>12}", t.name, t.ty.name(), t.size)?;
        }
    }
    Ok(())
}

/// A value without quotes for strings, short for everything else.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.display_short(SHOWN_ITEMS),
    }
}

/// llama_ftype names (general.file_type).
fn file_type_name(n: u64) -> &'static str {
    match n {
        0 => "all F32",
        1 => "mostly F16",
        2 => "mostly Q4_0",
        3 => "mostly Q4_1",
        7 => "mostly Q8_0",
        8 => "mostly Q5_0",
        9 => "mostly Q5_1",
        10 => "mostly Q2_K",
        11 => "mostly Q3_K_S",
        12 => "mostly Q3_K_M",
        13 => "mostly Q3_K_L",
        14 => "mostly Q4_K_S",
        15 => "mostly Q4_K_M",
        16 => "mostly Q5_K_S",
        17 => "mostly Q5_K_M",
        18 => "mostly Q6_K",
        32 => "mostly BF16",
        _ => "other",
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// 1234567 -> "1,234,567".
fn group(n: u64) -> String {
    let s = n.to_string();
    let head = s.len() - (s.len() - 1) / 3 * 3; // digits before the first comma: 1..=3
    let mut out = String::from(&s[..head]);
    for chunk in s.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_digits() {
        assert_eq!(super::group(0), "0");
        assert_eq!(super::group(999), "999");
        assert_eq!(super::group(1000), "1,000");
        assert_eq!(super::group(1235814400), "1,235,814,400");
    }
}
