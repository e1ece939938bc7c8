//! Small system calls the test tooling's senders and receivers need (roce-gen, the
//! demo's intruder, the benches' floods): an integer socket option, binding a socket
//! to a device, pinning a thread to a CPU.

use std::io;
use std::os::fd::AsRawFd;

/// `setsockopt(level, name, value)` with an int value.
pub fn set_int_option(sock: &impl AsRawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to an int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_BINDTODEVICE`: the socket sends and receives through interface `iface` only.
pub fn bind_to_device(sock: &impl AsRawFd, iface: &str) -> io::Result<()> {
    // SAFETY: SO_BINDTODEVICE takes the name bytes and their length.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            iface.as_ptr() as *const libc::c_void,
            iface.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_thread_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is out of range"),
        ));
    }
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it (checked
    // above); sched_setaffinity(0) affects this thread only.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
