//! The DF probes on the wire: UDP sockets connected to the peer with DF set and
//! `IP_RECVERR` on, the probing rounds of [`probe`], and the error queue drained
//! (`recvmsg(MSG_ERRQUEUE)`) for `icmp` to read.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::icmp::{classify, parse_extended_error, Answer, ExtendedError};
use super::{PathError, Probe, CONTROL_PORT, PROBE_PORT};

/// Full-size probes sent before the small one.
const FULL_SIZE_TRIES: u32 = 3;

const IPV4_HEADER: u32 = 20;
const IPV6_HEADER: u32 = 40;
const UDP_HEADER: u32 = 8;
/// What every IPv4 path carries (RFC 791) and every IPv6 path (RFC 8200).
const IPV4_MIN_MTU: u32 = 576;
const IPV6_MIN_MTU: u32 = 1280;

/// Sends DF probes whose IP packet is `size` bytes (the MTU the path must carry) to
/// `peer` and reports what became of them; takes at most about `timeout` (longer
/// only when a send blocks). Blocking: call it from a blocking context.
pub fn probe(peer: IpAddr, size: u32, timeout: Duration) -> Result<Probe, PathError> {
    // An IPv4-mapped IPv6 address is an IPv4 peer: its packets take the IPv4 path,
    // whose options an IPv6 socket does not set.
    let peer = peer.to_canonical();
    let (family, headers, max, min_mtu) = match peer {
        IpAddr::V4(_) => ("IPv4", IPV4_HEADER + UDP_HEADER, 65_535, IPV4_MIN_MTU),
        // The UDP length field bounds the payload, not the IPv6 header.
        IpAddr::V6(_) => (
            "IPv6",
            IPV6_HEADER + UDP_HEADER,
            65_535 + IPV6_HEADER,
            IPV6_MIN_MTU,
        ),
    };
    if size < headers || size > max {
        return Err(PathError::Size {
            size,
            family,
            min: headers,
            max,
        });
    }
    let full = ProbeSocket::open(peer, PROBE_PORT, size - headers)?;
    // The small probe only tells something when the required size is above it.
    let control = if size > min_mtu {
        Some(ProbeSocket::open(peer, CONTROL_PORT, min_mtu - headers)?)
    } else {
        None
    };
    let rounds = FULL_SIZE_TRIES + if control.is_some() { 2 } else { 0 };
    let slice = timeout / rounds;
    let mut tries = 0;
    let mut control_answered = false;
    // What an answer decides: `None` when it is the peer's answer to the small
    // probe (it is there and answers; go on).
    let decide = |from_control: bool, answer: Answer| match (from_control, answer) {
        (true, Answer::FromPeer | Answer::RejectedByPeer(_)) => None,
        (_, answer) => Some(answer.into_probe()),
    };
    for round in 0..rounds {
        let on_control = round == FULL_SIZE_TRIES;
        let confirming = round == FULL_SIZE_TRIES + 1;
        if confirming && !control_answered {
            break;
        }
        let sender = match (on_control, &control) {
            (true, Some(c)) => c,
            _ => &full,
        };
        if let Some(answer) = sender.send()? {
            match decide(on_control, answer) {
                Some(probe) => return Ok(probe),
                None => control_answered = true,
            }
        }
        if !on_control {
            tries += 1;
        }
        let until = Instant::now() + slice;
        while let Some(ready) = wait_readable(&full, control.as_ref(), until)? {
            let socket = match (ready, &control) {
                (Ready::Control, Some(c)) => c,
                _ => &full,
            };
            for answer in socket.read_answers()? {
                match decide(ready == Ready::Control, answer) {
                    Some(probe) => return Ok(probe),
                    None => control_answered = true,
                }
            }
            if on_control && control_answered {
                break;
            }
        }
    }
    Ok(if control_answered {
        Probe::DroppedSilently {
            answered_size: min_mtu,
            tries,
        }
    } else {
        Probe::NoAnswer { tries }
    })
}

/// A UDP socket connected to the peer that sends DF probes of one size and reports
/// the ICMP errors about them.
struct ProbeSocket {
    socket: UdpSocket,
    to: SocketAddr,
    payload: Vec<u8>,
}

impl ProbeSocket {
    fn open(peer: IpAddr, port: u16, payload_len: u32) -> Result<ProbeSocket, PathError> {
        let any: SocketAddr = match peer {
            IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let socket = UdpSocket::bind(any).map_err(PathError::Socket)?;
        let options: &[(i32, i32, i32, &'static str)] = match peer {
            IpAddr::V4(_) => &[
                (
                    libc::SOL_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_PROBE,
                    "IP_MTU_DISCOVER",
                ),
                (libc::SOL_IP, libc::IP_RECVERR, 1, "IP_RECVERR"),
            ],
            // IPv6 hosts fragment themselves unless told not to: DONTFRAG too.
            IpAddr::V6(_) => &[
                (
                    libc::SOL_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_PROBE,
                    "IPV6_MTU_DISCOVER",
                ),
                (libc::SOL_IPV6, libc::IPV6_DONTFRAG, 1, "IPV6_DONTFRAG"),
                (libc::SOL_IPV6, libc::IPV6_RECVERR, 1, "IPV6_RECVERR"),
            ],
        };
        for &(level, name, value, option) in options {
            set_int_option(&socket, level, name, value)
                .map_err(|source| PathError::SocketOption { option, source })?;
        }
        let to = SocketAddr::new(peer, port);
        socket
            .connect(to)
            .map_err(|source| PathError::Connect { to, source })?;
        Ok(ProbeSocket {
            socket,
            to,
            payload: vec![0; payload_len as usize],
        })
    }

    /// Sends one probe. `Some` when the send itself answers: this host's MTU is
    /// smaller, or an answer to an earlier probe was pending (the kernel reports it
    /// on the next send, which then sends nothing).
    fn send(&self) -> Result<Option<Answer>, PathError> {
        let error = match self.socket.send(&self.payload) {
            Ok(_) => return Ok(None),
            // Dropped on the way out (a full queue; on a veth, the peer end refusing a
            // frame above its MTU): with IP_RECVERR the kernel says so. A lost probe.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(None),
            Err(e) => e,
        };
        if let Some(answer) = self.read_answers()?.into_iter().next() {
            return Ok(Some(answer));
        }
        if error.raw_os_error() == Some(libc::EMSGSIZE) {
            // Nothing queued (it would hold the MTU): ask the route.
            return Ok(Some(Answer::LocalMtuTooSmall {
                mtu: self.route_mtu()?,
            }));
        }
        Err(PathError::Send {
            to: self.to,
            source: error,
        })
    }

    /// Empties the error queue and the receive queue: the answers they hold.
    fn read_answers(&self) -> Result<Vec<Answer>, PathError> {
        let peer = self.to.ip();
        let mut answers: Vec<Answer> = self
            .drain_error_queue()
            .map_err(PathError::Receive)?
            .iter()
            .filter_map(|e| classify(e, peer))
            .collect();
        // A reply (something listens on the port): the probe arrived too.
        let mut reply = [0u8; 64];
        // SAFETY: recv into a buffer of the length given; MSG_DONTWAIT never blocks.
        let n = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                reply.as_mut_ptr().cast(),
                reply.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n >= 0 {
            answers.push(Answer::FromPeer);
        }
        // A pending socket error with nothing queued would keep poll() waking us.
        let _ = self.socket.take_error();
        Ok(answers)
    }

    /// `recvmsg(MSG_ERRQUEUE)` until the queue is empty: the extended errors read.
    fn drain_error_queue(&self) -> io::Result<Vec<ExtendedError>> {
        let mut errors = Vec::new();
        loop {
            // The quoted datagram is not needed: a small buffer, truncated.
            let mut quoted = [0u8; 64];
            // u64 elements: aligned for cmsghdr.
            let mut control = [0u64; 64];
            let mut iov = libc::iovec {
                iov_base: quoted.as_mut_ptr().cast(),
                iov_len: quoted.len(),
            };
            // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: msg points to buffers that outlive the call, with their lengths.
            let n = unsafe {
                libc::recvmsg(
                    self.socket.as_raw_fd(),
                    &mut msg,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(errors),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let control_start = control.as_ptr() as usize;
            let control_end =
                control_start + (msg.msg_controllen as usize).min(std::mem::size_of_val(&control));
            // SAFETY: the CMSG macros walk the control buffer the kernel filled, within
            // msg_controllen; each data slice is clamped to the buffer's end.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
                while !cmsg.is_null() {
                    let data = libc::CMSG_DATA(cmsg);
                    let declared =
                        ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    let len = declared.min(control_end.saturating_sub(data as usize));
                    let bytes = std::slice::from_raw_parts(data, len);
                    if let Some(e) =
                        parse_extended_error((*cmsg).cmsg_level, (*cmsg).cmsg_type, bytes)
                    {
                        errors.push(e);
                    }
                    cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                }
            }
        }
    }

    /// `IP_MTU` / `IPV6_MTU`: the MTU of the connected route.
    fn route_mtu(&self) -> Result<u32, PathError> {
        let (level, name, option) = match self.to {
            SocketAddr::V4(_) => (libc::SOL_IP, libc::IP_MTU, "IP_MTU"),
            SocketAddr::V6(_) => (libc::SOL_IPV6, libc::IPV6_MTU, "IPV6_MTU"),
        };
        let mut mtu: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into an int of the length given.
        let rc = unsafe {
            libc::getsockopt(
                self.socket.as_raw_fd(),
                level,
                name,
                (&mut mtu as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(PathError::SocketOption {
                option,
                source: io::Error::last_os_error(),
            });
        }
        Ok(u32::try_from(mtu).unwrap_or(0))
    }
}

/// Which socket has something to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ready {
    Full,
    Control,
}

/// Waits until one of the sockets has an error queued or a reply, or `until` passes
/// (`None`).
fn wait_readable(
    full: &ProbeSocket,
    control: Option<&ProbeSocket>,
    until: Instant,
) -> Result<Option<Ready>, PathError> {
    // POLLERR is always reported; POLLIN for a reply.
    let pollfd = |s: &ProbeSocket| libc::pollfd {
        fd: s.socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = vec![pollfd(full)];
    fds.extend(control.map(pollfd));
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        // Rounded up: a sub-millisecond rest must not turn into a busy loop.
        let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: poll on a vector of pollfds of the length given.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(PathError::Receive(e));
        }
        if let Some(i) = fds.iter().position(|p| p.revents != 0) {
            return Ok(Some(if i == 0 { Ready::Full } else { Ready::Control }));
        }
    }
}

fn set_int_option(socket: &UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to an int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 2, 2));
    const PEER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 2));

    #[test]
    fn impossible_sizes_are_refused_before_any_socket() {
        for (peer, size) in [(PEER4, 27), (PEER4, 65_536), (PEER6, 47), (PEER6, 65_576)] {
            assert!(
                matches!(
                    probe(peer, size, Duration::from_millis(1)),
                    Err(PathError::Size { .. })
                ),
                "{peer} {size}"
            );
        }
    }
}
