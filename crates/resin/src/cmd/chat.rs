//! `resin chat`: an interactive conversation through the model's chat template.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use resin_engine::{Engine, EngineConfig, GenEvent, GenRequest};
use serde_json::json;

use super::load::ModelArgs;
use super::run::SamplingArgs;

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, short = 'n', default_value_t = 512)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

pub fn chat(args: ChatArgs) -> Result<()> {
    let loaded = args.model.load(1)?;
    let template = loaded.template.context("this model has no chat template (tokenizer.chat_template); use `resin run`")?;
    let tokenizer = loaded.tokenizer.clone();
    let engine = Engine::start(loaded.home, tokenizer.clone(), EngineConfig::default());
    // The home is dropped on the engine thread before the process exits.
    let _stop = resin_engine::ShutdownOnDrop(engine.clone());
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    eprintln!("resin chat: {} ({} context). /reset starts over, /exit or Ctrl-D leaves.", loaded.cfg.name, engine.n_ctx());
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "\n> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                messages.truncate(usize::from(args.system.is_some()));
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(json!({"role": "user", "content": line}));
        let text = template.render(&messages, None, true)?;
        let ids = tokenizer.encode(&text, false, true)?;
        let mut req = GenRequest::new(ids, args.max_tokens);
        req.params = args.sampling.params();
        let mut handle = match engine.submit(req) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: {e}");
                messages.pop();
                continue;
            }
        };
        let mut answer = String::new();
        while let Some(ev) = handle.blocking_next() {
            match ev {
                GenEvent::Delta { text, .. } => {
                    write!(out, "{text}")?;
                    out.flush()?;
                    answer.push_str(&text);
                }
                GenEvent::Done(_) => break,
                GenEvent::Error(e) => bail!("generation failed: {e}"),
            }
        }
        writeln!(out)?;
        messages.push(json!({"role": "assistant", "content": answer}));
    }
}
