//! Prometheus text for /metrics, written by hand.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use resin_engine::Engine;

/// A histogram of durations with fixed buckets (seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(), count: AtomicU64::new(0), sum_us: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if s <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", c.load(Ordering::Relaxed));
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {n}");
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// The server's own numbers.
#[derive(Debug)]
pub struct Metrics {
    /// Responses by (path, status code).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            inter_token: Histogram::new(ITL_BOUNDS),
        }
    }
}

/// Paths counted by name; anything else counts as "other" (keeps label sets bounded).
fn path_label(path: &str) -> &str {
    match path {
        "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/v1/responses" | "/health" | "/metrics" => path,
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        p if p.starts_with("/v1/responses/") => "/v1/responses/{id}",
        _ => "other",
    }
}

impl Metrics {
    pub fn request(&self, path: &str, status: u16) {
        let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *r.entry((path_label(path).to_string(), status)).or_insert(0) += 1;
    }

    pub fn tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
    }

    /// The whole /metrics text.
    pub fn render(&self, engine: &Engine) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP resin_requests_total HTTP responses by path and status code.\n# TYPE resin_requests_total counter");
        for ((path, status), n) in self.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(out, "resin_requests_total{{path=\"{path}\",status=\"{status}\"}} {n}");
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(&mut out, "resin_prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens.load(Ordering::Relaxed));
        counter(&mut out, "resin_generated_tokens_total", "Tokens generated.", self.generated_tokens.load(Ordering::Relaxed));
        self.ttft.write(&mut out, "resin_time_to_first_token_seconds", "Time from request to its first generated token.");
        self.inter_token.write(&mut out, "resin_inter_token_latency_seconds", "Time between a stream's successive tokens.");

        let stats = engine.stats();
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(&mut out, "resin_queue_depth", "Requests waiting for a session.", stats.queued.load(Ordering::Relaxed));
        gauge(&mut out, "resin_active_sessions", "Sessions generating or prefilling.", stats.active.load(Ordering::Relaxed));
        gauge(&mut out, "resin_sessions_max", "Sessions the home holds at once.", engine.regions());
        gauge(&mut out, "resin_context_length", "Positions per session.", engine.n_ctx());
        gauge(&mut out, "resin_home_up", "1 while the home serves; 0 once its device failed (the server must be restarted).", usize::from(engine.home_down().is_none()));

        for (name, v) in engine.counters().snapshot() {
            let full = format!("resin_{name}_total");
            counter(&mut out, &full, &format!("Engine counter {name}."), v);
        }
        let _ = writeln!(out, "# HELP resin_declines_total Fast-path declines by reason.\n# TYPE resin_declines_total counter");
        for (reason, n) in engine.counters().declines() {
            let _ = writeln!(out, "resin_declines_total{{reason=\"{}\"}} {n}", escape_label(&reason));
        }
        out
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
