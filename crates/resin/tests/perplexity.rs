//! `resin perplexity` end to end: within 1% of llama.cpp's `llama-perplexity` on the same text,
//! context and windows (the fixture scripts/llama_perplexity_fixture.sh writes), the Vulkan
//! home's KL divergence against the CPU home's (with a perturbed base as the control that must
//! show a large one), and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use resin_quality::BaseFile;
use sha2::{Digest, Sha256};

const MODEL: &str = "smollm2-135m";
/// The fixture the CI test holds resin to: a slice of the text (a few windows) so it runs in
/// seconds; the script computes it on the same slice.
const FIXTURE: &str = "testdata/perplexity/smollm2-135m-ctx128-chunks8.json";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text() -> PathBuf {
    root().join("testdata/text/paradise-lost.txt")
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("resin-ppl-test-{}-{name}", std::process::id()))
}

/// `resin perplexity ARGS` (the registry model fetched first, under the hub's lock).
fn resin(args: &[&str]) -> Output {
    resin_hub::ensure(MODEL, false).unwrap_or_else(|e| panic!("fetching {MODEL}: {e}"));
    Command::new(env!("CARGO_BIN_EXE_resin")).arg("perplexity").args(["--log", "warn"]).args(args).output().expect("running resin perplexity")
}

/// The JSON line of a run that must succeed.
fn figures(args: &[&str]) -> serde_json::Value {
    let out = resin(&[args, &["--format", "json"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "resin perplexity {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// resin on `model` against the llama-perplexity fixture `fixture`, within 1%.
fn check_fixture(fixture: &str, model: &Path) {
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join(fixture)).unwrap()).unwrap();
    // The fixture is of this very text and model file.
    assert_eq!(fixture["text_sha256"].as_str().unwrap(), sha256(&text()), "the text changed since the fixture was written");
    assert_eq!(fixture["model_sha256"].as_str().unwrap(), sha256(model), "{} is another file than the fixture's", model.display());
    let (ctx, chunks) = (fixture["ctx"].as_u64().unwrap().to_string(), fixture["chunks"].as_u64().unwrap().to_string());
    let got = figures(&["--gpu", "off", "--model", model.to_str().unwrap(), "--file", text().to_str().unwrap(), "--ctx", &ctx, "--chunks", &chunks]);
    let (ppl, want) = (num(&got, "ppl"), num(&fixture, "ppl"));
    eprintln!("{}: resin {ppl:.4}, llama-perplexity {want:.4} (ctx {ctx}, {chunks} windows)", model.display());
    assert!((ppl / want - 1.0).abs() < 0.01, "resin's perplexity {ppl} is not within 1% of llama-perplexity's {want}");
    // Every scored position counts: ctx - 1 - ctx/2 a window.
    let c: u64 = ctx.parse().unwrap();
    assert_eq!(got["tokens"].as_u64().unwrap(), chunks.parse::<u64>().unwrap() * (c - 1 - c / 2));
    assert!(got["kld_mean"].is_null() && got["kld_p99"].is_null() && got["top1"].is_null(), "{got}");
}

#[test]
fn perplexity_within_1pct_of_llama_perplexity() {
    check_fixture(FIXTURE, &resin_hub::ensure(MODEL, false).unwrap());
}

/// The registry's models add no BOS, so BOS in each window's first slot is checked on a copy of
/// SmolLM2 whose `tokenizer.ggml.add_bos_token` is set true, as the fixture script's --add-bos
/// makes it.
#[test]
fn perplexity_with_bos_within_1pct_of_llama_perplexity() {
    let src = resin_hub::ensure(MODEL, false).unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    let key = b"tokenizer.ggml.add_bos_token";
    let head = &bytes[..bytes.len().min(1 << 20)];
    let found: Vec<usize> = head.windows(key.len()).enumerate().filter(|(_, w)| w == key).map(|(i, _)| i).collect();
    assert_eq!(found.len(), 1, "expected one {} key", String::from_utf8_lossy(key));
    let at = found[0] + key.len();
    assert_eq!(bytes[at..at + 4], 7u32.to_le_bytes(), "the key is not a bool");
    bytes[at + 4] = 1;
    let copy = tmp("add-bos.gguf");
    std::fs::write(&copy, &bytes).unwrap();
    drop(bytes);
    check_fixture("testdata/perplexity/smollm2-135m-add-bos-ctx128-chunks8.json", &copy);
    let _ = std::fs::remove_file(copy);
}

/// The CPU home's base, and a copy with each position's 64 logits handed to the ids in reverse
/// order (the base's favourite token now its least likely of the 64).
fn cpu_base(ctx: &str, chunks: &str, tag: &str) -> (PathBuf, PathBuf, serde_json::Value) {
    let base = tmp(&format!("{tag}-cpu.base"));
    let cpu = figures(&["--gpu", "off", "--model", MODEL, "--file", text().to_str().unwrap(), "--ctx", ctx, "--chunks", chunks, "--save-logits", base.to_str().unwrap()]);
    let mut b = BaseFile::read(&base).unwrap();
    for r in &mut b.records {
        let logits: Vec<f32> = r.top.iter().map(|&(_, l)| l).rev().collect();
        for (p, l) in r.top.iter_mut().zip(logits) {
            p.1 = l;
        }
    }
    let perturbed = tmp(&format!("{tag}-perturbed.base"));
    b.write(&perturbed).unwrap();
    (base, perturbed, cpu)
}

#[test]
fn the_meter_sees_a_perturbed_base() {
    let (base, perturbed, cpu) = cpu_base("64", "3", "control");
    let args = |b: &Path| figures(&["--gpu", "off", "--model", MODEL, "--file", text().to_str().unwrap(), "--ctx", "64", "--kl-base", b.to_str().unwrap()]);
    // The same home against its own base: nothing differs (the base also sets --chunks).
    let same = args(&base);
    assert!(num(&same, "kld_mean").abs() < 1e-9 && num(&same, "kld_p99").abs() < 1e-9, "{same}");
    assert_eq!(num(&same, "top1"), 1.0);
    assert_eq!(num(&same, "ppl"), num(&cpu, "ppl"));
    // The control: the perturbed base must read as a large divergence.
    let off = args(&perturbed);
    assert!(num(&off, "kld_mean") > 1.0, "a perturbed base gave a small KL: {off}");
    assert!(num(&off, "top1") < 0.1, "{off}");
    for p in [base, perturbed] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn vulkan_home_kl_against_cpu_home_is_small() {
    // Drop the probe's device before the child process takes it.
    match resin_vulkan::Gpu::start() {
        Ok(g) => drop(g),
        Err(e) => {
            if std::env::var("RESIN_REQUIRE_VULKAN").as_deref() == Ok("1") {
                panic!("RESIN_REQUIRE_VULKAN=1 but there is no Vulkan device: {e}");
            }
            eprintln!("SKIP: no Vulkan device ({e}); apt-get install mesa-vulkan-drivers libvulkan1");
            return;
        }
    }
    // Two short windows: lavapipe runs the Vulkan home's shaders on the CPU, slowly.
    let (ctx, chunks) = ("32", "2");
    let (base, perturbed, cpu) = cpu_base(ctx, chunks, "vulkan");
    let file = text();
    let run = |gpu: &str, b: &Path| figures(&["--gpu", gpu, "--model", MODEL, "--file", file.to_str().unwrap(), "--ctx", ctx, "--kl-base", b.to_str().unwrap()]);
    // The homes sum in different orders and round at different points, so their
    // distributions differ a little at every position; the bars leave room for that and none
    // for a wrong token, position or window.
    let bars = |v: &serde_json::Value| num(v, "kld_mean") < 0.01 && num(v, "kld_p99") < 0.05 && num(v, "top1") > 0.85;
    let vk = run("vulkan", &base);
    eprintln!("Vulkan against CPU: {vk} (CPU {cpu})");
    assert!(bars(&vk), "the Vulkan home drifts from the CPU home: {vk}");
    // Over so few positions the perplexity moves with that per-position noise: a loose bar,
    // which a wrong window or target would still break.
    assert!((num(&vk, "ppl") / num(&cpu, "ppl") - 1.0).abs() < 0.1, "{vk} vs {cpu}");
    // The control: the same bars must fail for a perturbed base (measured on the CPU home,
    // which equals its own base exactly, so only the perturbation shows).
    let off = run("off", &perturbed);
    assert!(!bars(&off) && num(&off, "kld_mean") > 1.0, "a perturbed base passed the bars: {off}");
    for p in [base, perturbed] {
        let _ = std::fs::remove_file(p);
    }
}

/// A run that must fail, with `needle` in its error.
fn fails_with(args: &[&str], needle: &str) {
    let out = resin(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "resin perplexity {args:?} succeeded");
    assert!(err.contains(needle), "resin perplexity {args:?}: expected {needle:?} in the error, got: {err}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let t = text();
    let t = t.to_str().unwrap();
    fails_with(&["--gpu", "off", "--file", "/nonexistent/text.txt"], "reading /nonexistent/text.txt");
    let empty = tmp("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    fails_with(&["--gpu", "off", "--file", empty.to_str().unwrap()], "is empty");
    let short = tmp("short.txt");
    std::fs::write(&short, "Of Man's first disobedience, and the fruit").unwrap();
    fails_with(&["--gpu", "off", "--model", MODEL, "--file", short.to_str().unwrap(), "--ctx", "64"], "needs at least 128");
    let junk = tmp("junk.base");
    std::fs::write(&junk, b"not a base at all").unwrap();
    fails_with(&["--gpu", "off", "--file", t, "--kl-base", junk.to_str().unwrap()], "not a resin logits base");
    // A base of another context, and of another model's vocabulary, are refused.
    let (base, perturbed, _) = cpu_base("32", "2", "mismatch");
    fails_with(&["--gpu", "off", "--model", MODEL, "--file", t, "--ctx", "64", "--kl-base", base.to_str().unwrap()], "--ctx 32");
    resin_hub::ensure("qwen2.5-coder-0.5b", false).expect("fetching qwen2.5-coder-0.5b");
    fails_with(&["--gpu", "off", "--model", "qwen2.5-coder-0.5b", "--file", t, "--ctx", "32", "--kl-base", base.to_str().unwrap()], "vocabulary of 49152");
    for p in [empty, short, junk, base, perturbed] {
        let _ = std::fs::remove_file(p);
    }
}
