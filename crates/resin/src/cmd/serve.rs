//! `resin serve`: the OpenAI-compatible server over the engine.

use std::time::Duration;

use anyhow::Result;
use resin_engine::{Engine, EngineConfig, PrefillQuantum};
use resin_server::{ModelInfo, ServerConfig};

use super::load::ModelArgs;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (127.0.0.1 unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sessions served at once (regions of the K/V mirror).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Require `Authorization: Bearer KEY` on every /v1 request.
    #[arg(long, env = "RESIN_API_KEY")]
    pub api_key: Option<String>,
    /// Requests that may wait for a session before new ones get 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Serve continuations of at most 8 tokens through the token command (the peel).
    #[arg(long = "no-prefill-peel", action = clap::ArgAction::SetFalse)]
    pub prefill_peel: bool,
    /// MiB of host memory for sessions whose region another session took (their K/V rows come
    /// back when the conversation continues); 0 keeps none.
    #[arg(long, default_value_t = 1024)]
    pub host_cache_mib: usize,
    /// Prompt rows prefilled a scheduler tick while other sessions decode: `auto` (what the
    /// home prefills in 25 ms, at least 128 and at most 512), `pace` (sessions that were
    /// decoding before the waiting prompts came keep at least about half their token rate;
    /// the new ones start later) or 1..=512. More start new sessions sooner and let more
    /// decode at once; fewer keep the decoding ones' token rate smoother.
    #[arg(long, default_value = "auto", value_parser = super::bench::parse_prefill_quantum)]
    pub prefill_quantum: PrefillQuantum,
    /// The model id clients see (default: the file name without .gguf).
    #[arg(long)]
    pub name: Option<String>,
    /// Seconds a client has to send a request's headers before its connection is closed (0: no limit).
    #[arg(long, default_value_t = 30, env = "RESIN_HEADER_TIMEOUT")]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body, from its headers, before a 408 (0: no limit).
    #[arg(long, default_value_t = 30, env = "RESIN_BODY_TIMEOUT")]
    pub body_timeout: u64,
    /// Open connections served at once; past it new connections get 503 and are closed.
    #[arg(long, default_value_t = 512, env = "RESIN_MAX_CONNECTIONS")]
    pub max_connections: usize,
    /// An origin (`https://app.example:8443`) whose browser requests are served, repeatable;
    /// `*` allows any. Requests with another `Origin` header get 403; requests without one
    /// (curl, SDKs) are not affected.
    #[arg(long = "cors-origin", env = "RESIN_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Seconds in-flight generations may run on after SIGTERM/SIGINT before they are ended.
    #[arg(long, default_value_t = 10.0, env = "RESIN_SHUTDOWN_GRACE")]
    pub shutdown_grace: f64,
    /// Seconds a response may wait for a client that stopped reading it (its socket's buffer
    /// full) before the connection is closed and the generation cancelled (0: no limit).
    #[arg(long, default_value_t = 60.0, env = "RESIN_STALL_TIMEOUT")]
    pub stall_timeout: f64,
    /// Responses the Responses API keeps for `previous_response_id` and `GET /v1/responses/{id}`
    /// (the oldest is dropped past it; 0 keeps none).
    #[arg(long, default_value_t = 256, env = "RESIN_MAX_STORED_RESPONSES")]
    pub max_stored_responses: usize,
}

pub fn serve(args: ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let seconds = |v: f64, flag: &str| Duration::try_from_secs_f64(v).map_err(|_| anyhow::anyhow!("{flag} must be a number of seconds, 0 or more"));
    let shutdown_grace = seconds(args.shutdown_grace, "--shutdown-grace")?;
    let stall_timeout = seconds(args.stall_timeout, "--stall-timeout")?;
    let loaded = args.model.load(args.parallel)?;
    let id = args.name.clone().unwrap_or_else(|| loaded.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()));
    let engine_cfg = EngineConfig {
        max_queue: args.max_queue,
        prefill_peel: args.prefill_peel,
        host_cache_bytes: args.host_cache_mib << 20,
        prefill_quantum_busy: args.prefill_quantum,
        ..EngineConfig::default()
    };
    let engine = Engine::start(loaded.home, loaded.tokenizer.clone(), engine_cfg);
    let cfg = ServerConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        model_name: id.clone(),
        header_timeout: Duration::from_secs(args.header_timeout),
        body_timeout: Duration::from_secs(args.body_timeout),
        max_connections: args.max_connections,
        cors_origins: args.cors_origins,
        shutdown_grace,
        stall_timeout,
        max_stored_responses: args.max_stored_responses,
        ..ServerConfig::default()
    };
    let model = ModelInfo { id, tokenizer: loaded.tokenizer, template: loaded.template };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // The first SIGTERM/SIGINT shuts down gracefully; a second one exits at once.
    let shutdown = async {
        resin_server::shutdown_signal().await;
        tokio::spawn(async {
            resin_server::shutdown_signal().await;
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        });
    };
    let served = rt.block_on(resin_server::serve(engine.clone(), model, cfg, shutdown));
    engine.shutdown();
    served
}
