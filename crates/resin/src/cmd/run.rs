//! `resin run`: a raw completion (no chat template), streamed or as one JSON line.

use std::io::Write;

use anyhow::{bail, Result};
use resin_engine::{Engine, EngineConfig, GenEvent, GenRequest, SamplingParams};

use super::load::ModelArgs;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to continue.
    #[arg(long, short = 'p')]
    pub prompt: String,
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// text: stream the continuation; json: one line with the ids and text.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    let loaded = args.model.load(1)?;
    let prompt_ids = loaded.tokenizer.encode(&args.prompt, true, true)?;
    let home_kind = loaded.home.spec().kind;
    let engine = Engine::start(loaded.home, loaded.tokenizer.clone(), EngineConfig::default());
    // The home is dropped on the engine thread before the process exits.
    let _stop = resin_engine::ShutdownOnDrop(engine.clone());
    let mut req = GenRequest::new(prompt_ids.clone(), args.max_tokens);
    req.params = args.sampling.params();
    let mut handle = engine.submit(req)?;
    let json = args.format == "json";
    let (mut ids, mut text) = (Vec::new(), String::new());
    let mut out = std::io::stdout().lock();
    while let Some(ev) = handle.blocking_next() {
        match ev {
            GenEvent::Delta { ids: new, text: t, .. } => {
                ids.extend(new);
                if !json {
                    write!(out, "{t}")?;
                    out.flush()?;
                }
                text.push_str(&t);
            }
            GenEvent::Done(f) => {
                tracing::info!(
                    prompt_tokens = f.prompt_tokens,
                    completion_tokens = f.completion_tokens,
                    ttft_ms = f.time_to_first_token.as_millis() as u64,
                    reason = ?f.reason,
                    "done"
                );
                break;
            }
            GenEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    if json {
        let line = serde_json::json!({ "home": home_kind, "prompt_ids": prompt_ids, "ids": ids, "text": text });
        writeln!(out, "{line}")?;
    } else {
        writeln!(out)?;
    }
    Ok(())
}
