//! A small stand-in for `resin serve` while the binary's command is written: loads a GGUF on the
//! CPU home and serves it. `cargo run --release -p resin-server --example serve_dev -- MODEL.gguf
//! [--port 8080] [--host 127.0.0.1] [--api-key KEY] [--parallel 4] [--ctx 2048] [--name ID]`

use std::sync::Arc;

use resin_core::{Counters, KvCodec};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{ModelInfo, ServerConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let path = args.first().filter(|a| !a.starts_with("--")).cloned().ok_or_else(|| anyhow::anyhow!("usage: serve_dev MODEL.gguf [--port N] ..."))?;
    let parallel: usize = opt("--parallel").map(|v| v.parse()).transpose()?.unwrap_or(4);
    let ctx: usize = opt("--ctx").map(|v| v.parse()).transpose()?.unwrap_or(2048);
    let file = Arc::new(GgufFile::open(&path)?);
    let cfg = ModelConfig::from_gguf(&file)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file)?);
    let template = ChatTemplate::from_gguf(&file)?;
    let home =
        CpuHome::new(file.clone(), cfg, &CpuOptions { n_ctx: Some(ctx), regions: parallel, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default()))?;
    let engine = Engine::start(Box::new(home), tokenizer.clone(), EngineConfig::default());
    let id = opt("--name").unwrap_or_else(|| std::path::Path::new(&path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()));
    let cfg = ServerConfig {
        host: opt("--host").unwrap_or_else(|| "127.0.0.1".into()),
        port: opt("--port").map(|v| v.parse()).transpose()?.unwrap_or(8080),
        api_key: opt("--api-key"),
        ..ServerConfig::default()
    };
    resin_server::serve(engine, ModelInfo { id, tokenizer, template }, cfg, resin_server::shutdown_signal()).await
}
