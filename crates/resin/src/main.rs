//! resin: an LLM inference engine and OpenAI-compatible server for llama-family GGUF models.

mod cmd;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "resin", version, about = "Run, chat with, serve and benchmark llama-family GGUF models")]
struct Cli {
    /// Log filter (e.g. info, debug, resin_engine=debug); also RUST_LOG.
    #[arg(long, global = true, env = "RESIN_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Continue a prompt (raw completion, no chat template).
    Run(cmd::run::RunArgs),
    /// Talk with the model through its chat template.
    Chat(cmd::chat::ChatArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(cmd::serve::ServeArgs),
    /// Measure prompt processing and generation speed.
    Bench(cmd::bench::BenchArgs),
    /// Score a text: perplexity as llama-perplexity computes it, and the KL divergence against
    /// a saved base.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Fetch a model from the registry into the cache.
    Pull {
        /// A registry name (see `resin pull --list`).
        name: Option<String>,
        /// List the registry.
        #[arg(long)]
        list: bool,
    },
    /// Show a GGUF file's metadata and tensor formats.
    Inspect {
        file: PathBuf,
        /// List every tensor.
        #[arg(long)]
        all: bool,
    },
    /// Write a model with real shapes (or a tiny test shape) and random weights.
    Synth {
        /// llama3.2-1b, llama3.2-3b, qwen3-30b-a3b, gemma3-270m, gemma3-1b, qwen3moe-tiny or
        /// mixtral-tiny.
        #[arg(long)]
        shape: String,
        /// f32, q8_0 or q4_k_m.
        #[arg(long = "type")]
        ty: String,
        /// A GGUF whose tokenizer (vocabulary) the model takes; the tiny shapes take a built-in
        /// byte-level vocabulary without it. The gemma3 shapes need a gemma3 file's (the one
        /// `resin pull gemma3-270m` fetches will do).
        #[arg(long)]
        vocab: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Write this many layers instead of the shape's: a layer's cost (`resin bench
        /// --profile`) from a file a fraction of the size.
        #[arg(long)]
        layers: Option<usize>,
    },
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    if let Err(e) = dispatch(cli.command) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::chat(a),
        Command::Serve(a) => cmd::serve::serve(a),
        Command::Bench(a) => cmd::bench::bench(a),
        Command::Perplexity(a) => cmd::perplexity::perplexity(a),
        Command::Pull { name, list } => {
            if list || name.is_none() {
                for m in resin_hub::list() {
                    println!("{:<22} {:>6} MB  {}", m.name, m.bytes / 1_000_000, m.description);
                }
                return Ok(());
            }
            let path = cmd::load::hub().ensure(name.as_deref().unwrap_or(resin_hub::DEFAULT_MODEL), true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Inspect { file, all } => resin::inspect::inspect(&file, &mut std::io::stdout().lock(), all),
        Command::Synth { shape, ty, vocab, out, seed, layers } => {
            let shape = resin::synth::SynthShape::parse(&shape)?;
            let ty = resin::synth::SynthType::parse(&ty)?;
            let vocab = match vocab {
                Some(p) => resin::synth::SynthVocab::File(p),
                None if shape.is_tiny() => resin::synth::SynthVocab::ByteLevel,
                None if shape.is_gemma() => {
                    anyhow::bail!("--vocab is needed for the {shape} shape: a gemma3 GGUF whose 262,144-token vocabulary it takes (e.g. the file `resin pull gemma3-270m` fetches)")
                }
                None => anyhow::bail!("--vocab is needed for the {shape} shape (a vocabulary-only GGUF, e.g. ggml-vocab-llama-bpe.gguf)"),
            };
            match layers {
                None => resin::synth::synth(shape, ty, vocab, &out, seed, true),
                Some(n) => resin::synth::synth_layers(shape, ty, vocab, &out, seed, n, true),
            }
        }
    }
}
