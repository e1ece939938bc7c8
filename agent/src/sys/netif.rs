//! Interface names and indexes.

use std::ffi::{CStr, CString};

/// The ifindex of `name`, or None when there is no such interface.
pub fn index_of(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// The name of interface `index`, or None when it does not exist (any more).
pub fn name_of(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes as the call requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Every interface of this network namespace: (ifindex, name).
pub fn all() -> std::io::Result<Vec<(u32, String)>> {
    // SAFETY: if_nameindex returns an array that ends with a zeroed entry, or null;
    // the names are NUL-terminated; the array is freed once, after the last read.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut entry = list;
        while (*entry).if_index != 0 && !(*entry).if_name.is_null() {
            let name = CStr::from_ptr((*entry).if_name)
                .to_string_lossy()
                .into_owned();
            out.push(((*entry).if_index, name));
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
        Ok(out)
    }
}

/// A wake-up for every rtnetlink link message (RTMGRP_LINK: a link added, removed,
/// renamed, up or down), read on a thread of its own. What changed is not parsed:
/// the receiver compares names and ifindexes itself (`attach::Attachments::drifted`).
/// The thread ends when the receiver is dropped (at the next message).
pub fn link_events() -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<()>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const RTMGRP_LINK: u32 = 1;
    // SAFETY: plain socket calls on a descriptor we own and a sockaddr we filled.
    let fd = unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = RTMGRP_LINK;
        if libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        fd
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("link-events".into())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                // SAFETY: recv into a buffer we own, of its size.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        0,
                    )
                };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                // ENOBUFS (messages lost) is a change too: look again.
                if tx.send(()).is_err() {
                    return;
                }
            }
        })?;
    Ok(rx)
}
