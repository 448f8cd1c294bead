//! The tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata.
//!
//! Two models, both written to give exactly what llama.cpp's `llama-vocab.cpp` gives:
//! - `gpt2`: byte-level BPE with ranked merges, after the pre-tokenizer regexes named by
//!   `tokenizer.ggml.pre` (llama3, qwen2, smollm, gpt-2, default, and their aliases);
//! - `llama`: SentencePiece (scores, `▁` for spaces, a leading space, `<0xNN>` byte fallback).
//!
//! Control, user-defined and unknown tokens are matched in the text before either model runs
//! (control and unknown ones only when `parse_special` is set), longest text first.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use fancy_regex::Regex;
use resin_gguf::{GgufFile, Value};

use crate::{ModelError, Result};

// Token attributes, as llama.cpp's `llama_token_attr` bits.
const ATTR_UNKNOWN: u8 = 1 << 0;
const ATTR_UNUSED: u8 = 1 << 1;
const ATTR_NORMAL: u8 = 1 << 2;
const ATTR_CONTROL: u8 = 1 << 3;
const ATTR_USER_DEFINED: u8 = 1 << 4;
const ATTR_BYTE: u8 = 1 << 5;

/// The GGUF token type of a token (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_gguf(v: i64) -> Self {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
    fn attr(self) -> u8 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => ATTR_NORMAL,
            TokenType::Unknown => ATTR_UNKNOWN,
            TokenType::Control => ATTR_CONTROL,
            TokenType::UserDefined => ATTR_USER_DEFINED,
            TokenType::Unused => ATTR_UNUSED,
            TokenType::Byte => ATTR_BYTE,
        }
    }
}

// Pre-tokenizer regexes, copied from llama.cpp's llm_tokenizer_bpe. Each is applied in turn to
// the pieces the previous one produced; the text between matches stays a piece of its own.
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer split: a regex, or a hand-written scanner that gives exactly the matches of
/// one of the regexes above in linear time. fancy-regex runs every regex with a lookahead
/// (`(?!\S)`) wholly in its backtracking VM, which pushes a state per character of a run and
/// fails ("Max stack size exceeded for backtracking") on runs of about a million characters of
/// any class; the scanners have no such limit.
enum Split {
    Regex(Regex),
    Scan(Scan),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    Gpt2,
    Llama3,
    Qwen2,
}

fn split_for(re: &str) -> Result<Split> {
    Ok(match re {
        RE_GPT2 => Split::Scan(Scan::Gpt2),
        RE_LLAMA3 => Split::Scan(Scan::Llama3),
        RE_QWEN2 => Split::Scan(Scan::Qwen2),
        _ => Split::Regex(Regex::new(re).map_err(|e| err(format!("pre-tokenizer regex: {e}")))?),
    })
}

// Character classes of the pre-tokenizer regexes, as the regex engine defines them.
const CL_L: u8 = 1; // \p{L}
const CL_N: u8 = 2; // \p{N}
const CL_S: u8 = 4; // \s

struct Classes {
    /// Class bits of every character of the Basic Multilingual Plane.
    bmp: Vec<u8>,
    /// For the rest: single-character regexes.
    l: Option<Regex>,
    n: Option<Regex>,
    s: Option<Regex>,
}

fn classes() -> &'static Classes {
    static CLASSES: std::sync::OnceLock<Classes> = std::sync::OnceLock::new();
    CLASSES.get_or_init(|| {
        // Every BMP character once, classified by the regex engine itself (no lookaround: these
        // run in the linear-time engine), so the scanners agree with the regexes exactly.
        let all: String = (0u32..0x10000).filter_map(char::from_u32).collect();
        let mut bmp = vec![0u8; 0x10000];
        let l = Regex::new(r"\p{L}").ok();
        let n = Regex::new(r"\p{N}").ok();
        let s = Regex::new(r"\s").ok();
        for (re, bit) in [(&l, CL_L), (&n, CL_N), (&s, CL_S)] {
            if let Some(re) = re {
                for m in re.find_iter(&all).flatten() {
                    for c in all[m.start()..m.end()].chars() {
                        bmp[c as usize] |= bit;
                    }
                }
            }
        }
        Classes { bmp, l, n, s }
    })
}

impl Classes {
    fn of(&self, c: char) -> u8 {
        if let Some(&b) = self.bmp.get(c as usize) {
            return b;
        }
        let mut buf = [0u8; 4];
        let t: &str = c.encode_utf8(&mut buf);
        let hit = |re: &Option<Regex>| re.as_ref().is_some_and(|re| re.is_match(t).unwrap_or(false));
        (if hit(&self.l) { CL_L } else { 0 }) | (if hit(&self.n) { CL_N } else { 0 }) | (if hit(&self.s) { CL_S } else { 0 })
    }
}

/// The matches of the scanner's regex in `text`, as (start, end) byte offsets, in order; the
/// same as `Regex::find_iter` of that regex gives.
fn scan(kind: Scan, text: &str, out: &mut Vec<(usize, usize)>) {
    let cls = classes();
    // Characters with their byte offsets and classes; `at(k)` is the k-th one.
    let chars: Vec<(usize, char, u8)> = text.char_indices().map(|(i, c)| (i, c, cls.of(c))).collect();
    let n = chars.len();
    let off = |k: usize| if k < n { chars[k].0 } else { text.len() };
    let is = |k: usize, bit: u8| k < n && chars[k].2 & bit != 0;
    let other = |k: usize| k < n && chars[k].2 & (CL_L | CL_N | CL_S) == 0;
    let nl = |k: usize| k < n && matches!(chars[k].1, '\r' | '\n');
    let ch = |k: usize| if k < n { Some(chars[k].1) } else { None };
    let run = |mut k: usize, f: &dyn Fn(usize) -> bool| {
        while k < n && f(k) {
            k += 1;
        }
        k
    };
    let mut i = 0;
    while i < n {
        // The end (in characters) of the match at i, if one starts there.
        let end: Option<usize> = match kind {
            Scan::Gpt2 => {
                // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
                let c = chars[i].1;
                let contraction = if c == '\'' {
                    match (ch(i + 1), ch(i + 2)) {
                        (Some('s' | 't' | 'm' | 'd'), _) => Some(i + 2),
                        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => Some(i + 3),
                        _ => None,
                    }
                } else {
                    None
                };
                let sp = if c == ' ' { 1 } else { 0 };
                contraction
                    .or_else(|| if is(i + sp, CL_L) { Some(run(i + sp, &|k| is(k, CL_L))) } else { None })
                    .or_else(|| if is(i + sp, CL_N) { Some(run(i + sp, &|k| is(k, CL_N))) } else { None })
                    .or_else(|| if other(i + sp) { Some(run(i + sp, &other)) } else { None })
                    .or_else(|| ws_not_before_nonspace(i, n, &|k| is(k, CL_S)))
            }
            Scan::Llama3 | Scan::Qwen2 => {
                // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+
                // |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (qwen2: \p{N})
                let c = chars[i].1;
                let lower = |k: usize| ch(k).map(|c| c.to_ascii_lowercase());
                let contraction = if c == '\'' {
                    match (lower(i + 1), lower(i + 2)) {
                        (Some('s' | 't' | 'm' | 'd'), _) => Some(i + 2),
                        (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => Some(i + 3),
                        _ => None,
                    }
                } else {
                    None
                };
                let max_digits = if kind == Scan::Llama3 { 3 } else { 1 };
                contraction
                    .or_else(|| {
                        let lead = !nl(i) && !is(i, CL_L | CL_N);
                        if lead && is(i + 1, CL_L) {
                            Some(run(i + 1, &|k| is(k, CL_L)))
                        } else if is(i, CL_L) {
                            Some(run(i, &|k| is(k, CL_L)))
                        } else {
                            None
                        }
                    })
                    .or_else(|| if is(i, CL_N) { Some(run(i, &|k| is(k, CL_N) && k < i + max_digits)) } else { None })
                    .or_else(|| {
                        let sp = if c == ' ' { 1 } else { 0 };
                        if other(i + sp) {
                            Some(run(run(i + sp, &other), &nl))
                        } else {
                            None
                        }
                    })
                    .or_else(|| {
                        if !is(i, CL_S) {
                            return None;
                        }
                        let j = run(i, &|k| is(k, CL_S));
                        // \s*[\r\n]+: up to the last newline of the run.
                        (i..j).rev().find(|&k| nl(k)).map(|k| k + 1).or_else(|| ws_not_before_nonspace(i, n, &|k| is(k, CL_S))).or(Some(j))
                    })
            }
        };
        match end {
            Some(e) if e > i => {
                out.push((off(i), off(e)));
                i = e;
            }
            _ => i += 1,
        }
    }
}

/// `\s+(?!\S)` at character i: the whitespace run, less its last character when something
/// other than whitespace follows it; nothing when that leaves it empty.
fn ws_not_before_nonspace(i: usize, n: usize, ws: &dyn Fn(usize) -> bool) -> Option<usize> {
    if !ws(i) {
        return None;
    }
    let mut j = i;
    while j < n && ws(j) {
        j += 1;
    }
    if j == n {
        Some(j)
    } else if j - i >= 2 {
        Some(j - 1)
    } else {
        None
    }
}

/// Regexes and `ignore_merges` for a `tokenizer.ggml.pre` name (llama.cpp's table, the
/// llama-family subset).
fn pre_tokenizer(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => (vec![RE_LLAMA3], true),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" => (vec![RE_QWEN2], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => (vec![r"\p{N}", RE_GPT2], false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "roberta-bpe" | "gigachat" | "exaone4" => {
            (vec![RE_GPT2], false)
        }
        "" | "default" => (vec![r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], false),
        _ => return None,
    })
}

/// Texts of tokens that end generation (llama.cpp's end-of-generation list, llama-family part).
const EOG_TEXTS: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"];
/// Fill-in-the-middle pad / repository / file-separator tokens, which llama.cpp also stops on:
/// each named by its `tokenizer.ggml.fim_*_token_id` key, else found by one of these texts.
const FIM_STOPS: &[(&str, &[&str])] = &[
    ("tokenizer.ggml.fim_pad_token_id", &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"]),
    ("tokenizer.ggml.fim_rep_token_id", &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];
/// Texts llama.cpp takes for the end-of-turn token when the metadata names none.
const EOT_TEXTS: &[&str] = &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>"];

/// GPT-2's reversible map from bytes to printable characters.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    map
}

struct Bpe {
    /// Merge rank by the token ids of its two halves.
    /// Merge rank and the id of the merged text (if it is a token) by the token ids of the
    /// two halves.
    ranks: HashMap<(u32, u32), (u32, Option<u32>), FxBuild>,
    /// Merges whose halves are not both tokens (rare), by text.
    text_ranks: HashMap<(String, String), u32>,
    splits: Vec<Split>,
    ignore_merges: bool,
    byte_char: [char; 256],
}

enum Model {
    Bpe(Box<Bpe>),
    Spm,
}

/// A tokenizer: text to token ids and back.
pub struct Tokenizer {
    model: Model,
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    ids: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    special: Vec<u32>,
    /// Each token's bytes as decoded output (control tokens included), concatenated.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<usize>,
    /// The most bytes of text one token stands for (its decoded piece, at least 16).
    longest_piece: usize,
    /// The token for each byte value (SentencePiece `<0xNN>`, byte-level BPE character).
    byte_token: [Option<u32>; 256],
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

fn err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(msg.into())
}

fn array<'a>(f: &'a GgufFile, key: &str) -> Result<Option<&'a [Value]>> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| err(format!("{key} is not an array"))),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let model_name = f.get_str("tokenizer.ggml.model")?.ok_or_else(|| err("no tokenizer.ggml.model"))?;
        let pre = f.get_str("tokenizer.ggml.pre")?.unwrap_or("");

        let tokens = array(f, "tokenizer.ggml.tokens")?.ok_or_else(|| err("no tokenizer.ggml.tokens"))?;
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(err(format!("vocabulary of {n} tokens")));
        }
        let mut texts = Vec::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            let s = t.as_str().ok_or_else(|| err(format!("token {i} is not a string")))?;
            // llama.cpp renames empty tokens so that every text maps back to one id.
            texts.push(if s.is_empty() { format!("[EMPTY_{i}]") } else { s.to_owned() });
        }
        let scores = match array(f, "tokenizer.ggml.scores")? {
            Some(a) if a.len() >= n => a[..n].iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect(),
            Some(a) => return Err(err(format!("{} scores for {n} tokens", a.len()))),
            None => vec![0.0; n],
        };
        let mut attrs: Vec<u8> = match array(f, "tokenizer.ggml.token_type")? {
            Some(a) if a.len() >= n => a[..n].iter().map(|v| TokenType::from_gguf(v.as_i64().unwrap_or(0)).attr()).collect(),
            Some(a) => return Err(err(format!("{} token types for {n} tokens", a.len()))),
            None => vec![ATTR_NORMAL; n],
        };
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            ids.insert(t.clone(), i as u32);
        }

        // Defaults per model type, then the metadata (as llama.cpp's llama_vocab::load).
        let (model, mut bos, mut eos, mut add_bos, mut add_space_prefix) = match model_name {
            "gpt2" => {
                let (res, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| err(format!("unknown pre-tokenizer {pre:?}")))?;
                let splits = res.iter().map(|r| split_for(r)).collect::<Result<Vec<_>>>()?;
                let merges = array(f, "tokenizer.ggml.merges")?.ok_or_else(|| err("no tokenizer.ggml.merges"))?;
                let mut ranks = HashMap::with_capacity_and_hasher(merges.len(), FxBuild);
                let mut text_ranks = HashMap::new();
                for (rank, m) in merges.iter().enumerate() {
                    let m = m.as_str().ok_or_else(|| err(format!("merge {rank} is not a string")))?;
                    // As llama.cpp: split at the first space after the first byte.
                    let (a, b) = match m.bytes().skip(1).position(|c| c == b' ') {
                        Some(p) => (&m[..p + 1], &m[p + 2..]),
                        None => ("", ""),
                    };
                    match (ids.get(a), ids.get(b)) {
                        (Some(&x), Some(&y)) => {
                            let merged = ids.get(&format!("{a}{b}")).copied();
                            ranks.entry((x, y)).or_insert((rank as u32, merged));
                        }
                        _ => {
                            text_ranks.entry((a.to_owned(), b.to_owned())).or_insert(rank as u32);
                        }
                    }
                }
                let bpe = Bpe { ranks, text_ranks, splits, ignore_merges, byte_char: byte_chars() };
                // llama.cpp defaults BPE bos/eos to id 11; resin names none unless the file does.
                (Model::Bpe(Box::new(bpe)), None, None, ignore_merges, false)
            }
            "llama" => (Model::Spm, Some(1), Some(2), true, true),
            other => return Err(err(format!("unsupported tokenizer model {other:?} (resin reads gpt2 and llama)"))),
        };
        let mut add_eos = false;
        let in_range = |id: Option<u64>| id.filter(|&i| (i as usize) < n).map(|i| i as u32);
        if let Some(id) = f.get_u64("tokenizer.ggml.bos_token_id")? {
            bos = in_range(Some(id)).or(bos);
        }
        if let Some(id) = f.get_u64("tokenizer.ggml.eos_token_id")? {
            eos = in_range(Some(id)).or(eos);
        }
        let bos = bos.filter(|&i| (i as usize) < n);
        let eos = eos.filter(|&i| (i as usize) < n);
        let mut eot = in_range(f.get_u64("tokenizer.ggml.eot_token_id")?);
        let eom = in_range(f.get_u64("tokenizer.ggml.eom_token_id")?);
        if let Some(b) = f.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = f.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = b;
        }
        if let Some(b) = f.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }
        if add_bos && bos.is_none() {
            add_bos = false;
        }
        if add_eos && eos.is_none() {
            add_eos = false;
        }

        // End-of-turn and end-of-generation tokens found by their text; llama.cpp makes them
        // control tokens when the file did not.
        if eot.is_none() {
            // The first of the list that the vocabulary has (llama.cpp takes whichever its hash
            // map yields first; for a ChatML vocabulary that also has <|endoftext|>, <|im_end|>
            // is the end of a turn).
            eot = EOT_TEXTS.iter().find_map(|t| ids.get(*t).copied());
        }
        let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| ids.get(*t).copied()).collect();
        for (key, texts) in FIM_STOPS {
            match in_range(f.get_u64(key)?) {
                Some(id) => eog.push(id),
                None => eog.extend(texts.iter().find_map(|t| ids.get(*t).copied())),
            }
        }
        eog.extend(eos);
        eog.extend(eot);
        eog.extend(eom);
        eog.sort_unstable();
        eog.dedup();
        for &id in eog.iter().chain(eot.iter()) {
            attrs[id as usize] |= ATTR_CONTROL;
        }

        let mut special: Vec<u32> = (0..n as u32).filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0).collect();
        special.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()).then(a.cmp(&b)));

        let mut byte_token = [None; 256];
        match &model {
            Model::Bpe(bpe) => {
                for (slot, c) in byte_token.iter_mut().zip(bpe.byte_char) {
                    *slot = ids.get(c.to_string().as_str()).copied();
                }
            }
            Model::Spm => {
                for (b, slot) in byte_token.iter_mut().enumerate() {
                    *slot = ids.get(format!("<0x{b:02X}>").as_str()).or_else(|| if b < 128 { ids.get((b as u8 as char).to_string().as_str()) } else { None }).copied();
                }
            }
        }

        let mut tok = Tokenizer {
            model,
            texts,
            scores,
            attrs,
            ids,
            special,
            piece_bytes: Vec::new(),
            piece_offsets: Vec::new(),
            longest_piece: 16,
            byte_token,
            bos,
            eos,
            eot,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
        };
        tok.build_pieces();
        Ok(tok)
    }

    /// Decoded bytes of every token (as llama.cpp's token_to_piece with `special`).
    fn build_pieces(&mut self) {
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(self.texts.len() + 1);
        let mut char_byte: HashMap<char, u8> = HashMap::new();
        if let Model::Bpe(bpe) = &self.model {
            for (b, &c) in bpe.byte_char.iter().enumerate() {
                char_byte.insert(c, b as u8);
            }
        }
        for (i, text) in self.texts.iter().enumerate() {
            offsets.push(bytes.len());
            let attr = self.attrs[i];
            if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED) != 0 {
                bytes.extend_from_slice(text.as_bytes());
            } else if attr & ATTR_NORMAL != 0 {
                match &self.model {
                    Model::Spm => bytes.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
                    Model::Bpe(_) => {
                        for c in text.chars() {
                            match char_byte.get(&c) {
                                Some(&b) => bytes.push(b),
                                // Not a byte-level character: keep it as it is.
                                None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                            }
                        }
                    }
                }
            } else if attr & ATTR_BYTE != 0 {
                match parse_byte_token(text) {
                    Some(b) => bytes.push(b),
                    None => bytes.extend_from_slice(text.as_bytes()),
                }
            }
        }
        offsets.push(bytes.len());
        self.longest_piece = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0).max(16);
        self.piece_bytes = bytes;
        self.piece_offsets = offsets;
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }
    /// Tokens a text of `bytes` bytes takes at least (no token stands for more bytes than the
    /// longest decoded piece): a prompt's length can be refused before it is tokenized.
    pub fn min_tokens(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.longest_piece)
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// The end-of-turn token (`tokenizer.ggml.eot_token_id`, else found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Ids that end generation: eos, eot, eom and the end-of-turn control tokens in the vocab.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.eog.clone()
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token's text as stored in the vocabulary (byte-level / `▁` form, not decoded).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        let a = *self.attrs.get(id as usize)?;
        Some(if a & ATTR_CONTROL != 0 {
            TokenType::Control
        } else if a & ATTR_UNKNOWN != 0 {
            TokenType::Unknown
        } else if a & ATTR_USER_DEFINED != 0 {
            TokenType::UserDefined
        } else if a & ATTR_BYTE != 0 {
            TokenType::Byte
        } else if a & ATTR_UNUSED != 0 {
            TokenType::Unused
        } else if a & ATTR_NORMAL != 0 {
            TokenType::Normal
        } else {
            TokenType::Undefined
        })
    }

    /// Whether the token is a control or unknown token (its text is shown only on request).
    pub fn is_special(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0)
    }

    /// Raw bytes of one token's text (byte-level decoded; control tokens give their text only if
    /// `special`). Unknown ids give nothing.
    pub fn token_bytes(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece(id, special).to_vec()
    }

    fn piece(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.texts.len() || (!special && self.attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0) {
            return &[];
        }
        &self.piece_bytes[self.piece_offsets[i]..self.piece_offsets[i + 1]]
    }

    /// The text of `ids`, invalid UTF-8 replaced. For SentencePiece vocabularies the space that
    /// encoding put before the text is removed again.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut out = Vec::new();
        let mut strip_space = self.add_space_prefix && matches!(self.model, Model::Spm);
        for &id in ids {
            let p = self.piece(id, special);
            if strip_space && Some(id) == self.bos {
                if special {
                    out.extend_from_slice(p);
                }
                continue;
            }
            if p.is_empty() {
                continue;
            }
            let p = if strip_space && p[0] == b' ' { &p[1..] } else { p };
            strip_space = false;
            out.extend_from_slice(p);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Token ids of `text`. `add_special`: prepend BOS / append EOS as the model's metadata says;
    /// `parse_special`: control tokens written in the text become those tokens (user-defined
    /// tokens always do, as in llama.cpp).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, parse_special, false)
    }

    /// [`Tokenizer::encode`] with every BPE word merged through the plain binary heap, the
    /// reference the faster queue of long words is tested against.
    #[doc(hidden)]
    pub fn encode_reference(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, parse_special, true)
    }

    fn encode_with(&self, text: &str, add_special: bool, parse_special: bool, reference: bool) -> Result<Vec<u32>> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Spm => {
                let mut prev_special = true;
                for frag in frags {
                    match frag {
                        Frag::Text(s, e) => {
                            let mut t = String::with_capacity(e - s + 3);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..e]);
                            self.spm_tokenize(&t.replace(' ', "\u{2581}"), &mut out)?;
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for frag in frags {
                    match frag {
                        Frag::Text(s, e) => self.bpe_tokenize(bpe, &text[s..e], reference, &mut out)?,
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Splits `text` at the special tokens it contains (llama.cpp's tokenizer_st_partition).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Frag::Text(0, text.len()));
        for &id in &self.special {
            if !parse_special && self.attrs[id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let pat = self.texts[id as usize].as_str();
            if !text.contains(pat) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Frag::Text(mut s, e) => {
                        while let Some(p) = text[s..e].find(pat) {
                            if p > 0 {
                                next.push(Frag::Text(s, s + p));
                            }
                            next.push(Frag::Token(id));
                            s += p + pat.len();
                        }
                        if s < e {
                            next.push(Frag::Text(s, e));
                        }
                    }
                    t => next.push(t),
                }
            }
            frags = next;
        }
        frags
    }

    fn byte_fallback(&self, bytes: &[u8], out: &mut Vec<u32>) -> Result<()> {
        for &b in bytes {
            let id = self.byte_token[b as usize].ok_or_else(|| err(format!("no token for byte 0x{b:02X}")))?;
            out.push(id);
        }
        Ok(())
    }

    /// SentencePiece: merge the adjacent pair of highest score while one forms a token
    /// (llama.cpp's llm_tokenizer_spm_session); leftovers become byte tokens.
    fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (i, (start, c)) in text.char_indices().enumerate() {
            let n = c.len_utf8();
            syms.push(Sym { start, n, prev: i as isize - 1, next: if start + n == text.len() { -1 } else { i as isize + 1 }, id: None });
        }
        let mut heap = BinaryHeap::new();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<SpmPair>, l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            let t = &text[ls.start..ls.start + ls.n + rs.n];
            if let Some(&id) = self.ids.get(t) {
                heap.push(SpmPair { score: self.scores[id as usize], left: l as usize, right: r as usize, size: t.len() });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as isize - 1, i as isize);
        }
        while let Some(p) = heap.pop() {
            let (ln, rn) = (syms[p.left].n, syms[p.right].n);
            if ln == 0 || rn == 0 || ln + rn != p.size {
                continue;
            }
            syms[p.left].n += rn;
            syms[p.right].n = 0;
            let rnext = syms[p.right].next;
            syms[p.left].next = rnext;
            if rnext >= 0 {
                syms[rnext as usize].prev = p.left as isize;
            }
            let lprev = syms[p.left].prev;
            try_add(&syms, &mut heap, lprev, p.left as isize);
            try_add(&syms, &mut heap, p.left as isize, rnext);
        }
        let mut i = if syms.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = &syms[i as usize];
            let t = &text[s.start..s.start + s.n];
            match self.ids.get(t) {
                Some(&id) => out.push(id),
                None => self.byte_fallback(t.as_bytes(), out)?,
            }
            i = s.next;
        }
        Ok(())
    }

    /// Byte-level BPE over each pre-tokenizer piece (llama.cpp's llm_tokenizer_bpe_session).
    fn bpe_tokenize(&self, bpe: &Bpe, text: &str, reference: bool, out: &mut Vec<u32>) -> Result<()> {
        let mut pieces = vec![(0usize, text.len())];
        let mut matches = Vec::new();
        for split in &bpe.splits {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for (s, e) in pieces {
                let sub = &text[s..e];
                matches.clear();
                match split {
                    Split::Regex(re) => {
                        for m in re.find_iter(sub) {
                            let m = m.map_err(|e| err(format!("pre-tokenizer regex: {e}")))?;
                            matches.push((m.start(), m.end()));
                        }
                    }
                    Split::Scan(kind) => scan(*kind, sub, &mut matches),
                }
                let mut last = 0;
                for &(ms, me) in &matches {
                    if ms > last {
                        next.push((s + last, s + ms));
                    }
                    if me > ms {
                        next.push((s + ms, s + me));
                    }
                    last = me;
                }
                if last < sub.len() {
                    next.push((s + last, e));
                }
            }
            pieces = next;
        }
        let mut word = String::new();
        let mut syms: Vec<Sym> = Vec::new();
        let mut heap = HeapQueue::default();
        let mut buckets = RankQueue::default();
        for (s, e) in pieces {
            word.clear();
            word.extend(text[s..e].bytes().map(|b| bpe.byte_char[b as usize]));
            if bpe.ignore_merges {
                if let Some(&id) = self.ids.get(word.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            syms.clear();
            let count = e - s;
            if count > u32::MAX as usize {
                // Merge candidates name their symbols by 32-bit indices.
                return Err(err(format!("a pre-tokenizer piece of {count} bytes")));
            }
            for (i, (start, c)) in word.char_indices().enumerate() {
                let n = c.len_utf8();
                // Each character of `word` is the byte-level character of one byte of the text.
                let id = self.byte_token[text.as_bytes()[s + i] as usize];
                syms.push(Sym { start, n, prev: i as isize - 1, next: if i + 1 == count { -1 } else { i as isize + 1 }, id });
            }
            if count >= LONG_WORD && !reference {
                bpe_merge(bpe, &self.ids, &word, &mut syms, &mut buckets);
            } else {
                bpe_merge(bpe, &self.ids, &word, &mut syms, &mut heap);
            }
            let mut i: isize = if syms.is_empty() { -1 } else { 0 };
            while i >= 0 {
                let s = &syms[i as usize];
                match s.id {
                    Some(id) => out.push(id),
                    None => {
                        // No token for the merged text: one token per byte.
                        for c in word[s.start..s.start + s.n].chars() {
                            match self.ids.get(c.encode_utf8(&mut [0; 4]) as &str) {
                                Some(&id) => out.push(id),
                                None => return Err(err(format!("no token for byte-level character {c:?}"))),
                            }
                        }
                    }
                }
                i = s.next;
            }
        }
        Ok(())
    }
}

/// Pieces of at least this many bytes merge through a [`RankQueue`], shorter ones through a
/// binary heap (cheaper to set up, and as fast while it fits in cache).
const LONG_WORD: usize = 1024;

/// The merges of one word: while an adjacent pair of symbols is in the merge table, merge the
/// one of lowest rank, the leftmost of equal ranks (llama.cpp's llm_tokenizer_bpe_session).
///
/// Every pair that forms is queued once, by (rank, index of its left symbol); an entry is acted
/// on only if that pair is still there when it comes out. Why the check below is enough: a
/// symbol's id is a function of its text (the id of that text, if any), so the rank of the pair
/// at `pl` is a function of the two texts, and no two merges share a rank. So an entry (r, pl)
/// whose `pl` is alive, with the pair at `pl` now of rank r, names a pair that exists, and with
/// the key it was queued by. Every existing pair has its own entry still queued (pushed when it
/// formed; it leaves the queue only by being merged). So the first valid entry out is the pair
/// of least (rank, left) among those that exist: the merge the definition asks for, whatever
/// queue gives the order.
fn bpe_merge(bpe: &Bpe, ids: &HashMap<String, u32>, word: &str, syms: &mut [Sym], q: &mut impl MergeQueue) {
    q.clear();
    let rank = |syms: &[Sym], l: usize, r: isize| -> Option<(u32, Option<Option<u32>>)> {
        if r < 0 {
            return None;
        }
        let (ls, rs) = (&syms[l], &syms[r as usize]);
        match (ls.id, rs.id) {
            (Some(a), Some(b)) => bpe.ranks.get(&(a, b)).map(|&(r, m)| (r, Some(m))),
            _ if bpe.text_ranks.is_empty() => None,
            _ => {
                let a = &word[ls.start..ls.start + ls.n];
                let b = &word[rs.start..rs.start + rs.n];
                bpe.text_ranks.get(&(a.to_owned(), b.to_owned())).map(|&r| (r, None))
            }
        }
    };
    for l in 1..syms.len() {
        if let Some((r, _)) = rank(syms, l - 1, l as isize) {
            q.push(r, l as u32 - 1);
        }
    }
    while let Some((r, pl)) = q.pop() {
        let pl = pl as usize;
        let pr = syms[pl].next;
        if syms[pl].n == 0 {
            continue; // merged into its left neighbour
        }
        let merged = match rank(syms, pl, pr) {
            Some((now, merged)) if now == r => merged,
            _ => continue, // one side has changed since this pair was queued
        };
        let pr = pr as usize;
        let rn = syms[pr].n;
        let rnext = syms[pr].next;
        let left = &mut syms[pl];
        left.n += rn;
        left.next = rnext;
        left.id = match merged {
            Some(id) => id,
            None => ids.get(&word[left.start..left.start + left.n]).copied(),
        };
        let lprev = left.prev;
        syms[pr].n = 0;
        if rnext >= 0 {
            syms[rnext as usize].prev = pl as isize;
        }
        if lprev >= 0 {
            if let Some((r, _)) = rank(syms, lprev as usize, pl as isize) {
                q.push(r, lprev as u32);
            }
        }
        if let Some((r, _)) = rank(syms, pl, rnext) {
            q.push(r, pl as u32);
        }
    }
}

/// A priority queue of merge candidates (rank, left symbol): lowest rank first, then leftmost.
trait MergeQueue {
    fn clear(&mut self);
    fn push(&mut self, rank: u32, left: u32);
    fn pop(&mut self) -> Option<(u32, u32)>;
}

/// A binary heap of `rank << 32 | left`.
#[derive(Default)]
struct HeapQueue(BinaryHeap<Reverse<u64>>);

impl MergeQueue for HeapQueue {
    fn clear(&mut self) {
        self.0.clear();
    }
    fn push(&mut self, rank: u32, left: u32) {
        self.0.push(Reverse((rank as u64) << 32 | left as u64));
    }
    fn pop(&mut self) -> Option<(u32, u32)> {
        self.0.pop().map(|Reverse(k)| ((k >> 32) as u32, k as u32))
    }
}

/// Merge candidates bucketed by rank: a small heap of the ranks present, and per rank the left
/// indices in ascending order. A long word is mostly a few merges applied across the whole of
/// it, and each such sweep queues the next rank's pairs from left to right, so nearly every push
/// is an append and every pop the front of a list, where one heap of all candidates paid a
/// sift through a structure far larger than the cache for each. Out-of-order pushes (the pair
/// left of a merge, or any order a merge table may cause) go to the bucket's own heap, so the
/// order is exact for any input.
#[derive(Default)]
struct RankQueue {
    /// Ranks whose bucket is not empty, each once.
    ranks: BinaryHeap<Reverse<u32>>,
    /// Bucket of each rank in `ranks`.
    slot: HashMap<u32, u32, FxBuild>,
    buckets: Vec<Bucket>,
    /// Buckets not in use (kept for their allocations).
    free: Vec<u32>,
}

#[derive(Default)]
struct Bucket {
    /// Ascending; the entries before `head` are popped.
    sorted: Vec<u32>,
    head: usize,
    /// Those pushed below the end of `sorted`.
    spill: BinaryHeap<Reverse<u32>>,
}

impl Bucket {
    fn push(&mut self, left: u32) {
        if self.sorted.last().is_none_or(|&last| left >= last) {
            self.sorted.push(left);
        } else {
            self.spill.push(Reverse(left));
        }
    }
    fn pop(&mut self) -> Option<u32> {
        let front = self.sorted.get(self.head).copied();
        let left = match (front, self.spill.peek()) {
            (Some(f), Some(&Reverse(s))) if s < f => self.spill.pop().map(|Reverse(s)| s),
            (Some(f), _) => {
                self.head += 1;
                Some(f)
            }
            (None, _) => self.spill.pop().map(|Reverse(s)| s),
        };
        if self.head == self.sorted.len() {
            self.sorted.clear();
            self.head = 0;
        }
        left
    }
    fn is_empty(&self) -> bool {
        self.head == self.sorted.len() && self.spill.is_empty()
    }
}

impl MergeQueue for RankQueue {
    fn clear(&mut self) {
        self.ranks.clear();
        for (_, b) in self.slot.drain() {
            let bucket = &mut self.buckets[b as usize];
            bucket.sorted.clear();
            bucket.head = 0;
            bucket.spill.clear();
            self.free.push(b);
        }
    }
    fn push(&mut self, rank: u32, left: u32) {
        let b = match self.slot.get(&rank) {
            Some(&b) => b,
            None => {
                let b = self.free.pop().unwrap_or_else(|| {
                    self.buckets.push(Bucket::default());
                    self.buckets.len() as u32 - 1
                });
                self.slot.insert(rank, b);
                self.ranks.push(Reverse(rank));
                b
            }
        };
        self.buckets[b as usize].push(left);
    }
    fn pop(&mut self) -> Option<(u32, u32)> {
        let &Reverse(rank) = self.ranks.peek()?;
        let b = self.slot[&rank];
        let bucket = &mut self.buckets[b as usize];
        let left = bucket.pop().expect("a queued rank has a non-empty bucket");
        if bucket.is_empty() {
            self.ranks.pop();
            self.slot.remove(&rank);
            self.free.push(b);
        }
        Some((rank, left))
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "model",
                &match self.model {
                    Model::Bpe(_) => "bpe",
                    Model::Spm => "spm",
                },
            )
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish()
    }
}

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[derive(Debug, Clone, Copy)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

#[derive(Debug, Clone, Copy)]
struct Sym {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
    id: Option<u32>,
}

/// A SentencePiece merge candidate: highest score first, then leftmost.
struct SpmPair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}
impl PartialEq for SpmPair {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for SpmPair {}
impl PartialOrd for SpmPair {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for SpmPair {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
    }
}

/// FxHash (as rustc's): fast hashing of the merge table's integer keys. The table is fixed by
/// the model file, so no input can lengthen its chains.
#[derive(Default, Clone, Copy)]
struct FxBuild;
struct FxHasher(u64);
impl std::hash::BuildHasher for FxBuild {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}
impl std::hash::Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Incremental detokenizer for streaming: push ids, get back only complete UTF-8 text.
/// Control tokens are shown only when `special` (see [`StreamDecoder::with_special`]).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }
    /// A decoder that also shows the text of control tokens.
    pub fn with_special(special: bool) -> Self {
        StreamDecoder { pending: Vec::new(), special }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.piece(id, self.special));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap());
                    match e.error_len() {
                        // Invalid bytes: they will never become a character.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left (an incomplete character comes out as U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucketed queue pops what a binary heap pops, for pushes in any order (ascending
    /// runs, out-of-order ones, ranks emptied and refilled) and across `clear`.
    #[test]
    fn rank_queue_matches_heap() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m) as u32
        };
        let (mut fast, mut heap) = (RankQueue::default(), HeapQueue::default());
        for round in 0..300 {
            fast.clear();
            heap.clear();
            let ranks = 1 + rnd(8) as u64;
            let mut next = 0u32;
            for _ in 0..rnd(3000) {
                if rnd(3) == 0 {
                    assert_eq!(fast.pop(), heap.pop(), "round {round}");
                } else {
                    // Mostly ascending positions, at times anywhere.
                    let left = if rnd(4) == 0 { rnd(5000) } else { next };
                    next += rnd(3);
                    let rank = rnd(ranks) * 7;
                    fast.push(rank, left);
                    heap.push(rank, left);
                }
            }
            // Drain only some rounds, so that `clear` meets non-empty queues too.
            if round % 2 == 0 {
                loop {
                    let (a, b) = (fast.pop(), heap.pop());
                    assert_eq!(a, b, "round {round}");
                    if a.is_none() {
                        break;
                    }
                }
            }
        }
    }

    /// The scanners give exactly the regexes' matches on random and adversarial short texts
    /// (short enough for fancy-regex's backtracking VM).
    #[test]
    fn scanners_match_regexes() {
        let alphabet: Vec<char> = " \t\n\r\u{a0}\u{3000}\u{85}\u{b}aBzé日ß1٣Ⅻ½!'_.-\"sStTrReEvVlLmMdD\u{301}😀𝐀𝟎\u{1F100}".chars().collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        let mut texts: Vec<String> = vec![
            String::new(),
            " ".into(),
            "  ".into(),
            " a".into(),
            "  a".into(),
            "\n a".into(),
            " \n\n  x".into(),
            "'s'S'll'LL're've'm'd'x".into(),
            "123456 7\u{a0}\u{a0}8".into(),
            "a  \t\n\r\n \tb!!\n\n  ?? \r".into(),
        ];
        for _ in 0..40_000 {
            let len = rnd(24);
            // Draw from a small random sub-alphabet at times, for long runs of one class.
            let sub: Vec<char> = (0..1 + rnd(4)).map(|_| alphabet[rnd(alphabet.len())]).collect();
            let pool = if rnd(2) == 0 { &sub } else { &alphabet };
            texts.push((0..len).map(|_| pool[rnd(pool.len())]).collect());
        }
        for (kind, re) in [(Scan::Gpt2, RE_GPT2), (Scan::Llama3, RE_LLAMA3), (Scan::Qwen2, RE_QWEN2)] {
            let re = Regex::new(re).unwrap();
            let mut got = Vec::new();
            for t in &texts {
                let want: Vec<(usize, usize)> = re.find_iter(t).map(|m| m.map(|m| (m.start(), m.end())).unwrap()).collect();
                got.clear();
                scan(kind, t, &mut got);
                assert_eq!(got, want, "{kind:?} on {t:?}");
            }
        }
    }
}
