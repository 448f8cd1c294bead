//! A Vulkan device that fails mid-run, against a real server on the Vulkan home (lavapipe in
//! CI) over raw TCP: the fault switch injects a lost device, an out-of-memory upload and a
//! fence that never signals while a stream, a whole request and a queued one are in flight.
//! Each must end with a 503 `device_lost` (the stream with an error event and `[DONE]`) within
//! a bounded wait, `/health` must then answer 503 saying why, new requests 503 at once, and the
//! server must stay responsive and shut down. Without a Vulkan device the tests SKIP, unless
//! RESIN_REQUIRE_VULKAN=1.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use resin_core::{Counters, KvCodec};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{AppState, ModelInfo, ServerConfig};
use resin_vulkan::{Fault, FaultSwitch, Gpu, GpuOptions, VulkanHome, VulkanOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One server at a time: lavapipe computes on the host's cores, and the bounds below are times.
static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The fence limit the servers below run with: short, so the hang test ends soon, yet above
/// what any real submission takes on a software device (the first ones compile shaders).
const FENCE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after the fault every affected request must have its answer: the fence limit
/// plus the time a step in flight takes on a software device, with room for a loaded machine.
const BOUND: Duration = Duration::from_secs(40);
/// How long the first requests may take (a software device compiles its shaders meanwhile).
const WARM: Duration = Duration::from_secs(300);

struct Server {
    addr: SocketAddr,
    state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<Result<(), String>>,
}

/// A server on a Vulkan home of two sessions whose device `switch` can fail; None (SKIP) without
/// a device.
fn start(switch: &FaultSwitch) -> Option<Server> {
    let gpu_opts = GpuOptions { fence_timeout: Some(FENCE_TIMEOUT), faults: switch.clone(), ..GpuOptions::default() };
    let gpu = match Gpu::start_with(&gpu_opts) {
        Ok(g) => g,
        Err(e) => {
            if std::env::var("RESIN_REQUIRE_VULKAN").as_deref() == Ok("1") {
                panic!("RESIN_REQUIRE_VULKAN=1 but there is no Vulkan device: {e}");
            }
            eprintln!("SKIP: no Vulkan device ({e}); apt-get install mesa-vulkan-drivers libvulkan1");
            return None;
        }
    };
    let path = resin_hub::ensure("smollm2-135m", false).unwrap_or_else(|e| panic!("fetching SmolLM2-135M: {e}"));
    let file = Arc::new(GgufFile::open(&path).expect("opening the model"));
    let mcfg = ModelConfig::from_gguf(&file).expect("model config");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let template = ChatTemplate::from_gguf(&file).expect("chat template");
    let opts = VulkanOptions { n_ctx: Some(512), regions: 2, codec: KvCodec::F16, gpu: gpu_opts, ..VulkanOptions::default() };
    let mut home = VulkanHome::on(gpu, file, mcfg, &opts, Arc::new(Counters::default())).expect("vulkan home");
    // The pipelines built now, not in the first requests' submissions (the fence limit is short).
    let tp = Instant::now();
    home.prewarm(2).expect("prewarm");
    eprintln!("prewarm took {:?}", tp.elapsed());
    let engine = Engine::start(Box::new(home), tokenizer.clone(), EngineConfig { max_queue: 8, ..EngineConfig::default() });
    let state = AppState::new(engine, ModelInfo { id: "smollm2".into(), tokenizer, template }, ServerConfig { shutdown_grace: Duration::from_secs(1), ..ServerConfig::default() });
    let served = common::serve_until_stopped(state.clone());
    Some(Server { addr: served.addr, state, stop: Some(served.stop), done: served.done })
}

#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }
    /// A 503 whose error object says the device failed.
    fn assert_device_lost(&self) -> Value {
        assert_eq!(self.status, 503, "{self:?}");
        assert!(self.head.to_ascii_lowercase().contains("content-type: application/json"), "{self:?}");
        let v = self.json();
        assert_eq!(v["error"]["code"], "device_lost", "{v}");
        assert_eq!(v["error"]["type"], "server_error", "{v}");
        v
    }
}

fn parse(bytes: &[u8]) -> Raw {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Raw { status, head: head.to_string(), body: body.to_string() }
}

/// Send `req` and read until the server closes; panics past `limit` (a hang fails, not stalls).
async fn raw_within(addr: SocketAddr, req: Vec<u8>, limit: Duration) -> Raw {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&req).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut out)).await.unwrap_or_else(|_| panic!("no answer within {limit:?}")).expect("read");
    parse(&out)
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A completion of a few prompt tokens (a software device prefills slowly).
fn complete(max_tokens: usize, stream: bool) -> String {
    json!({"prompt": "1, 2, 3,", "max_tokens": max_tokens, "ignore_eos": true, "stream": stream}).to_string()
}

fn chat(max_tokens: usize, stream: bool) -> String {
    json!({"messages": [{"role": "user", "content": "Count to a thousand."}], "temperature": 0, "max_tokens": max_tokens, "ignore_eos": true, "stream": stream}).to_string()
}

/// The `data:` payloads of a chunked SSE body.
fn events(body: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut rest = body;
    while let Some((len, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        plain.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    plain.split("\n\n").filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string)).collect()
}

fn active(s: &Server) -> usize {
    s.state.engine.stats().active.load(std::sync::atomic::Ordering::Relaxed)
}

/// The whole scenario for one fault.
async fn fault_ends_requests_with_503(fault: Fault) {
    let _one = ONE.lock().await;
    let switch = FaultSwitch::default();
    let Some(mut s) = start(&switch) else { return };
    let a = s.addr;
    // Control: requests are served and /health is 200 before the fault. Two at once, so the
    // device has run every kind of submission the scenario makes (a software device compiles
    // a shader at its first run, which would count against the short fence limit).
    let tc = Instant::now();
    let warm = tokio::spawn(raw_within(a, post("/v1/completions", &complete(3, false)), WARM));
    let r = raw_within(a, post("/v1/completions", &complete(3, false)), WARM).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(warm.await.unwrap().status, 200);
    eprintln!("control took {:?}", tc.elapsed());
    assert_eq!(raw_within(a, get("/health"), BOUND).await.status, 200);

    // A stream that is generating, a whole request beside it, one queued behind them (two
    // sessions).
    let mut stream = TcpStream::connect(a).await.unwrap();
    stream.write_all(&post("/v1/completions", &complete(400, true))).await.unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(WARM, stream.read(&mut first)).await.expect("the stream starts").unwrap();
    first.truncate(n);
    let whole = tokio::spawn(raw_within(a, post("/v1/completions", &complete(400, false)), BOUND * 3));
    let deadline = Instant::now() + WARM;
    while active(&s) < 2 {
        assert!(Instant::now() < deadline, "the second session never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = tokio::spawn(raw_within(a, post("/v1/completions", &complete(4, false)), BOUND * 3));
    let deadline = Instant::now() + BOUND;
    while s.state.engine.stats().queued.load(std::sync::atomic::Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "the third request was never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let t0 = Instant::now();
    switch.arm(fault);

    // The stream ends with the error event and its terminator.
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, stream.read_to_end(&mut rest)).await.expect("the stream ends within the bound").unwrap();
    let mut all = first;
    all.extend_from_slice(&rest);
    let r = parse(&all);
    assert_eq!(r.status, 200, "{r:?}");
    let ev = events(&r.body);
    assert!(ev.len() >= 2, "{ev:?}");
    assert_eq!(ev[ev.len() - 1], "[DONE]", "{ev:?}");
    let err: Value = serde_json::from_str(&ev[ev.len() - 2]).expect("the error event is JSON");
    assert_eq!(err["error"]["code"], "device_lost", "{err}");
    // The whole request and the queued one get 503.
    whole.await.unwrap().assert_device_lost();
    queued.await.unwrap().assert_device_lost();
    let took = t0.elapsed();
    assert!(took < BOUND, "the requests ended {took:?} after the fault");
    if fault == Fault::Hang {
        // Ended by the fence limit, not by anything sooner.
        assert!(took >= FENCE_TIMEOUT, "{took:?}");
    }
    assert!(!switch.armed(), "the fault was taken");

    // /health says the home is down, and why.
    let h = raw_within(a, get("/health"), Duration::from_secs(5)).await;
    let v = h.assert_device_lost();
    assert_eq!(v["status"], "down", "{v}");
    let reason = v["reason"].as_str().unwrap_or_default().to_ascii_lowercase();
    let says = match fault {
        Fault::DeviceLost => "device_lost",
        Fault::OutOfMemory => "memory",
        Fault::Hang => "fence timeout",
    };
    assert!(reason.contains(says), "{v}");
    // New requests get 503 at once; the server still answers everything else.
    let t1 = Instant::now();
    raw_within(a, post("/v1/chat/completions", &chat(4, true)), Duration::from_secs(5)).await.assert_device_lost();
    raw_within(a, post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}).to_string()), Duration::from_secs(5)).await.assert_device_lost();
    assert!(t1.elapsed() < Duration::from_secs(2), "{:?}", t1.elapsed());
    assert_eq!(raw_within(a, get("/v1/models"), Duration::from_secs(5)).await.status, 200);
    let m = raw_within(a, get("/metrics"), Duration::from_secs(5)).await;
    assert!(m.body.contains("resin_home_up 0"), "{}", m.body);
    assert_eq!(active(&s), 0);
    assert_eq!(s.state.engine.stats().queued.load(std::sync::atomic::Ordering::Relaxed), 0, "{v}");

    // It shuts down, and the engine lets its failed home go, without waiting on the device.
    s.stop.take().unwrap().send(()).unwrap();
    let r = s.done.recv_timeout(Duration::from_secs(15)).expect("serve_on returns");
    assert!(r.is_ok(), "{r:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    let state = s.state.clone();
    std::thread::spawn(move || {
        state.engine.shutdown();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(15)).expect("the engine stops and drops its home");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_device_ends_every_request_with_503() {
    fault_ends_requests_with_503(Fault::DeviceLost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_on_upload_ends_every_request_with_503() {
    fault_ends_requests_with_503(Fault::OutOfMemory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_never_signals_ends_every_request_with_503() {
    fault_ends_requests_with_503(Fault::Hang).await;
}
