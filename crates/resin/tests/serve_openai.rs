//! The official `openai` and `anthropic` Python clients against a real `resin serve`
//! (scripts/serve_tests.py): SmolLM2 for chat, streaming, completions, logprobs, structured
//! outputs (validated with `jsonschema`), models, errors, the API key, the Messages API and the
//! Responses API (its store bounded by `--max-stored-responses`); Qwen2.5-Coder-0.5B for the
//! tool-call round trips (OpenAI's chat, Anthropic's and the Responses API's); a synthetic Qwen3
//! that writes its own `<think>` (crates/server/tests/common/qwen3.rs, written to a temporary
//! file) for reasoning and Anthropic's signed thinking through the SDKs. Needs python3
//! with `openai`, `anthropic` and `jsonschema` (`.ci/run` installs them);
//! without them the test fails, it does not skip.

#[path = "../../server/tests/common/qwen3.rs"]
mod qwen3;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn start(model: &str, extra: &[&str]) -> (Server, String) {
    // Fetch first (with the hub's lock), so the server starts at once.
    if !model.ends_with(".gguf") {
        resin_hub::ensure(model, false).unwrap_or_else(|e| panic!("fetching {model}: {e}"));
    }
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_resin"))
        .args(["serve", "--model", model, "--port", &port.to_string(), "--parallel", "4", "--ctx", "2048", "--threads", "2"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting resin serve");
    let url = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(180), "resin serve did not start listening on {url}");
        std::thread::sleep(Duration::from_millis(200));
    }
    (Server(child), url)
}

#[test]
fn openai_client_against_resin_serve() {
    // A small store, so the test of its bound fills it quickly.
    let (_smol, url) = start("smollm2-135m", &["--api-key", "test-key", "--max-stored-responses", "8"]);
    let (_qwen, tools_url) = start("qwen2.5-coder-0.5b", &[]);
    let thinker = TempFile(std::env::temp_dir().join(format!("resin-qwen3-thinker-{}.gguf", std::process::id())));
    std::fs::write(&thinker.0, qwen3::qwen3_file(qwen3::Weights::Thinker)).expect("writing the synthetic Qwen3");
    let (_thinker, thinking_url) = start(thinker.0.to_str().expect("a UTF-8 temporary path"), &["--name", "qwen3-thinker", "--gpu", "off"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/serve_tests.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&url)
        .args(["--api-key", "test-key", "--tools-url", &tools_url, "--thinking-url", &thinking_url, "--max-stored", "8"])
        .output()
        .expect("running python3 scripts/serve_tests.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "serve_tests.py failed: {stdout}");
    assert!(stdout.contains(" 0 failed, 0 skipped") && !stdout.contains("\n0 passed"), "unexpected summary: {stdout}");
}
