//! Files and directories in the temporary directory that a test makes and that go
//! away when their guard is dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

static SERIAL: AtomicU32 = AtomicU32::new(0);

/// `<tmp>/roce-<pid>-<serial>-<name>`: unique among this process's and other test
/// processes' paths.
pub fn unique_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "roce-{}-{}-{name}",
        std::process::id(),
        SERIAL.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A file with the given contents, removed on drop.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Writes `contents` to a new unique path ending in `name`; panics when it cannot
    /// (a test step).
    pub fn new(name: &str, contents: &str) -> TempFile {
        let path = unique_path(name);
        if let Err(e) = std::fs::write(&path, contents) {
            panic!("writing {}: {e}", path.display());
        }
        TempFile(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The path as text, for command lines.
    pub fn arg(&self) -> &str {
        self.0
            .to_str()
            .unwrap_or_else(|| panic!("{} is not UTF-8", self.0.display()))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory (made empty), removed with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let path = unique_path(name);
        if let Err(e) = std::fs::create_dir_all(&path) {
            panic!("creating {}: {e}", path.display());
        }
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the tree `from` to `to`, keeping its symlinks (a sysfs fixture's `class/`
/// entries link into `devices/`, as in sysfs).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}
