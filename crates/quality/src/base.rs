//! The saved base (`--save-logits`, read by `--kl-base`): each scored position's 64 largest
//! logits and its log-sum-exp, not whole rows (a 150k vocabulary's row is 600 KB a position).
//!
//! Layout, little-endian, version 1:
//!
//! ```text
//! magic     8 bytes  "RESINKLB"
//! version   u32      1
//! vocab     u32      the model's vocabulary (logits a row)
//! ctx       u32      the window
//! chunks    u32      windows scored
//! bos       u32      the token put in each window's first slot; 0xFFFF_FFFF: none
//! k         u32      pairs a record holds (TOP_CANDIDATES = 64)
//! model     u32 length, then that many bytes of UTF-8 (at most 4096): the model that wrote it
//! tokens    u32 count (= chunks * ctx), then that many u32: the windows' tokens as the text has them
//! records   u32 count (= chunks * (ctx - 1 - ctx / 2)), then each record, in scoring order:
//!             lse f64, n u32 (pairs used, <= k), 0u32, then k pairs (id u32, logit f32),
//!             best first, the unused ones zero
//! ```
//!
//! The header is what a comparison must share (vocabulary, window, BOS and the very tokens), so
//! a base of another text, context or tokenizer is refused before any work; the model's name is
//! there to be read, not compared, since comparing two models or formats is what a base is for.

use std::io::Write;
use std::path::Path;

use resin_core::TOP_CANDIDATES;

use crate::{Plan, QualityError, Result, TopRecord};

pub const BASE_MAGIC: [u8; 8] = *b"RESINKLB";
pub const BASE_VERSION: u32 = 1;
const NO_BOS: u32 = u32::MAX;
const MODEL_NAME_MAX: usize = 4096;
/// Bytes of a record: lse, n, padding, then TOP_CANDIDATES pairs.
const fn record_bytes(k: usize) -> usize {
    16 + 8 * k
}

/// What a base and a run must share, and the model that wrote the base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseHeader {
    pub model: String,
    pub vocab: usize,
    pub ctx: usize,
    pub chunks: usize,
    pub bos: Option<u32>,
    /// The windows' tokens as the text has them (`chunks * ctx`).
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    /// The header of a run of `plan` over `tokens` (the text's, of which the windows take the
    /// first `chunks * ctx`) on a model of `vocab` logits a row.
    pub fn of_run(model: &str, vocab: usize, plan: &Plan, tokens: &[u32]) -> Result<BaseHeader> {
        let mut model = model.to_string();
        if model.len() > MODEL_NAME_MAX {
            let mut end = MODEL_NAME_MAX;
            while !model.is_char_boundary(end) {
                end -= 1;
            }
            model.truncate(end);
        }
        Ok(BaseHeader { model, vocab, ctx: plan.ctx, chunks: plan.chunks, bos: plan.bos, tokens: plan.covered(tokens)?.to_vec() })
    }

    /// Records a run of this header scores.
    pub fn records(&self) -> usize {
        // Saturating: a header built by hand with a window under 3 scores nothing, it does not
        // underflow.
        self.chunks.saturating_mul(self.ctx.saturating_sub(1 + self.ctx / 2))
    }

    /// Whether `run` measures the same thing as this base; the first difference as an error.
    pub fn check(&self, run: &BaseHeader) -> Result<()> {
        let mismatch = |m: String| Err(QualityError::BaseMismatch(m));
        if self.vocab != run.vocab {
            return mismatch(format!(
                "the base ({}) has a vocabulary of {}, this model ({}) {}: logits of different vocabularies cannot be compared",
                self.model, self.vocab, run.model, run.vocab
            ));
        }
        if self.ctx != run.ctx {
            return mismatch(format!("the base was computed with --ctx {}, this run has --ctx {}", self.ctx, run.ctx));
        }
        if self.chunks != run.chunks {
            return mismatch(format!("the base scored {} windows, this run scores {} (--chunks)", self.chunks, run.chunks));
        }
        if self.bos != run.bos {
            let show = |b: Option<u32>| b.map_or("none".to_string(), |b| b.to_string());
            return mismatch(format!("the base puts BOS {} in each window's first slot, this model {}", show(self.bos), show(run.bos)));
        }
        if let Some(i) = self.tokens.iter().zip(&run.tokens).position(|(a, b)| a != b) {
            return mismatch(format!(
                "token {i} of the text is {} in the base and {} here: another text, or another tokenizer ({} vs {})",
                self.tokens[i], run.tokens[i], self.model, run.model
            ));
        }
        if self.tokens.len() != run.tokens.len() {
            return mismatch(format!("the base covers {} tokens, this run {}", self.tokens.len(), run.tokens.len()));
        }
        Ok(())
    }
}

/// A base: its header and one record a scored position, in scoring order.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseFile {
    pub header: BaseHeader,
    pub records: Vec<TopRecord>,
}

impl BaseFile {
    /// The file's bytes; an error where the records do not fit the header.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let h = &self.header;
        if self.records.len() != h.records() || Some(h.tokens.len()) != h.chunks.checked_mul(h.ctx) {
            return Err(QualityError::BadBase(format!("{} records and {} tokens for {} windows of {}", self.records.len(), h.tokens.len(), h.chunks, h.ctx)));
        }
        let u32_of = |v: usize, what: &str| u32::try_from(v).map_err(|_| QualityError::BadBase(format!("{what} {v} does not fit the format")));
        let mut out = Vec::with_capacity(64 + h.model.len() + 4 * h.tokens.len() + self.records.len() * record_bytes(TOP_CANDIDATES));
        out.extend_from_slice(&BASE_MAGIC);
        for v in [BASE_VERSION, u32_of(h.vocab, "vocabulary")?, u32_of(h.ctx, "ctx")?, u32_of(h.chunks, "chunks")?, h.bos.unwrap_or(NO_BOS), TOP_CANDIDATES as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&u32_of(h.model.len(), "model name length")?.to_le_bytes());
        out.extend_from_slice(h.model.as_bytes());
        out.extend_from_slice(&u32_of(h.tokens.len(), "token count")?.to_le_bytes());
        for t in &h.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&u32_of(self.records.len(), "record count")?.to_le_bytes());
        for r in &self.records {
            if r.top.len() > TOP_CANDIDATES {
                return Err(QualityError::BadBase(format!("a record of {} pairs (at most {TOP_CANDIDATES})", r.top.len())));
            }
            out.extend_from_slice(&r.lse.to_le_bytes());
            out.extend_from_slice(&(r.top.len() as u32).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            for i in 0..TOP_CANDIDATES {
                let (id, logit) = r.top.get(i).copied().unwrap_or((0, 0.0));
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&logit.to_le_bytes());
            }
        }
        Ok(out)
    }

    /// Write the base to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        let io = |source| QualityError::Io { path: path.display().to_string(), source };
        let mut f = std::fs::File::create(path).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)
    }

    /// Read a base from `path`.
    pub fn read(path: &Path) -> Result<BaseFile> {
        let bytes = std::fs::read(path).map_err(|source| QualityError::Io { path: path.display().to_string(), source })?;
        BaseFile::parse(&bytes).map_err(|e| match e {
            QualityError::BadBase(m) => QualityError::BadBase(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// A base from its bytes; every count is checked against the bytes there are, so a
    /// truncated or foreign file is an error, never a panic or a huge allocation.
    pub fn parse(bytes: &[u8]) -> Result<BaseFile> {
        let mut r = Reader { bytes, at: 0 };
        let magic = r.take(8)?;
        if magic != BASE_MAGIC {
            return Err(bad("not a resin logits base (see `resin perplexity --save-logits`)"));
        }
        let version = r.u32()?;
        if version != BASE_VERSION {
            return Err(bad(&format!("format version {version}; this resin reads version {BASE_VERSION} (save the base again)")));
        }
        let vocab = r.u32()? as usize;
        let ctx = r.u32()? as usize;
        let chunks = r.u32()? as usize;
        let bos = match r.u32()? {
            NO_BOS => None,
            b => Some(b),
        };
        let k = r.u32()? as usize;
        if k != TOP_CANDIDATES {
            return Err(bad(&format!("records of {k} pairs; this resin writes and reads {TOP_CANDIDATES}")));
        }
        if ctx < 3 || chunks == 0 || vocab == 0 {
            return Err(bad(&format!("a header of ctx {ctx}, {chunks} windows, vocabulary {vocab}")));
        }
        if bos.is_some_and(|b| b as usize >= vocab) {
            return Err(bad("its BOS is outside its vocabulary"));
        }
        let name_len = r.u32()? as usize;
        if name_len > MODEL_NAME_MAX {
            return Err(bad(&format!("a model name of {name_len} bytes")));
        }
        let model = String::from_utf8(r.take(name_len)?.to_vec()).map_err(|_| bad("its model name is not UTF-8"))?;
        let n_tokens = r.u32()? as usize;
        if Some(n_tokens) != chunks.checked_mul(ctx) {
            return Err(bad(&format!("{n_tokens} tokens for {chunks} windows of {ctx}")));
        }
        let tok_bytes = r.take(n_tokens.checked_mul(4).ok_or_else(|| bad("too many tokens"))?)?;
        let tokens: Vec<u32> = tok_bytes.chunks_exact(4).map(le_u32).collect();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(bad(&format!("token {t} is outside its vocabulary of {vocab}")));
        }
        let header = BaseHeader { model, vocab, ctx, chunks, bos, tokens };
        let n_records = r.u32()? as usize;
        if n_records != header.records() {
            return Err(bad(&format!("{n_records} records; {chunks} windows of {ctx} score {}", header.records())));
        }
        let rb = record_bytes(k);
        if r.left() != n_records.checked_mul(rb).ok_or_else(|| bad("too many records"))? {
            return Err(bad(&format!("{} bytes of records, {} expected (a truncated or damaged file)", r.left(), n_records * rb)));
        }
        let mut records = Vec::with_capacity(n_records);
        for i in 0..n_records {
            let rec = r.take(rb)?;
            let lse = f64::from_le_bytes(rec[..8].try_into().map_err(|_| bad("record"))?);
            let n = le_u32(&rec[8..12]) as usize;
            if n > k || !lse.is_finite() {
                return Err(bad(&format!("record {i} is damaged ({n} pairs, lse {lse})")));
            }
            let mut top = Vec::with_capacity(n);
            for p in rec[16..16 + 8 * n].chunks_exact(8) {
                let (id, logit) = (le_u32(&p[..4]), f32::from_le_bytes([p[4], p[5], p[6], p[7]]));
                if id as usize >= vocab || !logit.is_finite() {
                    return Err(bad(&format!("record {i} holds id {id} / logit {logit}")));
                }
                top.push((id, logit));
            }
            records.push(TopRecord { lse, top });
        }
        Ok(BaseFile { header, records })
    }
}

fn bad(m: &str) -> QualityError {
    QualityError::BadBase(m.to_string())
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// A cursor over the file's bytes that errors instead of reading past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| bad("the file ends early (truncated?)"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        self.take(4).map(le_u32)
    }
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BaseFile {
        let tokens: Vec<u32> = (0..40).map(|i| (i * 7) % 50).collect();
        let plan = Plan::new(tokens.len(), 8, Some(3), Some(1)).unwrap();
        let header = BaseHeader::of_run("model-a.gguf", 50, &plan, &tokens).unwrap();
        let records = (0..header.records())
            .map(|i| {
                let row: Vec<f32> = (0..50).map(|j| ((i * 31 + j * 17) % 23) as f32 * 0.3).collect();
                TopRecord::of(&row)
            })
            .collect();
        BaseFile { header, records }
    }

    #[test]
    fn round_trip() {
        let b = sample();
        assert_eq!(b.header.tokens.len(), 24);
        assert_eq!(b.records.len(), 9);
        let bytes = b.to_bytes().unwrap();
        assert_eq!(&bytes[..8], b"RESINKLB");
        assert_eq!(BaseFile::parse(&bytes).unwrap(), b);
        let path = std::env::temp_dir().join(format!("resin-quality-base-{}", std::process::id()));
        b.write(&path).unwrap();
        assert_eq!(BaseFile::read(&path).unwrap(), b);
        std::fs::remove_file(&path).unwrap();
        let e = BaseFile::read(&path).unwrap_err().to_string();
        assert!(e.contains("resin-quality-base"), "{e}");
    }

    #[test]
    fn damaged_files_are_errors() {
        let bytes = sample().to_bytes().unwrap();
        // Every truncation, and a byte too many.
        for n in 0..bytes.len() {
            assert!(BaseFile::parse(&bytes[..n]).is_err(), "{n} bytes parsed");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(BaseFile::parse(&longer).is_err());
        let mut other = bytes.clone();
        other[0] = b'X';
        assert!(BaseFile::parse(&other).unwrap_err().to_string().contains("not a resin logits base"));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(BaseFile::parse(&v2).unwrap_err().to_string().contains("version 2"));
        // A huge token count is refused before any allocation.
        let mut huge = bytes.clone();
        let at = 8 + 6 * 4 + 4 + "model-a.gguf".len();
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(BaseFile::parse(&huge).is_err());
        // An id past the vocabulary in a record.
        let mut bad_id = bytes.clone();
        let first_pair = bytes.len() - 9 * record_bytes(TOP_CANDIDATES) + 16;
        bad_id[first_pair..first_pair + 4].copy_from_slice(&50u32.to_le_bytes());
        assert!(BaseFile::parse(&bad_id).unwrap_err().to_string().contains("id 50"));
    }

    #[test]
    fn a_base_of_another_run_is_refused() {
        let b = sample();
        let h = &b.header;
        assert!(h.check(h).is_ok());
        let mut other = h.clone();
        other.model = "model-b.gguf".into();
        assert!(h.check(&other).is_ok(), "another model of the same vocabulary is what a base compares");
        let mut t = h.clone();
        t.tokens[5] += 1;
        let e = h.check(&t).unwrap_err().to_string();
        assert!(e.contains("token 5") && e.contains("another text"), "{e}");
        let mut v = h.clone();
        v.vocab = 51;
        assert!(h.check(&v).unwrap_err().to_string().contains("vocabulary of 50"));
        let mut c = h.clone();
        c.ctx = 16;
        assert!(h.check(&c).unwrap_err().to_string().contains("--ctx 8"));
        let mut n = h.clone();
        n.chunks = 2;
        n.tokens.truncate(16);
        assert!(h.check(&n).unwrap_err().to_string().contains("--chunks"));
        let mut bos = h.clone();
        bos.bos = None;
        assert!(h.check(&bos).unwrap_err().to_string().contains("BOS"));
    }
}
