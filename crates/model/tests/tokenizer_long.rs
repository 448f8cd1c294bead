//! Issue 33 item 5: a prompt up to the server's body limit (4 MiB) made of one long run of a
//! character class tokenizes, in bounded time. fancy-regex's backtracking VM used to refuse
//! runs of about a million characters ("Max stack size exceeded for backtracking"). That the
//! scanners give the regexes' exact pieces is proved by the unit test
//! `tokenizer::tests::scanners_match_regexes`, and the llama.cpp vectors in tests/tokenizer.rs.

use std::path::PathBuf;
use std::time::Instant;

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

fn check(name: &str, tok: &Tokenizer) {
    let units = [
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
    ];
    for (class, unit) in units {
        let text = unit.repeat(LIMIT / unit.len());
        let t = Instant::now();
        let ids = tok.encode(&text, true, false).unwrap_or_else(|e| panic!("{name}, 4 MiB of {class}: {e}"));
        let dt = t.elapsed();
        println!("{name}: 4 MiB of {class}: {} tokens in {dt:?}", ids.len());
        assert!(!ids.is_empty());
        // The length bound the server refuses over-long prompts by holds.
        let least = tok.min_tokens(text.len());
        assert!(least <= ids.len() && least > 1000, "{name}, {class}: at least {least} tokens, got {}", ids.len());
        // Generous for CI noise: the regex path errored outright.
        assert!(dt.as_secs_f64() < 10.0, "{name}, 4 MiB of {class}: {dt:?}");
        assert_eq!(tok.decode(&ids, false).len(), text.len(), "{name}, {class}: round trip");
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
