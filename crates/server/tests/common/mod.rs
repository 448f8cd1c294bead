//! What the server's test binaries share.

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
