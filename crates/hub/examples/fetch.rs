//! `cargo run --release -p resin-hub --example fetch -- [NAME...]`: fetches (or finds) registry
//! models and prints their paths; with no name, lists the registry. Honours `RESIN_CACHE`,
//! `RESIN_PIP` and `RESIN_VERBOSE` as the `resin` binary does.

use resin_hub::{Hub, HubSettings};

fn main() {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let hub = Hub::new(HubSettings { cache_root: var("RESIN_CACHE").map(Into::into), pip: var("RESIN_PIP"), verbose: var("RESIN_VERBOSE").is_some_and(|v| v != "0") });
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        for e in resin_hub::list() {
            let state = if hub.cached(e.name).is_some() { "cached" } else { "not cached" };
            println!("{:<20} {:<55} {state}", e.name, e.description);
        }
        return;
    }
    for n in names {
        match hub.resolve(Some(&n), true) {
            Ok(p) => println!("{}", p.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
