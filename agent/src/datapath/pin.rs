//! The pinned datapath: where `run` pins its maps, programs and links on a bpffs, so
//! that classification and enforcement go on when the agent exits (or is killed) and a
//! restarted agent adopts them with every counter intact; and `detach`, which takes it
//! all away.
//!
//! Layout of a pin directory (0700):
//! - `maps/NAME`: every map of `names::map::ALL`; GENERATION carries the layout version;
//! - `progs/NAME`: the programs `run` loaded;
//! - `links/PROGRAM@IFINDEX`: one bpf_link per attachment (XDP and TCX), by ifindex
//!   because a rename keeps the link and a re-created interface does not (bpffs
//!   refuses dots in names).
//!
//! One agent at a time: a running agent holds an exclusive flock on the directory.
//!
//! clsact filters (kernels without TCX) cannot be pinned: `detach` finds the agent's
//! by their program names (`datapath::clsact`).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use roce_common::config::{Generation, LAYOUT_VERSION};
use roce_common::names::map;

use crate::sys::bpf;

/// Where `run` pins by default (DESIGN: `--pin-dir`).
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/roce-agent";
/// The conventional bpffs mount point, mounted by the agent when nothing is there.
const BPFFS_MOUNT: &str = "/sys/fs/bpf";
/// statfs(2) f_type of a bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("pin directory {0} must be an absolute path")]
    Relative(PathBuf),
    #[error(
        "{dir} is not on a bpffs (pinning needs one): mount it with `mount -t bpf bpf {dir}` \
         or choose a --pin-dir under {BPFFS_MOUNT}"
    )]
    NotBpffs { dir: PathBuf },
    #[error(
        "mounting a bpffs on {BPFFS_MOUNT} failed (it needs CAP_SYS_ADMIN: mount it once at \
         boot, `mount -t bpf bpf {BPFFS_MOUNT}`, or run with --no-pin): {source}"
    )]
    Mount { source: io::Error },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "another roce-agent is running with pin directory {0} (only one may own a datapath: \
         stop it first)"
    )]
    Busy(PathBuf),
    #[error(
        "the datapath pinned under {dir} has map layout version {found}; this roce-agent uses \
         version {ours} and will not read maps laid out otherwise. Remove the old datapath \
         with `roce-agent detach --pin-dir {dir}` (classification and enforcement stop until \
         this agent attaches again, and the counters start from zero), then start this agent"
    )]
    Layout { dir: PathBuf, found: u32, ours: u32 },
    #[error(
        "{dir} holds pinned maps but no readable GENERATION map (not a roce-agent datapath, \
         or one older than pinning): remove it with `roce-agent detach --pin-dir {dir}` \
         first"
    )]
    Unversioned { dir: PathBuf },
    #[error("{call} on {path}: {source}")]
    Syscall {
        call: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("removing the agent's clsact filters: {0}")]
    Filters(Box<crate::datapath::clsact::ClsactError>),
}

fn io_error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PinError + 'a {
    move |source| PinError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `root` holds a datapath already (its GENERATION map is pinned): a start
/// then adopts it rather than making one.
pub fn holds_datapath(root: &Path) -> bool {
    generation_pin(root).exists()
}

fn generation_pin(root: &Path) -> PathBuf {
    root.join("maps").join(map::GENERATION)
}

/// An open pin directory, locked for this process while the value lives.
#[derive(Debug)]
pub struct PinDir {
    root: PathBuf,
    _lock: OwnedFd,
}

impl PinDir {
    /// Makes `root` ready for pinning: a bpffs under it (mounted on /sys/fs/bpf when
    /// the path is there and nothing is mounted), the directory and its parts with mode
    /// 0700, and the lock that keeps a second agent out.
    pub fn prepare(root: &Path) -> Result<PinDir, PinError> {
        if !root.is_absolute() {
            return Err(PinError::Relative(root.to_path_buf()));
        }
        ensure_bpffs(root)?;
        for dir in [
            root.to_path_buf(),
            root.join("maps"),
            root.join("progs"),
            root.join("links"),
        ] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_error("creating", &dir))?;
            // An existing directory keeps its mode: make it ours.
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                .map_err(io_error("setting mode 0700 on", &dir))?;
        }
        let lock = lock(root)?;
        Ok(PinDir {
            root: root.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }

    pub fn program(&self, name: &str) -> PathBuf {
        self.root.join("progs").join(name)
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    /// The pin of `program`'s link on interface `ifindex`.
    pub fn link(&self, program: &str, ifindex: u32) -> PathBuf {
        self.links().join(format!("{program}@{ifindex}"))
    }

    /// The layout version of the maps pinned here: None when there are none yet (a
    /// fresh datapath), an error when it is not ours to read.
    pub fn check_layout(&self) -> Result<Option<u32>, PinError> {
        let generation = generation_pin(&self.root);
        if !generation.exists() {
            let any = fs::read_dir(self.maps())
                .map_err(io_error("reading", &self.maps()))?
                .next()
                .is_some();
            return if any {
                Err(PinError::Unversioned {
                    dir: self.root.clone(),
                })
            } else {
                Ok(None)
            };
        }
        let found = read_generation(&generation).map_err(|_| PinError::Unversioned {
            dir: self.root.clone(),
        })?;
        // 0: an agent died between creating the maps and writing the version; which
        // layout it created cannot be known, so that counts as unversioned too.
        match found.layout {
            0 => Err(PinError::Unversioned {
                dir: self.root.clone(),
            }),
            v if v == LAYOUT_VERSION => Ok(Some(v)),
            found => Err(PinError::Layout {
                dir: self.root.clone(),
                found,
                ours: LAYOUT_VERSION,
            }),
        }
    }

    /// Every link pinned here.
    pub fn pinned_links(&self) -> Result<Vec<PinnedLink>, PinError> {
        let mut out = Vec::new();
        let dir = self.links();
        for entry in fs::read_dir(&dir).map_err(io_error("reading", &dir))? {
            let entry = entry.map_err(io_error("reading", &dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let program = name
                .rsplit_once('@')
                .map(|(p, _)| p.to_string())
                .unwrap_or(name);
            let (fd, ifindex) = open_link(&path)?;
            out.push(PinnedLink {
                path,
                program,
                ifindex,
                fd,
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The pinned link of `program` on `ifindex` when it is there and still attached
    /// to that interface. A link whose interface went away is detached and unpinned.
    pub fn live_link(&self, program: &str, ifindex: u32) -> Result<Option<OwnedFd>, PinError> {
        let path = self.link(program, ifindex);
        if !path.exists() {
            return Ok(None);
        }
        let (fd, on) = open_link(&path)?;
        if on == ifindex {
            return Ok(Some(fd));
        }
        remove_link(&path, fd.as_fd())?;
        Ok(None)
    }
}

/// The link pinned at `path`, and the interface the kernel says it is on.
fn open_link(path: &Path) -> Result<(OwnedFd, u32), PinError> {
    let fd = obj_get(path)?;
    let ifindex = link_ifindex(fd.as_fd()).map_err(|source| PinError::Syscall {
        call: "BPF_OBJ_GET_INFO_BY_FD",
        path: path.to_path_buf(),
        source,
    })?;
    Ok((fd, ifindex))
}

/// A link found in a pin directory.
#[derive(Debug)]
pub struct PinnedLink {
    pub path: PathBuf,
    /// The program name the pin is named after.
    pub program: String,
    /// The interface of the XDP or TCX link; 0 once the interface is gone.
    pub ifindex: u32,
    pub fd: OwnedFd,
}

/// Mounts a bpffs on /sys/fs/bpf when `root` is below it and none is mounted there;
/// refuses a `root` on any other filesystem.
fn ensure_bpffs(root: &Path) -> Result<(), PinError> {
    let existing = root
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if is_bpffs(existing).map_err(io_error("statfs", existing))? {
        return Ok(());
    }
    let mount_point = Path::new(BPFFS_MOUNT);
    if !root.starts_with(mount_point) || !mount_point.is_dir() {
        return Err(PinError::NotBpffs {
            dir: existing.to_path_buf(),
        });
    }
    mount_bpffs(mount_point).map_err(|source| PinError::Mount { source })?;
    tracing::info!(
        mount_point = BPFFS_MOUNT,
        "no bpffs was mounted: mounted one"
    );
    Ok(())
}

fn is_bpffs(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: statfs fills the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

fn mount_bpffs(at: &Path) -> io::Result<()> {
    let target = CString::new(at.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let fstype = c"bpf";
    let options = c"mode=0700";
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An exclusive, non-blocking flock on `dir`, held by the returned descriptor.
fn lock(dir: &Path) -> Result<OwnedFd, PinError> {
    let file = fs::File::open(dir).map_err(io_error("opening", dir))?;
    let fd: OwnedFd = file.into();
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(PinError::Busy(dir.to_path_buf()));
        }
        return Err(PinError::Io {
            what: "locking",
            path: dir.to_path_buf(),
            source: e,
        });
    }
    Ok(fd)
}

fn read_generation(path: &Path) -> Result<Generation, aya::maps::MapError> {
    let data = aya::maps::MapData::from_pin(path)?;
    let array: aya::maps::Array<_, Generation> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data))?;
    array.get(&0, 0)
}

// ---------------------------------------------------------------------------------
// The bpf(2) commands aya does not offer for links found on a bpffs.

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;

/// BPF_OBJ_GET: a descriptor of the object pinned at `path`.
pub fn obj_get(path: &Path) -> Result<OwnedFd, PinError> {
    #[repr(C)]
    struct Attr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }
    let syscall = |source| PinError::Syscall {
        call: "BPF_OBJ_GET",
        path: path.to_path_buf(),
        source,
    };
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| syscall(io::Error::other(e)))?;
    let mut attr = Attr {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    // SAFETY: `pathname` is the NUL-terminated `c`, alive for the call.
    let fd = unsafe { bpf(BPF_OBJ_GET, &mut attr) }.map_err(syscall)?;
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_OBJ_GET_INFO_BY_FD on an XDP or TCX link: its interface (0 once the
/// interface is gone).
pub fn link_ifindex(fd: BorrowedFd<'_>) -> io::Result<u32> {
    #[repr(C)]
    struct Attr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) a union whose XDP and
    // TCX members start with the ifindex. The tail stays zero, as the kernel asks.
    let mut info = [0u32; 16];
    let mut attr = Attr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: `info` is `info_len` bytes, alive for the call; the kernel writes at
    // most that many.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info[4])
}

/// BPF_LINK_UPDATE: `link` runs `program` from the next packet on, atomically.
pub fn link_update(link: BorrowedFd<'_>, program: BorrowedFd<'_>) -> io::Result<()> {
    #[repr(C)]
    struct Attr {
        link_fd: u32,
        new_prog_fd: u32,
        flags: u32,
        old_prog_fd: u32,
    }
    let mut attr = Attr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: program.as_raw_fd() as u32,
        flags: 0,
        old_prog_fd: 0,
    };
    // SAFETY: the attr holds descriptors only, no addresses.
    unsafe { bpf(BPF_LINK_UPDATE, &mut attr) }.map(drop)
}

/// BPF_LINK_DETACH: the link lets go of its interface now, whoever else holds it.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    #[repr(C)]
    struct Attr {
        link_fd: u32,
    }
    let mut attr = Attr {
        link_fd: link.as_raw_fd() as u32,
    };
    // SAFETY: the attr holds a descriptor only, no address.
    unsafe { bpf(BPF_LINK_DETACH, &mut attr) }.map(drop)
}

/// Detaches the link pinned at `path` and removes the pin.
pub fn remove_link(path: &Path, fd: BorrowedFd<'_>) -> Result<(), PinError> {
    match link_detach(fd) {
        // ENOLINK: already detached (its interface went away).
        Err(e) if e.raw_os_error() != Some(libc::ENOLINK) => {
            return Err(PinError::Syscall {
                call: "BPF_LINK_DETACH",
                path: path.to_path_buf(),
                source: e,
            })
        }
        _ => {}
    }
    fs::remove_file(path).map_err(io_error("removing", path))
}

/// What `detach` removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Removed {
    pub links: Vec<String>,
    /// The agent's clsact filters (kernels without TCX), as `IF HOOK pref P handle H
    /// PROGRAM`.
    pub filters: Vec<String>,
    /// The interfaces whose clsact qdisc went with the agent's filters (they were all
    /// it held).
    pub qdiscs: Vec<String>,
    pub programs: Vec<String>,
    pub maps: Vec<String>,
}

/// `roce-agent detach`: detaches every pinned link under `root` and the agent's
/// clsact filters on every interface (a clsact qdisc they leave empty goes too), then
/// removes every pin and the directory. Refuses while an agent holds the directory.
/// Leaves the bpffs mount alone (it is the host's).
pub fn detach(root: &Path) -> Result<Removed, PinError> {
    let mut removed = Removed::default();
    if !root.exists() {
        return Ok(removed);
    }
    let _lock = lock(root)?;
    for entry in list(&root.join("links"))? {
        let fd = obj_get(&entry)?;
        remove_link(&entry, fd.as_fd())?;
        removed.links.push(file_name(&entry));
    }
    // Filters belong to no process: those of a killed agent are still there.
    let swept = crate::datapath::clsact::sweep().map_err(|e| PinError::Filters(Box::new(e)))?;
    for (ifname, r) in swept {
        removed
            .filters
            .extend(r.filters.iter().map(|f| f.describe()));
        if r.qdisc {
            removed.qdiscs.push(ifname);
        }
    }
    for (sub, names) in [
        ("progs", &mut removed.programs),
        ("maps", &mut removed.maps),
    ] {
        for entry in list(&root.join(sub))? {
            fs::remove_file(&entry).map_err(io_error("removing", &entry))?;
            names.push(file_name(&entry));
        }
    }
    for sub in ["links", "progs", "maps"] {
        let d = root.join(sub);
        if d.exists() {
            fs::remove_dir(&d).map_err(io_error("removing", &d))?;
        }
    }
    fs::remove_dir(root).map_err(io_error("removing", root))?;
    Ok(removed)
}

/// The entries of `dir`, sorted; none when it does not exist.
fn list(dir: &Path) -> Result<Vec<PathBuf>, PinError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("reading", dir))? {
        out.push(entry.map_err(io_error("reading", dir))?.path());
    }
    out.sort();
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
