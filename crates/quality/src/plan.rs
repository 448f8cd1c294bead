//! The windows `llama-perplexity` scores (tools/perplexity/perplexity.cpp, `perplexity()`).

use crate::{QualityError, Result};

/// How a tokenized text is cut into windows, as `llama-perplexity` cuts it:
///
/// - the text is tokenized once, with the model's BOS in front where the model adds one;
/// - it needs at least `2 * ctx` tokens;
/// - window `i` is tokens `i * ctx .. (i + 1) * ctx` (no overlap, the tail past the last whole
///   window unused), `tokens.len() / ctx` windows, or fewer with `--chunks`;
/// - each window is evaluated from an empty cache at positions `0..ctx`, its first token
///   replaced by BOS where the model adds one;
/// - the logits of positions `ctx / 2 ..= ctx - 2` are scored against the next token, so every
///   scored prediction has at least half a window of context: `ctx - 1 - ctx / 2` a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub ctx: usize,
    pub chunks: usize,
    /// The token put in each window's first slot (the model's BOS where it adds one).
    pub bos: Option<u32>,
}

impl Plan {
    /// The plan for a text of `n_tokens` tokens; `chunks` caps the windows (`--chunks`).
    pub fn new(n_tokens: usize, ctx: usize, chunks: Option<usize>, bos: Option<u32>) -> Result<Plan> {
        if ctx < 3 {
            return Err(QualityError::ContextTooSmall { ctx });
        }
        if n_tokens < 2 * ctx {
            return Err(QualityError::TextTooShort { tokens: n_tokens, ctx });
        }
        let max = n_tokens / ctx;
        let chunks = match chunks {
            Some(0) => return Err(QualityError::NoChunks),
            Some(n) => n.min(max),
            None => max,
        };
        Ok(Plan { ctx, chunks, bos })
    }

    /// The first scored position of a window.
    pub fn first(&self) -> usize {
        self.ctx / 2
    }

    /// Scored positions a window.
    pub fn scored_per_window(&self) -> usize {
        self.ctx - 1 - self.first()
    }

    /// Scored positions in all.
    pub fn scored(&self) -> usize {
        self.chunks * self.scored_per_window()
    }

    /// The tokens the windows cover (the text's first `chunks * ctx`), as the text has them
    /// (before BOS replaces each window's first).
    pub fn covered<'a>(&self, tokens: &'a [u32]) -> Result<&'a [u32]> {
        let n = self.chunks * self.ctx;
        tokens.get(..n).ok_or(QualityError::TextTooShort { tokens: tokens.len(), ctx: self.ctx })
    }

    /// Window `chunk` as the model is fed it: BOS in its first slot where the model adds one.
    pub fn window(&self, tokens: &[u32], chunk: usize) -> Result<Vec<u32>> {
        let start = chunk * self.ctx;
        let mut w = tokens.get(start..start + self.ctx).ok_or(QualityError::TextTooShort { tokens: tokens.len(), ctx: self.ctx })?.to_vec();
        if let Some(b) = self.bos {
            w[0] = b;
        }
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_as_llama_perplexity_cuts_them() {
        let tokens: Vec<u32> = (100..100 + 41).collect();
        let p = Plan::new(tokens.len(), 8, None, Some(1)).unwrap();
        // 41 / 8 = 5 whole windows; the last token unused.
        assert_eq!(p.chunks, 5);
        assert_eq!(p.first(), 4);
        // Positions 4, 5, 6 predict the tokens at 5, 6, 7.
        assert_eq!(p.scored_per_window(), 3);
        assert_eq!(p.scored(), 15);
        assert_eq!(p.window(&tokens, 0).unwrap(), vec![1, 101, 102, 103, 104, 105, 106, 107]);
        assert_eq!(p.window(&tokens, 4).unwrap(), vec![1, 133, 134, 135, 136, 137, 138, 139]);
        assert!(p.window(&tokens, 5).is_err());
        assert_eq!(p.covered(&tokens).unwrap().len(), 40);
        // Without BOS the window is the text's own tokens; an odd context scores ctx - 1 - ctx/2.
        let p = Plan::new(tokens.len(), 7, Some(2), None).unwrap();
        assert_eq!((p.chunks, p.first(), p.scored_per_window()), (2, 3, 3));
        assert_eq!(p.window(&tokens, 1).unwrap(), (107..114).collect::<Vec<u32>>());
    }

    #[test]
    fn too_short_or_too_small_is_an_error() {
        assert!(matches!(Plan::new(15, 8, None, None), Err(QualityError::TextTooShort { tokens: 15, ctx: 8 })));
        assert!(Plan::new(16, 8, None, None).is_ok());
        assert!(matches!(Plan::new(100, 2, None, None), Err(QualityError::ContextTooSmall { ctx: 2 })));
        assert!(matches!(Plan::new(100, 8, Some(0), None), Err(QualityError::NoChunks)));
        assert_eq!(Plan::new(100, 8, Some(50), None).unwrap().chunks, 12);
        let e = Plan::new(0, 512, None, None).unwrap_err().to_string();
        assert!(e.contains("0 tokens") && e.contains("1024"), "{e}");
    }
}
