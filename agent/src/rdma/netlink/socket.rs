//! The exchange on a raw `NETLINK_RDMA` socket: a request out, its reply datagrams
//! back (a dump's up to its NLMSG_DONE), matched by sequence number, every receive
//! bounded by SO_RCVTIMEO.
//!
//! Privilege: none. ib_core's netlink (`drivers/infiniband/core/netlink.c:
//! rdma_nl_rcv_msg`) asks CAP_NET_ADMIN only of the commands flagged
//! `RDMA_NL_ADMIN_PERM` in `nldev.c`'s table: SET, NEWLINK, DELLINK, SYS_SET,
//! STAT_SET, STAT_DEL and the RES_*_GET_RAW dumps. The ones read here (GET,
//! PORT_GET, RES_QP_GET, RES_CM_ID_GET, STAT_GET) carry no flag; CAP_NET_ADMIN only
//! adds MR and PD keys to other dumps. Two things depend on where the reader runs:
//! devices are those of the socket's network namespace (all of them while the rdma
//! subsystem's netns mode is "shared", the default), and a QP's PID is given in the
//! reader's pid namespace (`task_pid_vnr`) and left out for processes outside it, so
//! a reader in a container sees owners only with the host's pid namespace.
//!
//! Opening the socket on a kernel whose ib_core is a module not loaded makes the
//! kernel try to load it (`net-pf-16-proto-20`), as `rdma` does; without ib_core the
//! socket is refused with EPROTONOSUPPORT: [`RdmaError::NoRdmaSubsystem`].

use std::io;
use std::time::{Duration, Instant};

use netlink_sys::{Socket, SocketAddr};

use super::attrs::{nldev_type, NETLINK_RDMA, NLM_F_DUMP, NLM_F_REQUEST};
use super::decode::command_name;
use super::wire::{messages, Writer};
use crate::rdma::RdmaError;

/// How long one receive may wait: the kernel answers at once (a driver asked for its
/// counters talks to firmware, well under a second).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a whole dump may take.
const DUMP_DEADLINE: Duration = Duration::from_secs(10);
/// A dump datagram is at most 32 KiB (`netlink_dump` allocates up to the reader's
/// largest receive, capped there); a doit reply fits a page.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// One NETLINK_RDMA socket, for the requests of one refresh.
pub struct NldevSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn timed_out(request: &str) -> RdmaError {
    RdmaError::Io(io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "no complete reply to {request} from RDMA netlink within {} s",
            DUMP_DEADLINE.as_secs()
        ),
    ))
}

impl NldevSocket {
    /// Opens and binds the socket. EPROTONOSUPPORT (no ib_core) is
    /// [`RdmaError::NoRdmaSubsystem`].
    pub fn open() -> Result<NldevSocket, RdmaError> {
        NldevSocket::open_protocol(NETLINK_RDMA)
    }

    /// The same exchange on another netlink protocol (the tests use rtnetlink, which
    /// every kernel has).
    fn open_protocol(protocol: i32) -> Result<NldevSocket, RdmaError> {
        let mut socket = match Socket::new(protocol as isize) {
            Ok(s) => s,
            Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => {
                return Err(RdmaError::NoRdmaSubsystem)
            }
            Err(e) => return Err(RdmaError::Io(e)),
        };
        socket.bind_auto()?;
        crate::sys::set_receive_timeout(&socket, RECEIVE_TIMEOUT)?;
        Ok(NldevSocket {
            socket,
            // Any start will do: replies are matched on this socket's own port id.
            seq: 1,
            buf: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Sends a message of type `kind` whose payload `fill` writes; its sequence number.
    fn send(
        &mut self,
        kind: u16,
        flags: u16,
        fill: impl FnOnce(&mut Writer<'_>),
    ) -> Result<u32, RdmaError> {
        self.seq = self.seq.wrapping_add(1);
        let mut request = Vec::with_capacity(64);
        let mut w = Writer::message(&mut request, kind, flags, self.seq, 0);
        fill(&mut w);
        w.finish();
        self.socket.send_to(&request, &SocketAddr::new(0, 0), 0)?;
        Ok(self.seq)
    }

    /// The next datagram from the kernel that answers `seq`, copied out.
    fn receive(
        &mut self,
        request: &str,
        seq: u32,
        deadline: Instant,
    ) -> Result<Vec<u8>, RdmaError> {
        while Instant::now() < deadline {
            self.buf.clear();
            let (len, from) = match self.socket.recv_from(&mut self.buf, libc::MSG_TRUNC) {
                Ok(r) => r,
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        return Err(timed_out(request))
                    }
                    _ => return Err(e.into()),
                },
            };
            if len > self.buf.len() {
                return Err(RdmaError::Malformed {
                    what: "reply datagram",
                    detail: format!(
                        "{len} bytes, more than the {} of the receive buffer",
                        self.buf.len()
                    ),
                });
            }
            if from.port_number() != 0 {
                continue; // not from the kernel
            }
            // A reply left over from an earlier request (one that timed out) is not ours.
            match messages(&self.buf).next() {
                Some(Ok(first)) if first.seq == seq => return Ok(self.buf.clone()),
                Some(Err(e)) => return Err(e),
                _ => continue,
            }
        }
        Err(timed_out(request))
    }

    /// A dump: every datagram of the reply, the last one holding NLMSG_DONE. An
    /// NLMSG_ERROR, or a DONE carrying an error, is [`RdmaError::Kernel`].
    pub fn dump(&mut self, op: u16, attrs: &[(u16, u32)]) -> Result<Vec<Vec<u8>>, RdmaError> {
        self.dump_kind(nldev_type(op), command_name(op), |w| {
            for &(kind, value) in attrs {
                w.u32(kind, value);
            }
        })
    }

    fn dump_kind(
        &mut self,
        kind: u16,
        request: &'static str,
        fill: impl FnOnce(&mut Writer<'_>),
    ) -> Result<Vec<Vec<u8>>, RdmaError> {
        let seq = self.send(kind, NLM_F_REQUEST | NLM_F_DUMP, fill)?;
        let deadline = Instant::now() + DUMP_DEADLINE;
        let mut datagrams = Vec::new();
        loop {
            let datagram = self.receive(request, seq, deadline)?;
            let mut done = false;
            for m in messages(&datagram) {
                match m?.errno()? {
                    Some(0) => done = true,
                    Some(errno) => return Err(RdmaError::Kernel { request, errno }),
                    None => {}
                }
            }
            datagrams.push(datagram);
            if done {
                return Ok(datagrams);
            }
        }
    }

    /// A single request (no dump): its reply datagram, or [`RdmaError::Kernel`].
    pub fn get(&mut self, op: u16, attrs: &[(u16, u32)]) -> Result<Vec<u8>, RdmaError> {
        let request = command_name(op);
        let seq = self.send(nldev_type(op), NLM_F_REQUEST, |w| {
            for &(kind, value) in attrs {
                w.u32(kind, value);
            }
        })?;
        let datagram = self.receive(request, seq, Instant::now() + DUMP_DEADLINE)?;
        for m in messages(&datagram) {
            if let Some(errno) = m?.errno()? {
                if errno != 0 {
                    return Err(RdmaError::Kernel { request, errno });
                }
            }
        }
        Ok(datagram)
    }
}

#[cfg(test)]
mod tests {
    use super::super::attrs::{RDMA_NLDEV_ATTR_DEV_INDEX, RDMA_NLDEV_CMD_RES_QP_GET};
    use super::*;

    const RTM_NEWLINK: u16 = 16;
    const RTM_GETLINK: u16 = 18;

    /// The exchange on rtnetlink, which this kernel has: a link dump (read only) comes
    /// back whole, up to its DONE, every message answering our sequence number.
    #[test]
    fn a_dump_comes_back_up_to_its_done() {
        let mut s = NldevSocket::open_protocol(libc::NETLINK_ROUTE).unwrap();
        for _ in 0..3 {
            let datagrams = s
                .dump_kind(RTM_GETLINK, "RTM_GETLINK", |w| {
                    w.raw(&[0u8; 16]); // struct ifinfomsg, any family and device
                })
                .unwrap();
            let all: Vec<_> = datagrams
                .iter()
                .flat_map(|d| messages(d).map(Result::unwrap).collect::<Vec<_>>())
                .collect();
            assert!(all.iter().all(|m| m.seq == s.seq));
            assert!(all.iter().any(|m| m.kind == RTM_NEWLINK), "no link at all");
            assert_eq!(
                all.last().map(|m| m.kind),
                Some(super::super::attrs::NLMSG_DONE)
            );
        }
    }

    /// rtnetlink knows no nldev command: its refusal is a kernel error naming ours.
    #[test]
    fn a_refusal_is_a_kernel_error() {
        let mut s = NldevSocket::open_protocol(libc::NETLINK_ROUTE).unwrap();
        let r = s.dump(RDMA_NLDEV_CMD_RES_QP_GET, &[(RDMA_NLDEV_ATTR_DEV_INDEX, 1)]);
        match r {
            Err(RdmaError::Kernel { request, errno }) => {
                assert_eq!(request, "RDMA_NLDEV_CMD_RES_QP_GET");
                assert!(errno > 0);
            }
            other => panic!("{other:?}"),
        }
        // The socket is still good for the next request.
        let r = s.get(RDMA_NLDEV_CMD_RES_QP_GET, &[]);
        assert!(matches!(r, Err(RdmaError::Kernel { .. })), "{r:?}");
    }
}
