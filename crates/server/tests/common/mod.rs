//! What the server's test binaries share (each uses a part).
#![allow(dead_code)]

use std::net::SocketAddr;

use resin_server::AppState;

/// Serve `state` on a free local port from a thread of its own (until the test process ends);
/// returns the server's base URL.
pub fn spawn(state: AppState) -> String {
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding");
            tx.send(l.local_addr().expect("address")).expect("sending the address");
            resin_server::serve_on(l, state, std::future::pending()).await.expect("serving");
        });
    });
    format!("http://{}", rx.recv().expect("the server's address"))
}

/// A server from [`serve_until_stopped`]: its address, the trigger of the shutdown future
/// `serve_on` was given, and what `serve_on` returned once it has.
pub struct Served {
    pub addr: SocketAddr,
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub done: std::sync::mpsc::Receiver<Result<(), String>>,
}

/// Serve `state` on a free local port from a thread of its own until `stop` fires.
pub fn serve_until_stopped(state: AppState) -> Served {
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let r = rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding");
            tx.send(l.local_addr().expect("address")).expect("sending the address");
            resin_server::serve_on(l, state, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        let _ = done_tx.send(r.map_err(|e| e.to_string()));
    });
    Served { addr: rx.recv().expect("the server's address"), stop, done }
}
