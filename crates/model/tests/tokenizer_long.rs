//! Issue 33 item 5: a prompt up to the server's body limit (4 MiB) made of one long run of a
//! character class tokenizes, in bounded time. fancy-regex's backtracking VM used to refuse
//! runs of about a million characters ("Max stack size exceeded for backtracking"). That the
//! scanners give the regexes' exact pieces is proved by the unit test
//! `tokenizer::tests::scanners_match_regexes`, and the llama.cpp vectors in tests/tokenizer.rs.
//! Long words merge through their own queue; it is checked here against the plain heap
//! (`encode_reference`) on shorter runs of each class.
//!
//! Speed is measured, not asserted: `bench_long_runs` (ignored) prints the time of each case,
//! `cargo test --release -p resin-model --test tokenizer_long -- --ignored --nocapture bench`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use resin_gguf::GgufFile;
use resin_model::Tokenizer;

fn vocab(name: &str) -> Tokenizer {
    let dir =
        std::env::var_os("RESIN_VOCAB_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/resin-dev/vocab"));
    let p = dir.join(format!("ggml-vocab-{name}.gguf"));
    if !p.exists() {
        // The vocabularies of tests/tokenizer.rs, fetched the same way.
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_vocab_tests.sh");
        let status = std::process::Command::new("bash").arg(&script).arg(&dir).status();
        assert!(matches!(status, Ok(s) if s.success()), "fetching the vocabularies with {} failed: {status:?}", script.display());
    }
    let f = GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch_vocab_tests.sh", p.display()));
    Tokenizer::from_gguf(&f).unwrap()
}

fn smollm2() -> Tokenizer {
    let p = resin_hub::ensure("smollm2-135m", false).unwrap_or_else(|e| panic!("fetching smollm2-135m: {e}"));
    Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap()
}

const LIMIT: usize = 4 << 20;

/// Runs of one character class (and, last, ordinary text), as the pre-tokenizers see them.
const UNITS: [(&str, &str); 11] = [
    ("spaces", " "),
    ("letters", "a"),
    ("digits", "7"),
    ("punct", "!"),
    ("newlines", "\n"),
    ("crlf", "\r\n"),
    ("tabs", "\t"),
    ("cjk", "日"),
    ("words", "ab "),
    ("apostrophes", "'"),
    ("prose", "The quick brown fox, 1234 times: jumps over\tthe lazy dog's 日本 kennel!\n  "),
];

/// `unit` repeated to `bytes` bytes at most.
fn run_of(unit: &str, bytes: usize) -> String {
    unit.repeat(bytes / unit.len())
}

fn check(name: &str, tok: &Tokenizer) {
    for (class, unit) in UNITS {
        let text = run_of(unit, LIMIT);
        let ids = tok.encode(&text, true, false).unwrap_or_else(|e| panic!("{name}, 4 MiB of {class}: {e}"));
        assert!(!ids.is_empty());
        // The length bound the server refuses over-long prompts by holds.
        let least = tok.min_tokens(text.len());
        assert!(least <= ids.len() && least > 1000, "{name}, {class}: at least {least} tokens, got {}", ids.len());
        assert!(tok.decode(&ids, false) == text, "{name}, {class}: the round trip changed the text");
        // Shorter runs (long words all the same, odd and even lengths, with a word after) give
        // what the plain heap gives.
        for bytes in [1500, 4099, 65_536, 200_003] {
            for tail in ["", "x", " x"] {
                let t = run_of(unit, bytes) + tail;
                let got = tok.encode(&t, true, false).unwrap();
                let want = tok.encode_reference(&t, true, false).unwrap();
                assert!(got == want, "{name}, {bytes} bytes of {class} then {tail:?}: not the reference tokens");
            }
        }
    }
}

#[test]
fn long_runs_llama3() {
    check("llama-bpe", &vocab("llama-bpe"));
}

#[test]
fn long_runs_smollm() {
    check("smollm2", &smollm2());
}

/// The time to tokenize each 4 MiB case: the least and the median of `RESIN_BENCH_REPS` runs
/// (default 5), then the slowest case.
#[test]
#[ignore]
fn bench_long_runs() {
    let reps: usize = std::env::var("RESIN_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    let mut worst = (Duration::ZERO, String::new());
    for (name, tok) in [("llama-bpe", vocab("llama-bpe")), ("smollm2", smollm2())] {
        for (class, unit) in UNITS {
            let text = run_of(unit, LIMIT);
            let mut times = Vec::with_capacity(reps);
            let mut n = 0;
            for _ in 0..reps {
                let t = Instant::now();
                n = tok.encode(&text, true, false).unwrap().len();
                times.push(t.elapsed());
            }
            times.sort();
            let (min, median) = (times[0], times[reps / 2]);
            println!("bench {name:9} 4 MiB of {class:11} {n:8} tokens  min {:7.1} ms  median {:7.1} ms", ms(min), ms(median));
            if median > worst.0 {
                worst = (median, format!("{name}, {class}"));
            }
        }
    }
    println!("bench slowest median: {} ({:.1} ms), {reps} runs each", worst.1, ms(worst.0));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
