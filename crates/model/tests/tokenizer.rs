//! Tokenizer tests: llama.cpp's vocabulary test vectors (fetched on first use by
//! scripts/fetch_vocab_tests.sh into $RESIN_VOCAB_DIR, default ~/.cache/resin-dev/vocab) and the
//! two real models (fetched by resin-hub). Missing data that cannot be fetched fails the test:
//! nothing here skips.

use std::path::PathBuf;

use resin_gguf::GgufFile;
use resin_model::{StreamDecoder, Tokenizer};

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
}

fn vocab_dir() -> PathBuf {
    static FETCHED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FETCHED
        .get_or_init(|| {
            let dir = std::env::var_os("RESIN_VOCAB_DIR").map(PathBuf::from).unwrap_or_else(|| home().join(".cache/resin-dev/vocab"));
            if !dir.join("ggml-vocab-qwen2.gguf.out").exists() {
                let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_vocab_tests.sh");
                let status = std::process::Command::new("bash").arg(&script).arg(&dir).status();
                assert!(matches!(status, Ok(s) if s.success()), "fetching the vocabulary test vectors with {} failed: {status:?}", script.display());
            }
            dir
        })
        .clone()
}

fn model_path(name: &str) -> PathBuf {
    resin_hub::ensure(name, false).unwrap_or_else(|e| panic!("fetching {name}: {e}"))
}

fn open(path: &PathBuf, hint: &str) -> GgufFile {
    GgufFile::open(path).unwrap_or_else(|e| panic!("cannot open {} ({e}); {hint}", path.display()))
}

fn load_vocab(name: &str) -> (Tokenizer, Vec<(String, Vec<u32>)>) {
    let dir = vocab_dir();
    let hint = "run scripts/fetch_vocab_tests.sh (or set RESIN_VOCAB_DIR)";
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    let tok = Tokenizer::from_gguf(&open(&gguf, hint)).unwrap();
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap_or_else(|e| panic!("{name}.inp: {e}; {hint}"));
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap_or_else(|e| panic!("{name}.out: {e}; {hint}"));
    // As llama.cpp's tests/test-tokenizer-0.cpp reads them.
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(p) => {
                inputs.push(inp[pos..pos + p].to_string());
                pos += p + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().expect("token id")).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: inputs and outputs differ in number");
    (tok, inputs.into_iter().zip(outputs).collect())
}

/// Every input of the vocabulary must tokenize (add_special false, parse_special false, as
/// test-tokenizer-0) to exactly the expected ids, and decode back to the input.
fn check_vocab(name: &str) {
    let (tok, cases) = load_vocab(name);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    eprintln!("{name}: {}/{} inputs pass", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{name}: {} of {} inputs differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn vocab_llama_bpe() {
    check_vocab("llama-bpe");
}

#[test]
fn vocab_qwen2() {
    check_vocab("qwen2");
}

#[test]
fn vocab_gpt2() {
    check_vocab("gpt-2");
}

#[test]
fn vocab_llama_spm() {
    check_vocab("llama-spm");
}

/// decode(encode(x)) == x for every test input of every vocabulary (byte-level BPE is lossless;
/// SentencePiece drops nothing either with byte fallback).
#[test]
fn vocab_round_trips() {
    for name in ["llama-bpe", "qwen2", "gpt-2", "llama-spm"] {
        let (tok, cases) = load_vocab(name);
        for (text, _) in &cases {
            let ids = tok.encode(text, false, false).unwrap();
            assert_eq!(&tok.decode(&ids, false), text, "{name}: round trip of {text:?}");
            let ids = tok.encode(text, true, false).unwrap();
            assert_eq!(&tok.decode(&ids, false), text, "{name}: round trip with BOS of {text:?}");
        }
    }
}

#[test]
fn llama_bpe_specials() {
    let (tok, _) = load_vocab("llama-bpe");
    assert_eq!(tok.bos(), Some(128000));
    assert_eq!(tok.eos(), Some(128001));
    // llama3 pre-tokenizer: BOS added by default.
    assert_eq!(tok.encode("Hello", true, false).unwrap(), vec![128000, 9906]);
    let t = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
    let ids = tok.encode(t, false, true).unwrap();
    assert_eq!(ids[0], tok.token_id("<|start_header_id|>").unwrap());
    assert_eq!(*ids.last().unwrap(), tok.token_id("<|eot_id|>").unwrap());
    assert_eq!(tok.decode(&ids, true), t);
    // Without parse_special the control text is ordinary text.
    let plain = tok.encode(t, false, false).unwrap();
    assert!(!plain.contains(&tok.token_id("<|eot_id|>").unwrap()));
    assert_eq!(tok.decode(&plain, false), t);
    // Control tokens decode to nothing unless asked for.
    assert_eq!(tok.decode(&ids, false), "user\n\nHi");
    let stops = tok.stop_ids();
    for t in ["<|eot_id|>", "<|end_of_text|>"] {
        assert!(stops.contains(&tok.token_id(t).unwrap()), "{t} should stop");
    }
}

#[test]
fn llama_spm_specials() {
    let (tok, _) = load_vocab("llama-spm");
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    let ids = tok.encode("Hello world", true, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids, false), "Hello world");
    // "</s>" in the text is a control token only with parse_special.
    let ids = tok.encode("a</s>", false, true).unwrap();
    assert_eq!(*ids.last().unwrap(), 2);
    let ids = tok.encode("a</s>", false, false).unwrap();
    assert!(!ids.contains(&2));
    assert!(tok.stop_ids().contains(&2));
    // Byte fallback: a character outside the vocabulary becomes <0xNN> tokens.
    let ids = tok.encode("🦙", false, false).unwrap();
    assert!(ids.iter().any(|&i| tok.token_text(i).unwrap().starts_with("<0x")));
    assert_eq!(tok.decode(&ids, false), "🦙");
}

fn smollm2() -> Tokenizer {
    let p = model_path("smollm2-135m");
    Tokenizer::from_gguf(&open(&p, "the hub fetched it")).unwrap()
}

fn qwen05() -> Tokenizer {
    let p = model_path("qwen2.5-coder-0.5b");
    Tokenizer::from_gguf(&open(&p, "the hub fetched it")).unwrap()
}

fn gemma3() -> (Tokenizer, GgufFile) {
    let p = model_path("gemma3-270m");
    let f = open(&p, "the hub fetched it");
    (Tokenizer::from_gguf(&f).unwrap(), f)
}

/// Gemma 3: SentencePiece with no space prefix and BOS first; the turn markers are control
/// tokens, `\n` a user-defined one; `<end_of_turn>` and `<eos>` stop; the file carries no chat
/// template, so resin supplies Gemma's turn format.
#[test]
fn gemma3_prompt() {
    let (tok, f) = gemma3();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!((tok.bos(), tok.eos(), tok.add_bos()), (Some(2), Some(1), true));
    // The reference's word lookup (testdata/reference/gemma3-270m.json), BOS first.
    assert_eq!(tok.encode("The capital of France is", true, false).unwrap(), vec![2, 818, 5279, 529, 7001, 563]);
    assert_eq!(tok.encode("The capital of France is", false, false).unwrap(), vec![818, 5279, 529, 7001, 563]);
    assert_eq!(tok.decode(&[506, 5279, 529, 506, 2891, 529, 7001, 236761], false), " the capital of the country of France.");
    let (sot, eot) = (tok.token_id("<start_of_turn>").unwrap(), tok.token_id("<end_of_turn>").unwrap());
    assert_eq!((sot, eot), (105, 106));
    assert_eq!(tok.eot(), Some(eot));
    let stops = tok.stop_ids();
    assert!(stops.contains(&eot) && stops.contains(&1), "{stops:?}");
    assert!(!stops.contains(&sot));

    let tmpl = resin_model::ChatTemplate::from_gguf(&f).unwrap().expect("gemma3 files get Gemma's turn format");
    let messages = [
        serde_json::json!({"role": "system", "content": "Be brief."}),
        serde_json::json!({"role": "user", "content": "Hi there "}),
        serde_json::json!({"role": "assistant", "content": "Hello."}),
        serde_json::json!({"role": "user", "content": "Capital of France?"}),
    ];
    let text = tmpl.render(&messages, None, true).unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = tok.encode(&text, false, true).unwrap();
    assert_eq!(ids[..4], [2, sot, tok.token_id("user").unwrap(), tok.token_id("\n").unwrap()]);
    assert_eq!(ids[ids.len() - 3..], [sot, tok.token_id("model").unwrap(), tok.token_id("\n").unwrap()]);
    assert_eq!(ids.iter().filter(|&&i| i == eot).count(), 3);
    // Roles that do not alternate are refused with the template's reason.
    let e = tmpl.render(&messages[1..3].iter().rev().cloned().collect::<Vec<_>>(), None, true).unwrap_err();
    assert!(e.to_string().contains("alternate"), "{e}");
}

#[test]
fn smollm2_prompt() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.encode("The capital of France is", true, false).unwrap(), vec![504, 3575, 282, 4649, 314]);
    // add_bos_token is false in the file.
    assert_eq!(tok.encode("The capital of France is", false, false).unwrap(), vec![504, 3575, 282, 4649, 314]);
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n", false, true).unwrap();
    assert_eq!(ids[0], im_start);
    assert!(ids.contains(&im_end));
    assert!(tok.stop_ids().contains(&im_end));
    assert_eq!(tok.eot(), Some(im_end));
    assert_eq!((tok.bos(), tok.eos(), tok.add_bos()), (Some(1), Some(2), false));
    assert_eq!(tok.decode(&[7042, 30], false), " Paris.");
    // smollm splits every digit.
    let ids = tok.encode("12345", false, false).unwrap();
    assert_eq!(ids.len(), 5);
}

#[test]
fn qwen05_prompt() {
    let tok = qwen05();
    assert_eq!(tok.encode("The capital of France is", true, false).unwrap(), vec![785, 6722, 315, 9625, 374]);
    let ids = [12095, 13, 12095, 374, 7407, 304, 279, 10200, 30282, 949];
    assert_eq!(tok.decode(&ids, false), " Paris. Paris is located in the northwestern part");
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let eot = tok.token_id("<|endoftext|>").unwrap();
    let stops = tok.stop_ids();
    assert!(stops.contains(&im_end) && stops.contains(&eot), "{stops:?}");
    assert_eq!(tok.eos(), Some(im_end));
    assert_eq!(tok.eot(), Some(im_end));
    assert!(!tok.add_bos());
    // FIM separators stop too (as in llama.cpp); ordinary control tokens do not.
    assert!(stops.contains(&tok.token_id("<|file_sep|>").unwrap()));
    assert!(!stops.contains(&tok.token_id("<|im_start|>").unwrap()));
    // <tool_call> is user-defined: matched even without parse_special (as llama.cpp), and
    // decoded even without `special`; control tokens only with it.
    for parse_special in [false, true] {
        let ids = tok.encode("<tool_call>\n{\"name\": \"f\"}\n</tool_call>", false, parse_special).unwrap();
        assert_eq!(ids[0], tok.token_id("<tool_call>").unwrap());
        assert_eq!(*ids.last().unwrap(), tok.token_id("</tool_call>").unwrap());
    }
    assert_eq!(tok.token_bytes(tok.token_id("<tool_call>").unwrap(), false), b"<tool_call>");
    assert_eq!(tok.token_bytes(im_end, false), b"");
    assert_eq!(tok.token_bytes(im_end, true), b"<|im_end|>");
    let ids = tok.encode("<|im_start|>", false, false).unwrap();
    assert!(ids.len() > 1, "control text without parse_special is plain text: {ids:?}");
}

#[test]
fn real_models_round_trip() {
    let texts = [
        "The capital of France is",
        "  leading spaces, trailing  ",
        "tabs\tand\nnewlines\r\n\n",
        "unicode: héllo wörld — “quotes” 日本語のテキスト 🦙🚀👍🏽 😶‍🌫️",
        "code: fn main() { println!(\"{}\", 1 + 2); } // 12345678",
        "<|im_start|>user\nliteral control text<|im_end|>",
    ];
    for tok in [smollm2(), qwen05(), gemma3().0] {
        for t in texts {
            let ids = tok.encode(t, false, false).unwrap();
            assert_eq!(tok.decode(&ids, false), t);
            let ids = tok.encode(t, false, true).unwrap();
            assert_eq!(tok.decode(&ids, true), t);
        }
    }
}

/// Pushing ids one at a time gives the same text as decoding them all, and never a partial
/// character, even where one character is split over several byte tokens.
#[test]
fn stream_decoder_multibyte() {
    for tok in [smollm2(), qwen05(), gemma3().0] {
        for t in ["🦙 llama, 日本語のテキスト, 😶‍🌫️ and ĉ ŝ ŭ", "中文字符测试：你好，世界！", "🎉🎉🎉"] {
            let ids = tok.encode(t, false, false).unwrap();
            let mut dec = StreamDecoder::new();
            let mut out = String::new();
            for &id in &ids {
                let piece = dec.push(&tok, id);
                assert!(!piece.contains('\u{FFFD}'), "partial character leaked for {t:?}");
                out.push_str(&piece);
            }
            out.push_str(&dec.finish());
            assert_eq!(out, t);
        }
    }
    // Byte-level BPE: the llama emoji is three tokens, none of them a whole character.
    let (tok, _) = load_vocab("llama-bpe");
    let ids = tok.encode(" this is 🦙.cpp", false, false).unwrap();
    assert_eq!(ids, vec![420, 374, 11410, 99, 247, 13, 11055]);
    let mut dec = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert_eq!(pieces, vec![" this", " is", " ", "", "🦙", ".", "cpp"]);
    assert_eq!(dec.finish(), "");
    // A character that really is split over tokens: the llama-spm byte fallback.
    let (tok, _) = load_vocab("llama-spm");
    let ids = tok.encode("🦙", false, false).unwrap();
    let mut dec = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(&tok, id)).collect();
    assert!(pieces.iter().filter(|p| p.is_empty()).count() >= 3, "{pieces:?}");
    assert_eq!(pieces.concat() + &dec.finish(), " 🦙");
    // An incomplete character at the end comes out as U+FFFD from finish.
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&tok, ids[1]), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
}
