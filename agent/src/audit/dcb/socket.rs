//! The dcbnl exchanges over a raw NETLINK_ROUTE socket: [`query`] (RTM_GETDCB) and
//! the acknowledged RTM_SETDCBs [`set_apps`], [`delete_apps`], [`set_pfc`]. The bytes
//! are `wire`'s.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::wire::{
    decode_ieee_reply, encode_app_del, encode_app_set, encode_ieee_get, encode_pfc_set, message,
    messages, set_reply_step,
};
use super::{DcbApp, DcbError, DcbState, IeeePfc};

/// Longest interface name (IFNAMSIZ less the NUL).
const IFNAME_MAX: usize = 15;
/// How long a reply may take: the kernel answers at once, a driver talking to
/// firmware in well under a second.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// dcbnl replies fit in one page (NLMSG_DEFAULT_SIZE); this leaves room to spare.
const RECEIVE_BUFFER: usize = 64 * 1024;

static SEQUENCE: AtomicU32 = AtomicU32::new(1);

fn next_seq() -> u32 {
    SEQUENCE.fetch_add(1, Ordering::Relaxed)
}

/// No kernel device can have this name: answered without asking.
fn check_name(ifname: &str) -> Result<(), DcbError> {
    if ifname.is_empty() || ifname.len() > IFNAME_MAX || ifname.contains(['\0', '/']) {
        return Err(DcbError::NoDevice);
    }
    Ok(())
}

fn no_reply() -> DcbError {
    DcbError::Io(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no reply from dcbnl within {} s", REPLY_TIMEOUT.as_secs()),
    ))
}

/// Sends `request` (sequence `seq`) on a new socket and hands every reply message of
/// that sequence to `step` until it returns a value or an error. Never waits longer
/// than REPLY_TIMEOUT in all.
fn exchange<T>(
    request: &[u8],
    seq: u32,
    mut step: impl FnMut(&[u8]) -> Result<Option<T>, DcbError>,
) -> Result<T, DcbError> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    crate::sys::set_receive_timeout(&socket, REPLY_TIMEOUT)?;
    socket.send_to(request, &SocketAddr::new(0, 0), 0)?;
    let deadline = Instant::now() + REPLY_TIMEOUT;
    let mut buf: Vec<u8> = Vec::with_capacity(RECEIVE_BUFFER);
    while Instant::now() < deadline {
        buf.clear();
        let from = match socket.recv_from(&mut buf, 0) {
            Ok((_, from)) => from,
            Err(e) => match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Err(no_reply()),
                _ => return Err(e.into()),
            },
        };
        if from.port_number() != 0 {
            continue; // not from the kernel
        }
        for m in messages(&buf)? {
            if message(m)?.0.seq != seq {
                continue;
            }
            if let Some(done) = step(m)? {
                return Ok(done);
            }
        }
    }
    Err(no_reply())
}

/// The DCB state of `ifname` (in the calling thread's network namespace). Needs no
/// privilege.
pub fn query(ifname: &str) -> Result<DcbState, DcbError> {
    check_name(ifname)?;
    let seq = next_seq();
    exchange(&encode_ieee_get(ifname, seq), seq, |m| {
        decode_ieee_reply(m).map(Some)
    })
}

/// An acknowledged RTM_SETDCB: `request_of` builds it for a sequence number.
fn set(ifname: &str, request_of: impl FnOnce(u32) -> Vec<u8>) -> Result<(), DcbError> {
    check_name(ifname)?;
    let seq = next_seq();
    exchange(&request_of(seq), seq, set_reply_step)
}

/// Adds `apps` to `ifname`'s app table (see [`encode_app_set`]). Needs CAP_NET_ADMIN.
pub fn set_apps(ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
    if apps.is_empty() {
        return Ok(());
    }
    set(ifname, |seq| encode_app_set(ifname, seq, apps))
}

/// Removes `apps` from `ifname`'s app table. Needs CAP_NET_ADMIN.
pub fn delete_apps(ifname: &str, apps: &[DcbApp]) -> Result<(), DcbError> {
    if apps.is_empty() {
        return Ok(());
    }
    set(ifname, |seq| encode_app_del(ifname, seq, apps))
}

/// Sets `ifname`'s PFC state. Needs CAP_NET_ADMIN.
pub fn set_pfc(ifname: &str, pfc: &IeeePfc) -> Result<(), DcbError> {
    set(ifname, |seq| encode_pfc_set(ifname, seq, pfc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_names_are_no_device_without_asking() {
        for name in ["", "sixteen-chars-xx", "a/b", "nul\0"] {
            assert!(matches!(query(name), Err(DcbError::NoDevice)), "{name:?}");
            assert!(matches!(
                set_pfc(name, &IeeePfc::default()),
                Err(DcbError::NoDevice)
            ));
        }
        // Nothing to send: no request at all.
        assert!(set_apps("", &[]).is_ok());
        assert!(delete_apps("", &[]).is_ok());
    }
}
