//! `resin perplexity`: a text's perplexity in windows as `llama-perplexity` computes it, and
//! against a saved base the KL divergence and the top-1 agreement (the arithmetic and the base
//! format live in resin-quality).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use resin_quality::{evaluate, BaseFile, BaseHeader, Plan};

use super::load::ModelArgs;

/// The window when `--ctx` is not given: llama-perplexity's default.
const DEFAULT_CTX: usize = 512;

#[derive(Debug, clap::Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (UTF-8). `--ctx` is the window here (default 512).
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Score at most this many windows (llama-perplexity's --chunks); default: every whole
    /// window of the text, or as many as the --kl-base has.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// A base saved by --save-logits: report the KL divergence and top-1 agreement against it.
    #[arg(long, value_name = "FILE")]
    pub kl_base: Option<PathBuf>,
    /// Save each scored position's 64 largest logits and log-sum-exp here, as a base for
    /// --kl-base.
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// text: a line per figure; json: {"ppl", "tokens", "kld_mean", "kld_p99", "top1"}.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

pub fn perplexity(args: PerplexityArgs) -> Result<()> {
    let bytes = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", args.file.display()))?;
    if text.trim().is_empty() {
        bail!("{} is empty: there is nothing to score", args.file.display());
    }
    // The base is read before the model loads, so a wrong path fails at once.
    let base = match &args.kl_base {
        Some(p) => Some(BaseFile::read(p)?),
        None => None,
    };
    let ctx = args.model.ctx.unwrap_or(DEFAULT_CTX);
    let mut model = args.model.clone();
    model.ctx = Some(ctx);
    let mut loaded = model.load(1)?;
    let tok = &loaded.tokenizer;
    if tok.add_eos() {
        // llama-perplexity refuses such a model too: an EOS after the text would be scored.
        bail!("this model's tokenizer appends EOS to a text; perplexity is measured without it");
    }
    let tokens = tok.encode(&text, true, false).context("tokenizing the text")?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let chunks = args.chunks.or(base.as_ref().map(|b| b.header.chunks));
    let plan = Plan::new(tokens.len(), ctx, chunks, bos)?;
    let name = loaded.path.file_name().map_or_else(|| loaded.path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let vocab = loaded.home.spec().vocab;
    let header = BaseHeader::of_run(&name, vocab, &plan, &tokens)?;
    if let Some(b) = &base {
        b.header.check(&header)?;
    }
    tracing::info!(tokens = tokens.len(), windows = plan.chunks, ctx, scored = plan.scored(), home = loaded.home.spec().kind, "scoring");

    let bar = indicatif::ProgressBar::with_draw_target(Some(plan.chunks as u64), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("perplexity [{bar:40}] {pos}/{len} windows {elapsed} (eta {eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let ev = evaluate(loaded.home.as_mut(), &tokens, &plan, base.as_ref(), args.save_logits.is_some(), &mut |done| bar.set_position(done as u64));
    bar.finish_and_clear();
    let ev = ev?;
    if let (Some(path), Some(records)) = (&args.save_logits, ev.records) {
        BaseFile { header, records }.write(path)?;
        tracing::info!(path = %path.display(), "logits base saved");
    }

    let r = &ev.report;
    let mut out = std::io::stdout().lock();
    if args.format == "json" {
        let line = serde_json::json!({ "ppl": r.ppl, "tokens": r.tokens, "kld_mean": r.kld_mean, "kld_p99": r.kld_p99, "top1": r.top1 });
        writeln!(out, "{line}")?;
    } else {
        writeln!(out, "PPL = {:.4} +/- {:.5} over {} tokens ({} windows of {})", r.ppl, r.ppl_err, r.tokens, plan.chunks, ctx)?;
        if let (Some(mean), Some(p99), Some(top1), Some(b)) = (r.kld_mean, r.kld_p99, r.top1, &base) {
            writeln!(out, "KL divergence against {}: mean {mean:.6}, 99th percentile {p99:.6}; same top token {:.3}%", b.header.model, 100.0 * top1)?;
        }
    }
    Ok(())
}
