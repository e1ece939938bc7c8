//! The VM lab's disk image: a Debian bookworm root file system from Debian packages
//! only, with one kernel, built by `tests/vm/build-image.sh` and cached under
//! `target/vm/images/`. The cache key is a hash of everything the recipe reads
//! (the package list, the script, the boot script installed in the image, the
//! kernel package and [`RECIPE_VERSION`]): an image is rebuilt only when one of
//! them changes. A build goes into a temporary directory renamed at the end, so a
//! failed build leaves no half image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Bump to rebuild every image when something outside the hashed files changes
/// how an image comes out.
const RECIPE_VERSION: &str = "1";

/// The files of `tests/vm/` the image is made from (hashed into the key).
const RECIPE_FILES: [&str; 3] = ["packages", "build-image.sh", "boot.sh"];

/// A built image: the disk and the kernel to boot it with.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    /// `uname -r` of the kernel in it.
    pub release: String,
}

impl Image {
    pub fn disk(&self) -> PathBuf {
        self.dir.join("disk.img")
    }
    pub fn vmlinuz(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }
    pub fn initrd(&self) -> PathBuf {
        self.dir.join("initrd.img")
    }
}

/// A file-name-safe form of a kernel package: `linux-image-amd64/bookworm-backports`
/// -> `linux-image-amd64_bookworm-backports`.
pub fn slug(kernel: &str) -> String {
    kernel
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a, 64 bits: a stable hash (std's hasher may change between releases).
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The cache key of the image for `kernel`, from the recipe in `recipe_dir`.
pub fn key(recipe_dir: &Path, kernel: &str) -> Result<String> {
    let mut h = fnv1a(RECIPE_VERSION.as_bytes(), 0xcbf2_9ce4_8422_2325);
    h = fnv1a(kernel.as_bytes(), h);
    for f in RECIPE_FILES {
        let path = recipe_dir.join(f);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        h = fnv1a(f.as_bytes(), h);
        h = fnv1a(&bytes, h);
    }
    Ok(format!("{h:016x}"))
}

/// The Debian mirror apt on this host already uses (the first `URIs:` or `deb`
/// line naming a `/debian` archive), else deb.debian.org.
pub fn mirror() -> String {
    let mut texts = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in rd.flatten() {
            if e.path()
                .extension()
                .is_some_and(|x| x == "sources" || x == "list")
            {
                texts.push(std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
    }
    texts.push(std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default());
    for text in &texts {
        for line in text.lines().map(str::trim) {
            let uri = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().next()
            } else if line.starts_with("deb ") {
                line.split_whitespace().find(|w| w.starts_with("http"))
            } else {
                None
            };
            if let Some(u) = uri.filter(|u| u.trim_end_matches('/').ends_with("/debian")) {
                return u.trim_end_matches('/').to_string();
            }
        }
    }
    "http://deb.debian.org/debian".to_string()
}

/// Mount points under `dir` (a build's chroot mounts that were not undone).
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Removes a build or image directory, never across a mount (a chroot's bind
/// mount of /dev must not be emptied).
pub fn remove_dir(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mounts = mounts_under(dir);
    if !mounts.is_empty() {
        bail!(
            "{} still has mounts ({}): unmount them, then remove it",
            dir.display(),
            mounts.join(", ")
        );
    }
    let status = Command::new("rm")
        .args(["-rf", "--one-file-system"])
        .arg(dir)
        .status()
        .context("running rm")?;
    if !status.success() {
        bail!("removing {} failed ({status})", dir.display());
    }
    Ok(())
}

/// The cached image for `kernel`, built first when there is none for the current
/// recipe (as root: debootstrap, chroot, mkfs). Older images of the same kernel
/// package are removed.
pub fn ensure(root: &Path, recipe_dir: &Path, kernel: &str) -> Result<Image> {
    let key = key(recipe_dir, kernel)?;
    let images = root.join("images");
    let name = format!("{}-{key}", slug(kernel));
    let dir = images.join(&name);
    if !dir.join("disk.img").exists() {
        build(root, recipe_dir, kernel, &dir)?;
    } else {
        eprintln!("[vm] image {} (cached)", dir.display());
    }
    // Images of the same kernel package from another recipe.
    let prefix = format!("{}-", slug(kernel));
    for e in std::fs::read_dir(&images)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) && n != name && n.len() == name.len() {
            eprintln!("[vm] removing the outdated image {n}");
            remove_dir(&e.path())?;
        }
    }
    let release = std::fs::read_to_string(dir.join("kernel-release"))
        .context("the image has no kernel-release")?
        .trim()
        .to_string();
    Ok(Image { dir, release })
}

fn build(root: &Path, recipe_dir: &Path, kernel: &str, dir: &Path) -> Result<()> {
    if !xtask::setup::is_root() {
        bail!("building the VM image needs root (debootstrap, chroot, mounts)");
    }
    for tool in ["debootstrap", "mkfs.ext4", "chroot"] {
        if !xtask::setup::have(tool) {
            bail!(
                "{tool} is missing: `cargo xtask setup` installs debootstrap and qemu-system-x86"
            );
        }
    }
    let images = dir.parent().context("image directory without a parent")?;
    std::fs::create_dir_all(images)?;
    let file_name = dir
        .file_name()
        .context("image directory without a name")?
        .to_string_lossy()
        .into_owned();
    let tmp = images.join(format!(".build-{file_name}-{}", std::process::id()));
    remove_dir(&tmp)?;
    std::fs::create_dir_all(&tmp)?;
    let mirror = mirror();
    eprintln!(
        "[vm] building the image for {kernel} from {mirror} (about 90 s; log in {})",
        tmp.display()
    );
    let started = Instant::now();
    let status = Command::new("sh")
        .arg(recipe_dir.join("build-image.sh"))
        .arg(&tmp)
        .arg(&mirror)
        .arg(kernel)
        .arg(recipe_dir.join("packages"))
        .arg(recipe_dir.join("boot.sh"))
        .arg(root.join("apt-cache"))
        .status()
        .context("running tests/vm/build-image.sh")?;
    if !status.success() {
        let kept = tmp.with_extension("failed");
        // Keep the logs of a failed build, without its root file system.
        let _ = remove_dir(&tmp.join("rootfs"));
        let _ = remove_dir(&kept);
        let _ = std::fs::rename(&tmp, &kept);
        bail!(
            "building the image for {kernel} failed ({status}); logs in {}",
            kept.display()
        );
    }
    std::fs::rename(&tmp, dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    eprintln!(
        "[vm] image built in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_keeps_names_and_replaces_the_suite_separator() {
        assert_eq!(
            slug("linux-image-amd64/bookworm-backports"),
            "linux-image-amd64_bookworm-backports"
        );
        assert_eq!(
            slug("linux-image-6.1.0-50-amd64"),
            "linux-image-6.1.0-50-amd64"
        );
    }

    #[test]
    fn fnv1a_is_the_reference_function() {
        // The FNV-1a 64 test vector of "a".
        assert_eq!(fnv1a(b"a", 0xcbf2_9ce4_8422_2325), 0xaf63_dc4c_8601_ec8c);
    }
}
