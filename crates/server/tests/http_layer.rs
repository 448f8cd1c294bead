//! The HTTP layer against a real server (SmolLM2-135M on the CPU home) over raw TCP, where a
//! client library would hide what is on the wire: JSON errors from the router and from hyper,
//! Content-Type and Origin checks, read timeouts, the connection cap and graceful shutdown.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use resin_core::{Counters, KvCodec};
use resin_cpu::{CpuHome, CpuOptions};
use resin_engine::{Engine, EngineConfig};
use resin_gguf::GgufFile;
use resin_model::{ChatTemplate, ModelConfig, Tokenizer};
use resin_server::{AppState, ModelInfo, ServerConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Held by tests whose timing checks a long generation running beside them would upset.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Server {
    addr: SocketAddr,
    state: AppState,
    /// Fires the shutdown future `serve_on` was given.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// What `serve_on` returned, once it has.
    done: std::sync::mpsc::Receiver<Result<(), String>>,
}

fn start(n_ctx: usize, cfg: ServerConfig) -> Server {
    let path = resin_hub::ensure("smollm2-135m", false).unwrap_or_else(|e| panic!("fetching SmolLM2-135M: {e}"));
    let file = Arc::new(GgufFile::open(&path).expect("opening the model"));
    let mcfg = ModelConfig::from_gguf(&file).expect("model config");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let template = ChatTemplate::from_gguf(&file).expect("chat template");
    let home = CpuHome::new(file.clone(), mcfg, &CpuOptions { n_ctx: Some(n_ctx), regions: 4, codec: KvCodec::F16, threads: None, progress: None }, Arc::new(Counters::default()))
        .expect("cpu home");
    let engine = Engine::start(Box::new(home), tokenizer.clone(), EngineConfig { max_queue: 64, ..EngineConfig::default() });
    let state = AppState::new(engine, ModelInfo { id: "smollm2".into(), tokenizer, template }, cfg);
    let served = common::serve_until_stopped(state.clone());
    Server { addr: served.addr, state, stop: Some(served.stop), done: served.done }
}

/// A raw response: status, head (lowercased names), body.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }
    /// OpenAI's error object with Content-Type application/json.
    fn assert_error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        let ct = self.header("content-type").unwrap_or_default();
        assert!(ct.starts_with("application/json"), "content-type {ct:?}: {self:?}");
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string() && e.get("param").is_some() && e.get("code").is_some(), "{v}");
        v
    }
}

impl Raw {
    /// Anthropic's error object (`/v1/messages`), with Content-Type application/json.
    fn assert_anthropic_error(&self, status: u16, kind: &str) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        let ct = self.header("content-type").unwrap_or_default();
        assert!(ct.starts_with("application/json"), "content-type {ct:?}: {self:?}");
        let v = self.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(2), "{v}");
        v
    }
}

fn parse(bytes: &[u8]) -> Raw {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Raw { status, head: head.to_string(), body: body.to_string() }
}

/// Send `req` as is and read until the server closes (requests say `Connection: close`).
async fn raw(addr: SocketAddr, req: &[u8]) -> Raw {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(req).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), s.read_to_end(&mut out)).await.expect("the server answers and closes");
    parse(&out)
}

fn post(path: &str, content_type: Option<&str>, extra: &str, body: &str) -> Vec<u8> {
    let ct = content_type.map(|t| format!("Content-Type: {t}\r\n")).unwrap_or_default();
    format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{ct}{extra}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n").into_bytes()
}

fn chat(max_tokens: usize, stream: bool) -> String {
    json!({"messages": [{"role": "user", "content": "Say hi."}], "temperature": 0, "max_tokens": max_tokens, "stream": stream}).to_string()
}

fn cfg() -> ServerConfig {
    ServerConfig { max_body_bytes: 64 << 10, ..ServerConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_http_error_is_a_json_error_object() {
    let s = start(256, cfg());
    let a = s.addr;
    // Control: a good request is not an error.
    let ok = raw(a, &get("/health", "")).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["status"], "ok");
    // 404 from the router's fallback.
    raw(a, &get("/v1/nothing", "")).await.assert_error(404);
    // 405: axum writes it with an empty body; the Allow header stays.
    let r = raw(a, &get("/v1/chat/completions", "")).await;
    r.assert_error(405);
    assert!(r.header("allow").is_some_and(|v| v.contains("POST")), "{r:?}");
    // 413: a body past the limit, by its Content-Length and by its chunks.
    let big = "x".repeat(80 << 10);
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "", &big)).await;
    assert_eq!(r.assert_error(413)["error"]["code"], "request_too_large");
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    raw(a, chunked.as_bytes()).await.assert_error(413);
    // 414: hyper answers a URI past 64 KiB itself.
    let long = format!("/v1/models/{}", "a".repeat(100_000));
    let r = raw(a, &get(&long, "")).await;
    assert_eq!(r.assert_error(414)["error"]["code"], "uri_too_long");
    // 431: headers past hyper's buffer.
    let huge = format!("X-Big: {}\r\n", "b".repeat(500 << 10));
    let r = raw(a, &get("/health", &huge)).await;
    r.assert_error(431);
    // 400: not HTTP at all.
    let r = raw(a, b"HELLO THERE\r\n\r\n").await;
    r.assert_error(400);
    // The server still serves.
    assert_eq!(raw(a, &get("/health", "")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_under_v1_messages_is_anthropics_error_object() {
    let s = start(256, ServerConfig { api_key: Some("k".into()), ..cfg() });
    let a = s.addr;
    let key = "x-api-key: k\r\nanthropic-version: 2023-06-01\r\n";
    let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Say hi."}]}).to_string();
    // Control: a good request is a message (the key as x-api-key, or as a bearer token).
    let r = raw(a, &post("/v1/messages", Some("application/json"), key, &body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["type"], "message");
    let r = raw(a, &post("/v1/messages/count_tokens", Some("application/json"), "Authorization: Bearer k\r\n", &body)).await;
    assert!(r.json()["input_tokens"].as_u64().is_some_and(|n| n > 0), "{r:?}");
    // 401: no key, a wrong key.
    raw(a, &post("/v1/messages", Some("application/json"), "", &body)).await.assert_anthropic_error(401, "authentication_error");
    raw(a, &post("/v1/messages", Some("application/json"), "x-api-key: no\r\n", &body)).await.assert_anthropic_error(401, "authentication_error");
    // 400: the handler's checks (max_tokens is required), bad JSON.
    let r = raw(a, &post("/v1/messages", Some("application/json"), key, r#"{"messages": [{"role": "user", "content": "x"}]}"#)).await;
    assert!(r.assert_anthropic_error(400, "invalid_request_error")["error"]["message"].as_str().unwrap().contains("max_tokens"));
    raw(a, &post("/v1/messages", Some("application/json"), key, "{nope")).await.assert_anthropic_error(400, "invalid_request_error");
    // 404 from the router's fallback; 405 with its Allow header.
    raw(a, &post("/v1/messages/nothing", Some("application/json"), key, "{}")).await.assert_anthropic_error(404, "not_found_error");
    let r = raw(a, &get("/v1/messages", key)).await;
    r.assert_anthropic_error(405, "invalid_request_error");
    assert!(r.header("allow").is_some_and(|v| v.contains("POST")), "{r:?}");
    // 413 and 415 from the guard.
    let big = "x".repeat(80 << 10);
    raw(a, &post("/v1/messages", Some("application/json"), key, &big)).await.assert_anthropic_error(413, "request_too_large");
    raw(a, &post("/v1/messages", Some("text/plain"), key, &body)).await.assert_anthropic_error(415, "invalid_request_error");
    // The OpenAI routes keep OpenAI's object.
    raw(a, &post("/v1/chat/completions", Some("text/plain"), "Authorization: Bearer k\r\n", &body)).await.assert_error(415);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_bodies_must_say_application_json() {
    let s = start(256, cfg());
    let a = s.addr;
    let body = chat(1, false);
    // Control: JSON with a charset parameter is served.
    let r = raw(a, &post("/v1/chat/completions", Some("application/json; charset=utf-8"), "", &body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["object"], "chat.completion");
    for ct in [Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("multipart/form-data; boundary=x"), None] {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let r = raw(a, &post(path, ct, "", &body)).await;
            let v = r.assert_error(415);
            let m = v["error"]["message"].as_str().unwrap_or_default();
            assert!(m.contains("-H 'Content-Type: application/json'"), "{ct:?} {path}: {m}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_are_refused_unless_allowed() {
    // By default no origin is allowed.
    let s = start(256, cfg());
    let body = chat(1, false);
    let r = raw(s.addr, &post("/v1/chat/completions", Some("application/json"), "Origin: https://evil.example\r\n", &body)).await;
    assert_eq!(r.assert_error(403)["error"]["code"], "origin_not_allowed");
    let r = raw(s.addr, &get("/v1/models", "Origin: null\r\n")).await;
    r.assert_error(403);
    // Control: without Origin (curl, SDKs) it is served.
    let r = raw(s.addr, &post("/v1/chat/completions", Some("application/json"), "", &body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.header("access-control-allow-origin").is_none(), "{r:?}");
    drop(s);

    let s = start(256, ServerConfig { cors_origins: vec!["http://localhost:3000".into()], ..cfg() });
    let a = s.addr;
    let ok_origin = "Origin: http://localhost:3000\r\n";
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), ok_origin, &body)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("http://localhost:3000"), "{r:?}");
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "Origin: http://localhost:3001\r\n", &body)).await;
    r.assert_error(403);
    // Preflight: answered for the allowed origin only.
    let pre = |origin: &str| {
        format!(
            "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, authorization\r\n\r\n"
        )
    };
    let r = raw(a, pre("http://localhost:3000").as_bytes()).await;
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("http://localhost:3000"));
    assert!(r.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")), "{r:?}");
    assert!(r.header("access-control-allow-headers").is_some_and(|m| m.contains("content-type")), "{r:?}");
    let r = raw(a, pre("https://evil.example").as_bytes()).await;
    r.assert_error(403);
    assert!(r.header("access-control-allow-origin").is_none(), "{r:?}");
    // Even an allowed origin must send JSON.
    let r = raw(a, &post("/v1/chat/completions", Some("text/plain"), ok_origin, &body)).await;
    r.assert_error(415);
}

/// Read whatever comes within `d`: Some(bytes) once the server closed, None if still open.
async fn closed_within(s: &mut TcpStream, d: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match tokio::time::timeout(d, s.read_to_end(&mut out)).await {
        Ok(_) => Some(out),
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_time_out_and_do_not_delay_others() {
    let _timed = TIMED.lock().await;
    // The read limits are long enough that a good request on a loaded 2-core machine is
    // answered well inside them, so "not delayed" is seen as an answer while the slow
    // connections are still open, not as a wall-clock bar.
    const LIMIT: Duration = Duration::from_secs(2);
    let s = start(2048, ServerConfig { header_timeout: LIMIT, body_timeout: LIMIT, ..cfg() });
    let a = s.addr;
    // A first request warms the engine, so the timed one below is a request like any other.
    assert_eq!(raw(a, &post("/v1/chat/completions", Some("application/json"), "", &chat(1, false))).await.status, 200);
    // Several connections that never finish their headers, several that never send their body.
    let mut no_headers = Vec::new();
    let mut no_body = Vec::new();
    for _ in 0..4 {
        let mut c = TcpStream::connect(a).await.unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        no_headers.push(c);
        let mut c = TcpStream::connect(a).await.unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess").await.unwrap();
        no_body.push(c);
    }
    let t0 = Instant::now();
    // Others are served meanwhile, at once.
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "", &chat(1, false))).await;
    assert_eq!(r.status, 200, "{r:?}");
    // Answered before any slow connection was let go: it did not wait for them. (That they are
    // still open is also the control that the checks below see an open connection.)
    assert!(t0.elapsed() < LIMIT, "a good request waited {:?}, past the read limits", t0.elapsed());
    for c in no_headers.iter_mut().chain(no_body.iter_mut()) {
        assert!(closed_within(c, Duration::from_millis(10)).await.is_none(), "a slow connection was let go before the good request's answer");
    }
    for c in &mut no_headers {
        let out = closed_within(c, LIMIT + Duration::from_secs(3)).await.expect("a connection without its headers is closed after the header timeout");
        // hyper closes it without an answer.
        assert!(out.is_empty() || parse(&out).status == 408, "{:?}", String::from_utf8_lossy(&out));
    }
    for c in &mut no_body {
        let out = closed_within(c, LIMIT + Duration::from_secs(3)).await.expect("a connection without its body is answered after the body timeout");
        let r = parse(&out);
        assert_eq!(r.assert_error(408)["error"]["code"], "request_timeout");
    }
    drop(s);
    // A generation that outlasts both timeouts is not cut by them (they bound reading only):
    // on a server whose limits are short beside any decode speed.
    const SHORT: Duration = Duration::from_millis(300);
    let s = start(2048, ServerConfig { header_timeout: SHORT, body_timeout: SHORT, ..cfg() });
    let t1 = Instant::now();
    let long = json!({"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 400, "ignore_eos": true, "stream": true}).to_string();
    let r = raw(s.addr, &post("/v1/chat/completions", Some("application/json"), "", &long)).await;
    assert!(t1.elapsed() > SHORT * 3, "the stream must outlast the timeouts for this check to mean anything: {:?}", t1.elapsed());
    assert_eq!(r.status, 200, "{r:?}");
    let ev = events(&dechunk(&r.body));
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{:?}", ev.last());
    assert!(ev.iter().any(|e| e.contains("\"finish_reason\":\"length\"")), "{:?}", &ev[ev.len().saturating_sub(3)..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_new_connections_get_503() {
    let s = start(256, ServerConfig { max_connections: 3, header_timeout: Duration::from_secs(20), ..cfg() });
    let a = s.addr;
    // Three idle connections take the cap.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(a).await.unwrap());
    }
    // Control: a held connection is served.
    held[0].write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), held[0].read(&mut buf)).await.expect("served").unwrap();
    assert_eq!(parse(&buf[..n]).status, 200);
    // A fourth is answered 503 with the error object and closed.
    let t0 = Instant::now();
    let r = raw(a, &get("/health", "")).await;
    assert_eq!(r.assert_error(503)["error"]["code"], "too_many_connections");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // On the Messages API, in Anthropic's shape.
    let r = raw(a, &post("/v1/messages", Some("application/json"), "", "{}")).await;
    r.assert_anthropic_error(503, "overloaded_error");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    // One closes: a new connection is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = raw(a, &get("/health", "")).await;
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no room after a connection closed: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_never_take_the_connections_health_needs() {
    let _timed = TIMED.lock().await;
    // Four connections: generations may hold three (the home has four sessions).
    let s = start(1024, ServerConfig { max_connections: 4, ..cfg() });
    let a = s.addr;
    let long = json!({"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 900, "ignore_eos": true, "stream": true}).to_string();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(a).await.unwrap();
        c.write_all(&post("/v1/chat/completions", Some("application/json"), "", &long)).await.unwrap();
        let mut first = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(60), c.read(&mut first)).await.expect("the stream starts").unwrap();
        assert!(parse(&first[..n]).status == 200, "{:?}", String::from_utf8_lossy(&first[..n]));
        streams.push(c);
    }
    assert_eq!(s.state.life.in_flight(), 3);
    // A fourth generation is refused at once (a session is free, but its connection would be
    // the last one) ...
    let t0 = Instant::now();
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "", &long)).await;
    assert_eq!(r.assert_error(503)["error"]["code"], "queue_full");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // ... so /health and /metrics still find a connection while the streams run (once the
    // refused request's own connection has closed: on a loaded machine the server may see its
    // end a moment after the client does).
    // The same holds for each request after it (the one before's connection may still be
    // closing on the server's side).
    for path in ["/health", "/metrics"] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let h = loop {
            let h = raw(a, &get(path, "")).await;
            if h.status != 503 || Instant::now() > deadline {
                break h;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(h.status, 200, "{path}: {h:?}");
    }
    assert_eq!(s.state.life.in_flight(), 3, "the streams still run");
    // A stream that ends gives its share back.
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.state.life.in_flight() > 2 {
        assert!(Instant::now() < deadline, "the closed stream still counts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "", &chat(2, false))).await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// Events of an SSE body (the `data:` payloads).
fn events(body: &str) -> Vec<String> {
    body.split("\n\n").filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string)).collect()
}

/// De-chunk a `Transfer-Encoding: chunked` body.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((len, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_generations() {
    let mut s = start(512, ServerConfig { shutdown_grace: Duration::from_secs(20), ..cfg() });
    let a = s.addr;
    let body = json!({"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 40, "ignore_eos": true, "stream": true}).to_string();
    let mut c = TcpStream::connect(a).await.unwrap();
    c.write_all(&post("/v1/chat/completions", Some("application/json"), "", &body)).await.unwrap();
    let mut first = [0u8; 256];
    let n = c.read(&mut first).await.unwrap();
    let first = first[..n].to_vec();
    // Control: before the signal /health is 200.
    assert_eq!(raw(a, &get("/health", "")).await.status, 200);
    s.stop.take().unwrap().send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let h = raw(a, &get("/health", "")).await;
    assert_eq!(h.assert_error(503)["status"], "shutting_down");
    let r = raw(a, &post("/v1/chat/completions", Some("application/json"), "", &chat(1, false))).await;
    r.assert_error(503);
    assert!(r.header("retry-after").is_some(), "{r:?}");
    // The stream in flight finishes normally.
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut rest)).await.expect("stream ends").unwrap();
    let mut all = first.clone();
    all.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&all);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("server_shutdown"), "{text}");
    let r = s.done.recv_timeout(Duration::from_secs(10)).expect("serve_on returns");
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_streams_end_with_an_error_event_and_waiters_get_503() {
    let mut s = start(1024, ServerConfig { shutdown_grace: Duration::from_millis(500), ..cfg() });
    let a = s.addr;
    let long = |stream: bool| json!({"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 900, "ignore_eos": true, "stream": stream}).to_string();
    let mut c = TcpStream::connect(a).await.unwrap();
    c.write_all(&post("/v1/chat/completions", Some("application/json"), "", &long(true))).await.unwrap();
    let mut first = [0u8; 256];
    let n = c.read(&mut first).await.unwrap();
    let first = first[..n].to_vec();
    let waiter = tokio::spawn(async move {
        raw(a, &post("/v1/completions", Some("application/json"), "", &json!({"prompt": "1, 2, 3,", "max_tokens": 900, "ignore_eos": true}).to_string())).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.state.life.in_flight(), 2, "both generations run before the signal");
    let t0 = Instant::now();
    s.stop.take().unwrap().send(()).unwrap();
    let r = waiter.await.unwrap();
    let v = r.assert_error(503);
    assert_eq!(v["error"]["type"], "server_shutdown", "{v}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await.expect("the stream ends").unwrap();
    let mut all = first.clone();
    all.extend_from_slice(&rest);
    let r = parse(&all);
    assert_eq!(r.status, 200, "{r:?}");
    let body = r.body;
    let ev = events(&dechunk(&body));
    assert!(ev.len() >= 2, "{body}");
    assert_eq!(ev[ev.len() - 1], "[DONE]", "{ev:?}");
    let err: Value = serde_json::from_str(&ev[ev.len() - 2]).expect("the error event is JSON");
    assert_eq!(err["error"]["type"], "server_shutdown", "{err}");
    // Cancelled after the grace, not at once and not after the whole generation.
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(5), "{took:?}");
    let r = s.done.recv_timeout(Duration::from_secs(10)).expect("serve_on returns");
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(s.state.life.in_flight(), 0);
    // Every session is freed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.state.engine.stats().active.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "sessions still active after shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn active(s: &Server) -> usize {
    s.state.engine.stats().active.load(std::sync::atomic::Ordering::Relaxed)
}

/// A streaming request for many tokens on a socket with a small receive buffer that is never
/// read: the server's writes soon wait. Returns once its session is generating.
async fn stalled_stream(s: &Server) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut c = sock.connect(s.addr).await.unwrap();
    let body = json!({"messages": [{"role": "user", "content": "Count."}], "temperature": 0, "max_tokens": 1800, "ignore_eos": true, "stream": true}).to_string();
    c.write_all(&post("/v1/chat/completions", Some("application/json"), "", &body)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while active(s) == 0 {
        assert!(Instant::now() < deadline, "the stream's session never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c
}

/// How long the control watches a stalled stream with no stall limit.
const STALL_WAIT: Duration = Duration::from_secs(8);
/// How long the stalled stream under a 1 s limit may take to be cancelled: the limit runs from
/// when the socket's buffers are full, which takes longer the slower the decode (a loaded
/// machine); that it was cancelled, not finished, is checked on what the client received.
const STALL_DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cancelled_after_the_stall_timeout() {
    // Its long generations would slow the timed checks of the test above on a 2-core machine.
    let _timed = TIMED.lock().await;
    // Control: with no stall limit the unread stream keeps its session for the whole wait.
    let s = start(2048, ServerConfig { stall_timeout: Duration::ZERO, ..cfg() });
    let c = stalled_stream(&s).await;
    tokio::time::sleep(STALL_WAIT).await;
    assert_eq!(active(&s), 1, "without a stall limit the unread stream's session stays");
    drop(c);
    drop(s);

    let s = start(2048, ServerConfig { stall_timeout: Duration::from_secs(1), ..cfg() });
    let c = stalled_stream(&s).await;
    let t0 = Instant::now();
    // Another client is served meanwhile.
    let r = raw(s.addr, &post("/v1/chat/completions", Some("application/json"), "", &chat(4, false))).await;
    assert_eq!(r.status, 200, "{r:?}");
    while active(&s) > 0 {
        assert!(t0.elapsed() < STALL_DEADLINE, "the stalled stream's session is still active after {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stalled connection was closed (the client sees the end after its buffered bytes),
    // before its generation's end: no finish reason, no terminator.
    let mut c = c;
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut sink)).await.expect("the stalled connection is closed").ok();
    assert!(!sink.is_empty());
    let text = String::from_utf8_lossy(&sink);
    assert!(!text.contains("[DONE]") && !text.contains("\"finish_reason\":\"length\""), "the stalled stream ran to its end instead of being cancelled");
    assert_eq!(s.state.life.in_flight(), 0);
}
