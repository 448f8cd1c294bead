//! Settings as data: only the binary reads the environment. Every library crate takes its
//! settings as fields of an options struct (`VulkanOptions`, `GpuOptions`, `EngineConfig`,
//! `HubSettings`, ...) that the binary fills from flags and environment variables, so a switch
//! cannot hide deep inside a module and a flag always wins over it.

use std::path::{Path, PathBuf};

/// The lines of `.rs` files under `dir` that read the process environment.
fn env_reads(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or("");
                    if ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("].iter().any(|pat| code.contains(pat)) {
                        found.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_library_crate_reads_the_environment() {
    let crates = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut libs = 0;
    let mut reads = Vec::new();
    for e in std::fs::read_dir(&crates).unwrap() {
        let dir = e.unwrap().path();
        if dir.file_name().is_some_and(|n| n == "resin") || !dir.join("src").is_dir() {
            continue;
        }
        libs += 1;
        // src/ only: tests, examples and build scripts may read the environment.
        reads.extend(env_reads(&dir.join("src")));
    }
    assert!(libs >= 8, "found {libs} library crates under {}", crates.display());
    assert!(reads.is_empty(), "library code reads the environment (make it a field of the crate's options, filled by the binary):\n{}", reads.join("\n"));
    // Control: the scan finds the binary's own reads (RESIN_CACHE and friends in cmd/load.rs).
    let own = env_reads(&crates.join("resin").join("src"));
    assert!(own.iter().any(|l| l.contains("load.rs")), "the scan must see the binary's reads: {own:?}");
}
