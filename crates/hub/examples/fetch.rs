//! `cargo run --release -p resin-hub --example fetch -- [NAME...]`: fetches (or finds) registry
//! models and prints their paths; with no name, lists the registry.

fn main() {
    let names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        for e in resin_hub::list() {
            let state = if resin_hub::cached(e.name).is_some() {
                "cached"
            } else {
                "not cached"
            };
            println!("{:<20} {:<55} {state}", e.name, e.description);
        }
        return;
    }
    for n in names {
        match resin_hub::resolve(Some(&n), true) {
            Ok(p) => println!("{}", p.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
