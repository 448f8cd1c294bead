//! Issue 33 item 5: a prompt up to the server's body limit (4 MiB) made of one long run of a
//! character class tokenizes, in bounded time. fancy-regex's backtracking VM used to refuse
//! runs of about a million characters ("Max stack size exceeded for backtracking"). That the
//! scanners give the regexes' exact pieces is proved by the unit test
//! `tokenizer::tests::scanners_match_regexes`, and the llama.cpp vectors in tests/tokenizer.rs.
//! Long words merge through their own queue; it is checked here against the plain heap
//! (`encode_reference`) on shorter runs of each class. SentencePiece vocabularies (llama.cpp's
//! llama-spm, Gemma 3's) have no pre-tokenizer, so the whole text is one merge; they are checked
//! the same way, and against the float-score heap on random mixed text, also with vocabularies
//! whose scores were coarsened so that ties are the rule. Special tokens are found in one pass
//! (`parse_special`, as the server encodes prompts, and the user-defined ones without it);
//! `special_tokens_match_reference` checks that against the search per token on texts where
//! they meet in every way, also with overlapping tokens added to the vocabularies.
//!
//! Speed is measured, not asserted: `bench_long_runs` (ignored) prints the time of each case,
//! `cargo test --release -p resin-model --test tokenizer_long -- --ignored --nocapture bench`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use resin_gguf::{GgufFile, GgufWriter, Value, ValueType};
use resin_model::{TokenType, Tokenizer};

fn vocab(name: &str) -> Tokenizer {
    Tokenizer::from_gguf(&vocab_file(name)).unwrap()
}

fn vocab_file(name: &str) -> GgufFile {
    let dir =
        std::env::var_os("RESIN_VOCAB_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/resin-dev/vocab"));
    let p = dir.join(format!("ggml-vocab-{name}.gguf"));
    if !p.exists() {
        // The vocabularies of tests/tokenizer.rs, fetched the same way.
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_vocab_tests.sh");
        let status = std::process::Command::new("bash").arg(&script).arg(&dir).status();
        assert!(matches!(status, Ok(s) if s.success()), "fetching the vocabularies with {} failed: {status:?}", script.display());
    }
    GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch_vocab_tests.sh", p.display()))
}

fn model(name: &str) -> Tokenizer {
    let p = resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"));
    Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap()
}

fn smollm2() -> Tokenizer {
    model("smollm2-135m")
}

/// Gemma 3's SentencePiece vocabulary (262,144 tokens, no space prefix, runs of spaces and
/// newlines as user-defined tokens).
fn gemma3() -> Tokenizer {
    model("gemma3-270m")
}

/// llama.cpp's llama-spm vocabulary with each token's score replaced by `score(id, score)`.
fn rescored(score: impl Fn(usize, f32) -> f32) -> Tokenizer {
    let f = vocab_file("llama-spm");
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        let v = match (k.as_str(), v) {
            ("tokenizer.ggml.scores", Value::Array(_, items)) => {
                Value::Array(ValueType::F32, items.iter().enumerate().map(|(i, s)| Value::F32(score(i, s.as_f64().unwrap() as f32))).collect())
            }
            _ => v.clone(),
        };
        w.set(k.clone(), v);
    }
    Tokenizer::from_gguf(&GgufFile::from_bytes(w.write_all_to_vec(&[]).unwrap()).unwrap()).unwrap()
}

/// SentencePiece vocabularies for the comparisons with the reference: the two real ones, then
/// llama-spm with scores rounded to a few values (ties between different merges everywhere),
/// with every score equal but for its sign (the leftmost pair first; +0 above -0), and with
/// NaNs and infinities among the scores (ordered as `f32::total_cmp` orders them).
fn spm_vocabs() -> Vec<(&'static str, Tokenizer)> {
    vec![
        ("llama-spm", vocab("llama-spm")),
        ("gemma3", gemma3()),
        ("llama-spm, scores rounded", rescored(|_, s| (s / 4000.0).round() * 4000.0)),
        ("llama-spm, signed zeros", rescored(|i, _| if i % 3 == 0 { -0.0 } else { 0.0 })),
        (
            "llama-spm, NaN and infinities",
            rescored(|i, s| match i % 11 {
                0 => f32::NAN,
                1 => -f32::NAN,
                2 => f32::INFINITY,
                3 => f32::NEG_INFINITY,
                4 => -0.0,
                _ => s,
            }),
        ),
    ]
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

#[test]
fn long_runs_llama_spm() {
    check("llama-spm", &vocab("llama-spm"));
}

#[test]
fn long_runs_gemma3() {
    check("gemma3", &gemma3());
}

/// Pieces of the random texts (`|` between them): words, whitespace of each kind, digits,
/// punctuation, CJK and characters no vocabulary here has (byte fallback), SentencePiece's own
/// space mark, and texts that are special or byte tokens.
const PIECES: &str =
    " |  |    |\n|\n\n|\r\n|\t|a|e|s|t|th|the|ing|The|quick|brown|fox|aaaa|ab|x|0|7|123|2024|!|?|'|'s|,|.|...|-|日|本|語|😀|é|Ω|\u{2581}|<0x41>|<s>|</s>|<start_of_turn>";

/// The next number of a xorshift64* sequence.
fn rand(rng: &mut u64) -> usize {
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize
}

/// A text of `len` pieces from `rng`, a piece often repeated (runs of equal pairs, where ties
/// decide).
fn random_text(rng: &mut u64, len: usize) -> String {
    let pieces: Vec<&str> = PIECES.split('|').collect();
    let mut s = String::new();
    let mut n = 0;
    while n < len {
        let piece = pieces[rand(rng) % pieces.len()];
        let times = if rand(rng).is_multiple_of(4) { 1 + rand(rng) % 40 } else { 1 };
        for _ in 0..times {
            s.push_str(piece);
        }
        n += times;
    }
    s
}

/// Random mixed texts, short (the small queue) and long (the bucketed one), give the tokens of
/// the float-score heap on every SentencePiece vocabulary, with and without special tokens.
#[test]
fn spm_random_text_matches_reference() {
    let mut rng = 0x5eed_1234_abcd_0001u64;
    for (name, tok) in spm_vocabs() {
        for case in 0..240 {
            let len = match case % 4 {
                0 => 1 + case % 13,
                1 => 20 + case % 97,
                _ => 300 + (case * 37) % 3000,
            };
            let text = random_text(&mut rng, len);
            for (add_special, parse_special) in [(true, false), (false, true)] {
                let got = tok.encode(&text, add_special, parse_special).unwrap();
                let want = tok.encode_reference(&text, add_special, parse_special).unwrap();
                assert!(got == want, "{name}, case {case} ({} bytes, parse_special {parse_special}): not the reference tokens for {text:?}", text.len());
            }
        }
    }
}

/// Special tokens added to copies of llama.cpp's vocabularies (text, GGUF token type: 3
/// control, 4 user-defined), to have every way two of them can meet: one a prefix, a suffix or
/// the middle of another; equal lengths overlapping in a chain, the left one first and last in
/// id order; texts overlapping themselves; runs; one across two of the vocabulary's own
/// specials, longer than either; a second token of a text the vocabulary has (the first id wins,
/// or the only user-defined one without `parse_special`; not an end-of-generation text, which
/// would make it a control token); and multi-byte characters.
const ADDED: &[(&str, i32)] = &[
    ("<|a", 3),
    ("a|>", 4),
    ("<|a|>", 3),
    ("|a|", 4),
    ("abc", 4),
    ("bcd", 3),
    ("cde", 4),
    ("rst", 3),
    ("qrs", 4),
    ("pqr", 3),
    ("aa", 4),
    ("aaa", 3),
    ("abab", 4),
    ("bab", 3),
    ("\n\n", 4),
    ("\n\n\n", 3),
    ("  ", 4),
    ("id|><|start", 4),
    ("|><|", 3),
    ("s>\n<", 4),
    ("<s>", 4),
    ("<|start_header_id|>", 4),
    ("日本", 3),
    ("本語", 4),
    ("é日", 4),
];

/// llama.cpp's `name` vocabulary with the [`ADDED`] tokens after its own (score 0).
fn with_added(name: &str) -> Tokenizer {
    let f = vocab_file(name);
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        let add = |items: &[Value], new: &dyn Fn(&str, i32) -> Value| items.iter().cloned().chain(ADDED.iter().map(|&(t, ty)| new(t, ty))).collect();
        let v = match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(t, items)) => Value::Array(*t, add(items, &|t, _| Value::String(t.to_owned()))),
            ("tokenizer.ggml.scores", Value::Array(t, items)) => Value::Array(*t, add(items, &|_, _| Value::F32(0.0))),
            ("tokenizer.ggml.token_type", Value::Array(ValueType::I32, items)) => Value::Array(ValueType::I32, add(items, &|_, ty| Value::I32(ty))),
            ("tokenizer.ggml.token_type", _) => panic!("{name}: token types are not i32"),
            _ => v.clone(),
        };
        w.set(k.clone(), v);
    }
    Tokenizer::from_gguf(&GgufFile::from_bytes(w.write_all_to_vec(&[]).unwrap()).unwrap()).unwrap()
}

/// The texts of the tokens `encode` looks for before tokenizing: control, user-defined and
/// unknown ones.
fn special_texts(tok: &Tokenizer) -> Vec<String> {
    (0..tok.vocab_size() as u32)
        .filter(|&i| matches!(tok.token_type(i), Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown)))
        .map(|i| tok.token_text(i).unwrap().to_owned())
        .collect()
}

/// Texts where special tokens meet: each one followed by the rest of (at most two) others that
/// begin with its end, so that the two overlap; and each one without its last or first
/// character, a near miss.
fn meeting_pieces(specials: &[String]) -> Vec<String> {
    let sorted: BTreeSet<&str> = specials.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for a in specials {
        for (i, _) in a.char_indices().skip(1) {
            let tail = &a[i..];
            for b in sorted.range::<&str, _>(tail..).take_while(|b| b.starts_with(tail)).filter(|b| b.len() > tail.len()).take(2) {
                out.push(format!("{a}{}", &b[tail.len()..]));
            }
        }
        if let Some((last, _)) = a.char_indices().next_back().filter(|&(i, _)| i > 0) {
            out.push(a[..last].to_owned());
            out.push(a[a.chars().next().unwrap().len_utf8()..].to_owned());
        }
    }
    out
}

/// `len` pieces, each often repeated: ordinary text ([`PIECES`]), special tokens, and
/// `meeting` pieces, so that special tokens come alone, adjacent, overlapping and nested.
fn text_with_specials(rng: &mut u64, len: usize, specials: &[String], meeting: &[String]) -> String {
    let ordinary: Vec<&str> = PIECES.split('|').collect();
    let mut s = String::new();
    let mut n = 0;
    while n < len {
        let piece = match rand(rng) % 10 {
            0..=3 => ordinary[rand(rng) % ordinary.len()],
            4..=6 => specials[rand(rng) % specials.len()].as_str(),
            _ if meeting.is_empty() => ordinary[rand(rng) % ordinary.len()],
            _ => meeting[rand(rng) % meeting.len()].as_str(),
        };
        let times = if rand(rng).is_multiple_of(5) { 1 + rand(rng) % 12 } else { 1 };
        for _ in 0..times {
            s.push_str(piece);
        }
        n += times;
    }
    s
}

/// Texts mixing ordinary text with the vocabulary's special tokens (alone, adjacent,
/// overlapping, one inside another, runs of them) give the tokens of the reference, which
/// searches the text once per special token, with and without `parse_special`: on the four
/// vocabularies (Gemma 3's nest runs of whitespace), and on llama.cpp's two with [`ADDED`]
/// tokens, each of which must come out somewhere.
#[test]
fn special_tokens_match_reference() {
    let mut rng = 0x5eed_5bec_1a15_0002u64;
    let vocabs = [
        ("llama-bpe", vocab("llama-bpe")),
        ("llama-spm", vocab("llama-spm")),
        ("smollm2", smollm2()),
        ("gemma3", gemma3()),
        ("llama-bpe, tokens added", with_added("llama-bpe")),
        ("llama-spm, tokens added", with_added("llama-spm")),
    ];
    for (name, tok) in &vocabs {
        let specials = special_texts(tok);
        let meeting = meeting_pieces(&specials);
        let added = name.ends_with("added").then(|| (tok.vocab_size() - ADDED.len()) as u32..tok.vocab_size() as u32);
        let mut seen = vec![false; ADDED.len()];
        let mut special_out = 0;
        for case in 0..160 {
            let len = match case % 4 {
                0 => 1 + case % 7,
                1 => 10 + case % 53,
                _ => 200 + (case * 37) % 1500,
            };
            let text = text_with_specials(&mut rng, len, &specials, &meeting);
            for parse_special in [true, false] {
                let got = tok.encode(&text, true, parse_special).unwrap();
                let want = tok.encode_reference(&text, true, parse_special).unwrap();
                assert!(got == want, "{name}, case {case} ({} bytes, parse_special {parse_special}): not the reference tokens for {text:?}", text.len());
                special_out += got.iter().filter(|&&id| matches!(tok.token_type(id), Some(TokenType::Control | TokenType::UserDefined))).count();
                if let Some(added) = &added {
                    for &id in got.iter().filter(|id| added.contains(id)) {
                        seen[(id - added.start) as usize] = true;
                    }
                }
            }
        }
        assert!(special_out > 1000, "{name}: only {special_out} special tokens in the outputs");
        if added.is_some() {
            let missing: Vec<&str> = ADDED.iter().zip(&seen).filter(|(_, &s)| !s).map(|((t, _), _)| *t).collect();
            assert!(missing.is_empty(), "{name}: added tokens never taken: {missing:?}");
        }
    }
}

/// The time to tokenize each 4 MiB case: the least and the median of `RESIN_BENCH_REPS` runs
/// (default 5), then the slowest case. Every class without special tokens parsed, then a few
/// with (`parse_special`, as the server encodes prompts): prose, whitespace runs (Gemma 3's
/// user-defined tokens), `<b>` repeated (a Gemma 3 user-defined token; elsewhere text dense
/// with the `<` special tokens begin with) and a chat-like text dense with the vocabulary's own
/// control tokens.
/// `RESIN_BENCH_CASES`, if set, keeps only the cases whose "vocabulary, class" line contains it.
#[test]
#[ignore]
fn bench_long_runs() {
    let reps: usize = std::env::var("RESIN_BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    let only = std::env::var("RESIN_BENCH_CASES").unwrap_or_default();
    let mut worst = (Duration::ZERO, String::new());
    for (name, tok) in [("llama-bpe", vocab("llama-bpe")), ("smollm2", smollm2()), ("llama-spm", vocab("llama-spm")), ("gemma3", gemma3())] {
        let chat = chat_unit(&tok);
        let plain = UNITS.iter().map(|&(class, unit)| (class.to_owned(), unit.to_owned(), false));
        let special = [("prose", UNITS[10].1), ("newlines", "\n"), ("spaces", " "), ("tags", "<b>"), ("chat", chat.as_str())]
            .map(|(class, unit)| (format!("{class}, special"), unit.to_owned(), true));
        for (class, unit, parse_special) in plain.chain(special) {
            let label = format!("{name}, {class}");
            if !label.contains(only.as_str()) {
                continue;
            }
            let text = run_of(&unit, LIMIT);
            let mut times = Vec::with_capacity(reps);
            let mut n = 0;
            for _ in 0..reps {
                let t = Instant::now();
                n = tok.encode(&text, true, parse_special).unwrap().len();
                times.push(t.elapsed());
            }
            times.sort();
            let (min, median) = (times[0], times[reps / 2]);
            println!("bench {name:9} 4 MiB of {class:20} {n:8} tokens  min {:7.1} ms  median {:7.1} ms", ms(min), ms(median));
            if median > worst.0 {
                worst = (median, label);
            }
        }
    }
    println!("bench slowest median: {} ({:.1} ms), {reps} runs each", worst.1, ms(worst.0));
}

/// A turn of a chat written with the vocabulary's own BOS, end-of-turn and EOS texts (and
/// Gemma 3's `<start_of_turn>` and a user-defined HTML tag where the vocabulary has them).
fn chat_unit(tok: &Tokenizer) -> String {
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_owned();
    let start = text(tok.token_id("<start_of_turn>"));
    let bold = if tok.token_id("<b>").is_some() { "<b>Hi</b>" } else { "Hi" };
    format!("{}{start}user\n{bold} there, 12 words{}\n{}", text(tok.bos()), text(tok.eot().or(tok.eos())), text(tok.eos()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
