//! The demo's intruder: non-RoCE UDP traffic on a lossless DSCP (a storage or
//! bulk-transfer job that copied RoCE's traffic class), sent from one namespace, and
//! a receiver in the other that reads the TOS byte of every datagram that arrives
//! (`IP_RECVTOS`), so the demo can show what the receiver really got.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use roce_testkit::lab::in_namespace;
use roce_testkit::sock::{pin_thread_to_cpu, set_int_option};

/// UDP port of the intruder flow (iperf3's: bulk traffic, not RoCE).
pub const PORT: u16 = 5201;

/// TOS bytes of the datagrams that arrived, by value.
pub type TosCounts = BTreeMap<u8, u64>;

/// Receives one datagram and returns its TOS byte (None: timeout).
fn recv_tos(sock: &UdpSocket) -> io::Result<Option<u8>> {
    let mut data = [0u8; 2048];
    // Room for one cmsghdr with an int (IP_TOS arrives as one byte, padded).
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; zero is a valid start.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at buffers that live across the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                return Ok(Some(*libc::CMSG_DATA(c)));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Err(io::Error::other(
        "datagram without an IP_TOS control message",
    ))
}

/// A receiver running in a namespace until [`Receiver::finish`] (or until dropped,
/// when the demo stops early: its thread then ends within a read timeout).
pub struct Receiver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<TosCounts>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Receiver {
    /// Binds `addr:PORT` in namespace `ns` and counts arriving datagrams by TOS.
    pub fn start(ns: &str, addr: Ipv4Addr) -> Result<Receiver> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        let ns = ns.to_string();
        let stop_flag = stop.clone();
        let thread = std::thread::spawn(move || {
            in_namespace(&ns, move || {
                let bound = UdpSocket::bind(SocketAddrV4::new(addr, PORT))
                    .with_context(|| format!("binding {addr}:{PORT}"))
                    .and_then(|s| {
                        set_int_option(&s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
                            .context("IP_RECVTOS")?;
                        s.set_read_timeout(Some(Duration::from_millis(100)))
                            .context("read timeout")?;
                        Ok(s)
                    });
                let sock = match bound {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                        return Err(e);
                    }
                };
                let mut counts = TosCounts::new();
                while !stop_flag.load(Ordering::Relaxed) {
                    if let Some(tos) = recv_tos(&sock).context("receiving")? {
                        *counts.entry(tos).or_default() += 1;
                    }
                }
                // Whatever is still queued arrived too.
                while let Some(tos) = recv_tos(&sock).context("receiving")? {
                    *counts.entry(tos).or_default() += 1;
                }
                Ok(counts)
            })
        });
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Receiver {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e.context("starting the intruder receiver")),
            Err(_) => Err(anyhow!("the intruder receiver did not start")),
        }
    }

    /// Stops receiving and returns the TOS bytes seen.
    pub fn finish(mut self) -> Result<TosCounts> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .ok_or_else(|| anyhow!("the intruder receiver was already finished"))?
            .join()
            .map_err(|_| anyhow!("the intruder receiver panicked"))?
    }
}

/// A sender running in a namespace; [`Sender::finish`] returns the datagrams sent.
pub struct Sender {
    thread: JoinHandle<Result<u64>>,
}

impl Sender {
    /// Sends `count` 64-byte datagrams with TOS byte `tos` from `src` to `dst:PORT`,
    /// spread evenly over `over`, from namespace `ns`, on CPU `cpu`.
    pub fn start(
        ns: &str,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        tos: u8,
        cpu: usize,
        count: u64,
        over: Duration,
    ) -> Sender {
        let ns = ns.to_string();
        let thread = std::thread::spawn(move || {
            in_namespace(&ns, move || {
                pin_thread_to_cpu(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
                let sock = UdpSocket::bind(SocketAddrV4::new(src, 0))
                    .with_context(|| format!("binding {src}"))?;
                // UDP sockets keep the ECN bits of IP_TOS (TCP would clear them).
                set_int_option(&sock, libc::IPPROTO_IP, libc::IP_TOS, tos as i32)
                    .context("IP_TOS")?;
                let start = Instant::now();
                let payload = [0x5Au8; 64];
                for i in 0..count {
                    let due = start + over.mul_f64(i as f64 / count.max(1) as f64);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    sock.send_to(&payload, SocketAddrV4::new(dst, PORT))
                        .with_context(|| format!("sending to {dst}:{PORT}"))?;
                }
                Ok(count)
            })
        });
        Sender { thread }
    }

    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    pub fn finish(self) -> Result<u64> {
        self.thread
            .join()
            .map_err(|_| anyhow!("the intruder sender panicked"))?
    }
}
