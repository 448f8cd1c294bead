//! `resin run`: a raw completion (no chat template), streamed or as one JSON line.

use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};
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
    /// Constrain the continuation to JSON that this JSON Schema file accepts (structured
    /// output: a token mask at every step, as the server's `response_format`).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
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
    let schema: Option<serde_json::Value> = match &args.json_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Some(serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?)
        }
        None => None,
    };
    let loaded = args.model.load(1)?;
    let constraint = match &schema {
        Some(s) => {
            let env = resin_server::grammar::GrammarEnv::from_tokenizer(&loaded.tokenizer)?;
            let c = env.json_schema(s).map_err(|e| anyhow!("the JSON schema cannot be enforced: {e}"))?;
            Some(Box::new(c) as Box<dyn resin_engine::LogitsConstraint>)
        }
        None => None,
    };
    let prompt_ids = loaded.tokenizer.encode(&args.prompt, true, true)?;
    let home_kind = loaded.home.spec().kind;
    let engine = Engine::start(loaded.home, loaded.tokenizer.clone(), EngineConfig::default());
    // The home is dropped on the engine thread before the process exits.
    let _stop = resin_engine::ShutdownOnDrop(engine.clone());
    let mut req = GenRequest::new(prompt_ids.clone(), args.max_tokens);
    req.params = args.sampling.params();
    req.constraint = constraint;
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
