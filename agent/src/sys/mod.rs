//! The bpf(2) system call itself, for the commands aya 0.14 does not offer: batch map
//! operations (`batch`), BPF_PROG_TEST_RUN without aya's copies (`testrun`), and the
//! link commands on pins found on a bpffs (`pin`). Each caller lays out its own
//! `union bpf_attr` prefix and names its command.
//!
//! Also interface names, indexes and link events (`netif`), and the SIOCETHTOOL ioctl
//! (`ethtool`: NIC statistics, the PFC watchdog tunable). Imports nothing of the
//! crate: every other folder may use it.

pub mod ethtool;
pub mod netif;

use std::io;

/// bpf(`cmd`, `attr`, sizeof `attr`): the kernel's non-negative answer (a new file
/// descriptor for the commands that make one), or the error it set.
///
/// # Safety
/// `attr` is a `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, and every address
/// inside it points at a buffer valid for the size the kernel will read or write
/// there (by `cmd`'s rules), alive for the call: the kernel writes through them.
pub unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live value of the size passed; its pointers are the
    // caller's promise (see above).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A as *mut libc::c_void,
            std::mem::size_of::<A>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// SO_RCVTIMEO on a socket (the netlink sockets of the audit, DCB and the clsact
/// filters): no request can hang.
pub fn set_receive_timeout(
    socket: &impl std::os::fd::AsRawFd,
    timeout: std::time::Duration,
) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid socket and a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
