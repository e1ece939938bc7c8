//! A RoCE requester and responder over plain UDP sockets, for namespace labs: the
//! kernel builds IP and UDP, the payload is the BTH (+ AETH in a response) and a valid
//! ICRC (the header the kernel writes for an unconnected socket with DF: ID 0).
//!
//! - [`Responder`]: bound to UDP 4791 in its namespace, it answers each RC request with
//!   an ACK to the requester's QP naming the request's PSN, held for a fixed time
//!   measured against the monotonic clock from the moment it received the request (a
//!   separate thread holds the answers in order while requests keep arriving). It acts
//!   as an RC responder does on sequence errors: a request ahead of the expected PSN is
//!   NAKed once (PSN sequence error, naming the expected PSN) and dropped, as are those
//!   after it until the expected one comes; a duplicate is ACKed again. It can play the
//!   lossy fabric too: the first copy of each PSN in [`ResponderConfig::lose`] is
//!   dropped unseen.
//! - [`Requester`]: sends RC SEND ONLY requests with AckReq from a fixed UDP source
//!   port, at a steady pace ([`Requester::steady`]) or following a [`ResendPlan`]
//!   (go-backs after silence, the ACK timeout, and after a NAK), and counts exactly
//!   what it resent and why.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use roce_common::wire::DEFAULT_ROCE_PORT;
use roce_testkit::frame::{self, opcode, Eth, RoceMsg, L3};
use roce_testkit::{netns, sock};

/// PSNs are 24 bits; a PSN less than half the space ahead is ahead, otherwise behind.
pub const PSN_MASK: u32 = 0xFF_FFFF;
const PSN_HALF: u32 = 0x80_0000;
/// AETH syndromes: ACK with the credit field all ones, NAK PSN sequence error.
pub const SYNDROME_ACK: u8 = 0x1F;
pub const SYNDROME_NAK_PSN_SEQ_ERR: u8 = 0x60;
/// IP TOS of the requests and responses: DSCP 26, ECT(0), as RoCE traffic carries.
const ROCE_TOS: i32 = 106;
/// How often blocked threads look at their stop flag.
const POLL: Duration = Duration::from_millis(20);
/// The last stretch before a deadline is spun (yielding) instead of slept: a sleep can
/// wake late by the timer slack and the scheduler's latency.
const SPIN_BEFORE_DEADLINE: Duration = Duration::from_micros(400);

/// The transport header fields a peer looks at, from a received UDP payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
    /// The AETH syndrome of an ACKNOWLEDGE, `None` for other opcodes.
    pub syndrome: Option<u8>,
}

fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

impl Bth {
    /// Decodes the BTH (and an ACKNOWLEDGE's AETH) at the start of `payload`; `None`
    /// when it is too short to hold them and the ICRC.
    pub fn decode(payload: &[u8]) -> Option<Bth> {
        const BTH: usize = 12;
        const ICRC: usize = 4;
        if payload.len() < BTH + ICRC {
            return None;
        }
        let opcode = payload[0];
        let syndrome = if opcode == opcode::RC_ACKNOWLEDGE {
            if payload.len() < BTH + 4 + ICRC {
                return None;
            }
            Some(payload[BTH])
        } else {
            None
        };
        Some(Bth {
            opcode,
            dest_qp: be24(&payload[5..8]),
            ack_req: payload[8] & 0x80 != 0,
            psn: be24(&payload[9..12]),
            syndrome,
        })
    }

    /// An RC request (what a responder answers): SEND, WRITE, READ, atomics.
    pub fn is_rc_request(&self) -> bool {
        matches!(self.opcode, 0x00..=0x0C | 0x13 | 0x14 | 0x16 | 0x17)
    }

    /// A NAK (syndrome class 011) or an RNR NAK (001).
    pub fn is_nak(&self) -> bool {
        matches!(self.syndrome.map(|s| s >> 5), Some(1) | Some(3))
    }
}

/// The UDP payload (BTH .. ICRC) of `msg` from `src:sport` to `dst:4791`, with the
/// ICRC of the header the kernel will write (IPv4: ID 0, DF; TOS, TTL and the
/// checksums are masked).
pub fn udp_payload(src: IpAddr, dst: IpAddr, sport: u16, msg: &RoceMsg) -> Result<Vec<u8>> {
    let l3 = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => L3::v4(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => L3::v6(s, d),
        _ => bail!("{src} and {dst} are of different families"),
    };
    let eth = Eth::default();
    let f = frame::roce_frame(&eth, &l3, sport, msg);
    Ok(f[frame::bth_offset(&eth, &l3)..].to_vec())
}

/// The length of the Ethernet frame (no FCS, untagged) that carries `udp_payload`
/// bytes of RoCE between `src` and `dst`: what the agent counts as a packet's bytes.
pub fn frame_len(src: IpAddr, udp_payload: usize) -> u64 {
    let ip = if src.is_ipv4() { 20 } else { 40 };
    (14 + ip + 8 + udp_payload) as u64
}

/// A UDP socket bound to `addr` in namespace `ns`, sending with DF (so the kernel
/// writes IPv4 ID 0, which the ICRC covers) and TOS 106.
fn roce_socket(ns: &str, addr: SocketAddr) -> Result<UdpSocket> {
    netns::in_namespace(ns, move || {
        let s = UdpSocket::bind(addr).with_context(|| format!("binding UDP {addr}"))?;
        let (level, name, tos_level, tos_name) = if addr.is_ipv4() {
            (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IPPROTO_IP,
                libc::IP_TOS,
            )
        } else {
            (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPPROTO_IPV6,
                libc::IPV6_TCLASS,
            )
        };
        let pmtu = if addr.is_ipv4() {
            libc::IP_PMTUDISC_DO
        } else {
            libc::IPV6_PMTUDISC_DO
        };
        sock::set_int_option(&s, level, name, pmtu).context("setting PMTU discovery")?;
        sock::set_int_option(&s, tos_level, tos_name, ROCE_TOS).context("setting the TOS")?;
        sock::set_int_option(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20)
            .context("setting SO_RCVBUF")?;
        s.set_read_timeout(Some(POLL))
            .context("setting a read timeout")?;
        Ok(s)
    })
    .with_context(|| format!("in namespace {ns}"))
}

/// Sleeps, then spins (yielding), until `deadline`: the caller resumes within
/// microseconds of it, not a timer slack late.
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_BEFORE_DEADLINE {
            std::thread::sleep(left - SPIN_BEFORE_DEADLINE);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Timer slack of the calling thread: 1 µs instead of 50 µs, so its sleeps end when
/// asked and the spin before a deadline stays short.
fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a value and affects the calling thread only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
}

// ---------------------------------------------------------------------------------
// Responder

/// How a [`Responder`] answers.
#[derive(Clone, Debug)]
pub struct ResponderConfig {
    /// The requester's QP: the destination QP of the ACKs and NAKs.
    pub requester_qp: u32,
    /// How long each response is held after its request arrived (0: answered at once,
    /// by the receiving thread).
    pub hold: Duration,
    /// The UDP source port of the responses.
    pub sport: u16,
    /// PSNs whose first copy the responder drops unseen (a loss in the fabric).
    pub lose: Vec<u32>,
}

/// What a responder did, and how precisely it held its responses.
#[derive(Clone, Debug, Default)]
pub struct ResponderReport {
    pub requests: u64,
    pub acks: u64,
    pub naks: u64,
    /// Requests dropped: lost on purpose, or out of sequence after a NAK.
    pub dropped: u64,
    /// Time from receiving a request to sending its response, µs: min, median, max.
    pub held_us: (f64, f64, f64),
}

/// A response waiting for its deadline.
struct Held {
    due: Instant,
    received: Instant,
    to: SocketAddr,
    payload: Vec<u8>,
}

/// The responder's counters, shared by its two threads and the test.
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    acks: AtomicU64,
    naks: AtomicU64,
    dropped: AtomicU64,
}

/// An RC responder on UDP 4791 in a namespace; see the module documentation. Stops
/// (and joins its threads) when dropped.
pub struct Responder {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    receiver: Option<JoinHandle<Result<Vec<u64>>>>,
    sender: Option<JoinHandle<Result<Vec<u64>>>>,
}

/// What the receiving thread keeps: the expected PSN, the PSN it last NAKed.
struct Sequence {
    expected: Option<u32>,
    naked: Option<u32>,
    lose: HashSet<u32>,
    msn: u32,
}

/// What to do with one request.
enum Answer {
    Ack(u32),
    Nak(u32),
    Drop,
}

impl Sequence {
    fn answer(&mut self, psn: u32) -> Answer {
        if self.lose.remove(&psn) {
            return Answer::Drop;
        }
        let Some(expected) = self.expected else {
            self.expected = Some((psn + 1) & PSN_MASK);
            return Answer::Ack(psn);
        };
        let ahead = psn.wrapping_sub(expected) & PSN_MASK;
        if ahead == 0 {
            self.expected = Some((psn + 1) & PSN_MASK);
            self.naked = None;
            Answer::Ack(psn)
        } else if ahead < PSN_HALF {
            // Out of sequence: one NAK names the PSN expected; the rest are dropped
            // until it comes.
            if self.naked == Some(expected) {
                Answer::Drop
            } else {
                self.naked = Some(expected);
                Answer::Nak(expected)
            }
        } else {
            // A duplicate: acknowledged again.
            Answer::Ack(psn)
        }
    }
}

impl Responder {
    /// Binds UDP `local`:4791 in namespace `ns` and answers from `local`:`config.sport`.
    pub fn start(ns: &str, local: IpAddr, config: ResponderConfig) -> Result<Responder> {
        let rx = roce_socket(ns, SocketAddr::new(local, DEFAULT_ROCE_PORT))?;
        let tx = roce_socket(ns, SocketAddr::new(local, config.sport))?;
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let (queue, held) = mpsc::channel::<Held>();
        let tx_for_sender = tx.try_clone().context("cloning the responder's socket")?;
        let sender = std::thread::Builder::new()
            .name("roce-responder-tx".into())
            .spawn(move || send_held(&tx_for_sender, held))
            .context("starting the responder's sending thread")?;
        let receiver = {
            let (stop, tally) = (Arc::clone(&stop), Arc::clone(&tally));
            std::thread::Builder::new()
                .name("roce-responder-rx".into())
                .spawn(move || receive(&rx, &tx, local, &config, &stop, &tally, queue))
                .context("starting the responder's receiving thread")?
        };
        Ok(Responder {
            stop,
            tally,
            receiver: Some(receiver),
            sender: Some(sender),
        })
    }

    /// ACKs sent so far.
    pub fn acks(&self) -> u64 {
        self.tally.acks.load(Ordering::Relaxed)
    }

    /// Responses (ACKs and NAKs) sent so far.
    pub fn responses(&self) -> u64 {
        self.tally.acks.load(Ordering::Relaxed) + self.tally.naks.load(Ordering::Relaxed)
    }

    /// Requests received so far (dropped ones included).
    pub fn requests(&self) -> u64 {
        self.tally.requests.load(Ordering::Relaxed)
    }

    /// Stops, sends what is still held, and reports.
    pub fn stop(mut self) -> Result<ResponderReport> {
        self.stop.store(true, Ordering::Relaxed);
        let mut held = Vec::new();
        for h in [self.receiver.take(), self.sender.take()]
            .into_iter()
            .flatten()
        {
            let part = h
                .join()
                .map_err(|_| anyhow!("a responder thread panicked"))??;
            held.extend(part);
        }
        held.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        let held_us = match (held.first(), held.get(held.len() / 2), held.last()) {
            (Some(&lo), Some(&mid), Some(&hi)) => (us(lo), us(mid), us(hi)),
            _ => (0.0, 0.0, 0.0),
        };
        let t = &self.tally;
        Ok(ResponderReport {
            requests: t.requests.load(Ordering::Relaxed),
            acks: t.acks.load(Ordering::Relaxed),
            naks: t.naks.load(Ordering::Relaxed),
            dropped: t.dropped.load(Ordering::Relaxed),
            held_us,
        })
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in [self.receiver.take(), self.sender.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
    }
}

/// The receiving thread: answers at once when nothing is held, else queues the answer
/// for the sending thread. Returns the held times (ns) of the answers it sent itself.
fn receive(
    rx: &UdpSocket,
    tx: &UdpSocket,
    local: IpAddr,
    config: &ResponderConfig,
    stop: &AtomicBool,
    tally: &Tally,
    queue: Sender<Held>,
) -> Result<Vec<u64>> {
    let mut seq = Sequence {
        expected: None,
        naked: None,
        lose: config.lose.iter().copied().collect(),
        msn: 0,
    };
    let mut held = Vec::new();
    let mut buf = [0u8; 9000];
    while !stop.load(Ordering::Relaxed) {
        let (n, from) = match rx.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("responder: receiving"),
        };
        let received = Instant::now();
        let Some(bth) = Bth::decode(&buf[..n]) else {
            continue;
        };
        if !bth.is_rc_request() {
            continue;
        }
        tally.requests.fetch_add(1, Ordering::Relaxed);
        let (psn, syndrome) = match seq.answer(bth.psn) {
            Answer::Drop => {
                tally.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Answer::Ack(psn) => {
                seq.msn = (seq.msn + 1) & PSN_MASK;
                tally.acks.fetch_add(1, Ordering::Relaxed);
                (psn, SYNDROME_ACK)
            }
            Answer::Nak(psn) => {
                tally.naks.fetch_add(1, Ordering::Relaxed);
                (psn, SYNDROME_NAK_PSN_SEQ_ERR)
            }
        };
        let mut msg = RoceMsg::ack(config.requester_qp, psn, syndrome);
        msg.msn = seq.msn;
        // Responses go to the requester's RoCE port, whatever its source port was.
        let to = SocketAddr::new(from.ip(), DEFAULT_ROCE_PORT);
        let payload = udp_payload(local, to.ip(), config.sport, &msg)?;
        if config.hold.is_zero() {
            tx.send_to(&payload, to)
                .with_context(|| format!("responder: answering {to}"))?;
            held.push(received.elapsed().as_nanos() as u64);
        } else {
            let item = Held {
                due: received + config.hold,
                received,
                to,
                payload,
            };
            if queue.send(item).is_err() {
                bail!("responder: the sending thread is gone");
            }
        }
    }
    Ok(held)
}

/// The sending thread: sends each held response, in order, at its deadline. Ends when
/// the receiving thread has ended and the queue is empty. Returns the held times (ns).
fn send_held(tx: &UdpSocket, queue: Receiver<Held>) -> Result<Vec<u64>> {
    tight_timer_slack();
    let mut held = Vec::new();
    loop {
        let item = match queue.recv_timeout(POLL) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return Ok(held),
        };
        wait_until(item.due);
        tx.send_to(&item.payload, item.to)
            .with_context(|| format!("responder: answering {}", item.to))?;
        held.push(item.received.elapsed().as_nanos() as u64);
    }
}

// ---------------------------------------------------------------------------------
// Requester

/// The requester's queue pair and traffic.
#[derive(Clone, Debug)]
pub struct RequesterConfig {
    /// Its own QP (the responses' destination QP).
    pub requester_qp: u32,
    /// The responder's QP (the requests' destination QP).
    pub responder_qp: u32,
    /// The fixed UDP source port of the requests.
    pub sport: u16,
    /// SEND payload bytes.
    pub payload_len: usize,
}

/// One round of a [`ResendPlan`].
#[derive(Clone, Debug)]
pub enum Round {
    /// `new` new requests, then `silence` with nothing sent (the ACK timeout), then a
    /// go-back: the last `back` requests again.
    AfterSilence {
        new: u32,
        silence: Duration,
        back: u32,
    },
    /// `new` new requests, of which the responder loses the one at offset `lost` (pass
    /// [`ResendPlan::lost_psns`] to [`ResponderConfig::lose`]); the requester waits for
    /// the responder's NAK and goes back to the PSN it names, resending from there to
    /// its last request. `lost` must leave a request after it (that one draws the NAK).
    AfterNak { new: u32, lost: u32 },
}

/// Requests with go-backs: `rounds` in turn from `first_psn`, then `tail` new
/// requests; one request every `pace`.
#[derive(Clone, Debug)]
pub struct ResendPlan {
    pub first_psn: u32,
    pub rounds: Vec<Round>,
    pub tail: u32,
    pub pace: Duration,
}

impl ResendPlan {
    /// The PSNs the responder must lose for the plan's NAK rounds.
    pub fn lost_psns(&self) -> Vec<u32> {
        let mut next = self.first_psn;
        let mut out = Vec::new();
        for r in &self.rounds {
            match *r {
                Round::AfterSilence { new, .. } => next = next.wrapping_add(new) & PSN_MASK,
                Round::AfterNak { new, lost } => {
                    out.push(next.wrapping_add(lost) & PSN_MASK);
                    next = next.wrapping_add(new) & PSN_MASK;
                }
            }
        }
        out
    }
}

/// What a requester sent, counted as it went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Requests sent, resends included.
    pub sent: u64,
    /// Requests whose PSN was at or before the highest one sent before them.
    pub resent: u64,
    /// Go-backs after silence (the ACK timeout) and after a NAK.
    pub go_backs_after_silence: u64,
    pub go_backs_after_nak: u64,
    /// NAKs the requester received and acted on.
    pub naks_acted_on: u64,
    /// The PSN the next new request would carry.
    pub next_psn: u32,
}

/// An RC requester over UDP in a namespace; see the module documentation. Its
/// responses are read by a background thread (stopped when dropped) into a queue.
pub struct Requester {
    config: RequesterConfig,
    tx: UdpSocket,
    local: IpAddr,
    peer: SocketAddr,
    highest: Option<u32>,
    report: SendReport,
    responses: Receiver<Bth>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl Requester {
    /// Opens the requester in namespace `ns` at `local`, towards a responder at
    /// `responder`:4791. It receives its responses on `local`:4791.
    pub fn open(
        ns: &str,
        local: IpAddr,
        responder: IpAddr,
        config: RequesterConfig,
    ) -> Result<Requester> {
        let tx = roce_socket(ns, SocketAddr::new(local, config.sport))?;
        let rx = roce_socket(ns, SocketAddr::new(local, DEFAULT_ROCE_PORT))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (out, responses) = mpsc::channel();
        let reader = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("roce-requester-rx".into())
                .spawn(move || read_responses(&rx, &stop, out))
                .context("starting the requester's reading thread")?
        };
        Ok(Requester {
            config,
            tx,
            local,
            peer: SocketAddr::new(responder, DEFAULT_ROCE_PORT),
            highest: None,
            report: SendReport::default(),
            responses,
            stop,
            reader: Some(reader),
        })
    }

    /// The frame length of one request, as the agent counts its bytes.
    pub fn request_frame_len(&self) -> Result<u64> {
        let msg = self.request(0);
        let payload = udp_payload(self.local, self.peer.ip(), self.config.sport, &msg)?;
        Ok(frame_len(self.local, payload.len()))
    }

    /// What was sent so far.
    pub fn report(&self) -> SendReport {
        self.report
    }

    fn request(&self, psn: u32) -> RoceMsg {
        RoceMsg::send_only(self.config.responder_qp, psn, self.config.payload_len)
    }

    /// Sends one request with `psn`, counting it as resent when it is at or before the
    /// highest PSN sent so far.
    pub fn send(&mut self, psn: u32) -> Result<()> {
        let psn = psn & PSN_MASK;
        let payload = udp_payload(
            self.local,
            self.peer.ip(),
            self.config.sport,
            &self.request(psn),
        )?;
        self.tx
            .send_to(&payload, self.peer)
            .with_context(|| format!("requester: sending PSN {psn:#x} to {}", self.peer))?;
        self.report.sent += 1;
        match self.highest {
            Some(h) if h.wrapping_sub(psn) & PSN_MASK < PSN_HALF => self.report.resent += 1,
            _ => self.highest = Some(psn),
        }
        self.report.next_psn = self.highest.map_or(psn, |h| (h + 1) & PSN_MASK);
        Ok(())
    }

    /// Sends `count` new requests from `first_psn` on, one every `pace` (on a fixed
    /// schedule from the first, so the pace does not drift). Sleeps between them: the
    /// pace need not be precise, and a spinning requester would take the CPU the
    /// responder's precise holds need.
    pub fn steady(&mut self, first_psn: u32, count: u32, pace: Duration) -> Result<()> {
        let start = Instant::now();
        for i in 0..count {
            let due = start + pace * i;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            self.send(first_psn.wrapping_add(i))?;
        }
        Ok(())
    }

    /// Resends from `from` to the highest PSN sent, one every `pace`.
    fn go_back(&mut self, from: u32, pace: Duration) -> Result<()> {
        let Some(highest) = self.highest else {
            bail!("a go-back before any request");
        };
        let n = highest.wrapping_sub(from) & PSN_MASK;
        if n >= PSN_HALF {
            bail!("a go-back to {from:#x}, ahead of the highest PSN sent {highest:#x}");
        }
        self.steady(from, n + 1, pace)
    }

    /// Waits up to `timeout` for a NAK (or RNR NAK) to the requester's QP; ACKs
    /// before it are passed over.
    pub fn wait_for_nak(&self, timeout: Duration) -> Result<Bth> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.responses.recv_timeout(left) {
                Ok(b) if b.is_nak() && b.dest_qp == self.config.requester_qp => return Ok(b),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => bail!("no NAK within {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => bail!("the requester's reader ended"),
            }
        }
    }

    /// Runs `plan` and returns everything sent, counted (this requester's earlier
    /// requests included).
    pub fn run_plan(&mut self, plan: &ResendPlan) -> Result<SendReport> {
        let mut next = plan.first_psn & PSN_MASK;
        for (i, round) in plan.rounds.iter().enumerate() {
            match *round {
                Round::AfterSilence { new, silence, back } => {
                    if back == 0 || new == 0 {
                        bail!("round {i}: a go-back needs requests and goes back at least one");
                    }
                    self.steady(next, new, plan.pace)?;
                    next = next.wrapping_add(new) & PSN_MASK;
                    std::thread::sleep(silence);
                    self.go_back(next.wrapping_sub(back) & PSN_MASK, plan.pace)?;
                    self.report.go_backs_after_silence += 1;
                }
                Round::AfterNak { new, lost } => {
                    if lost + 1 >= new {
                        bail!("round {i}: the lost request needs one after it to draw the NAK");
                    }
                    self.steady(next, new, plan.pace)?;
                    let nak = self
                        .wait_for_nak(Duration::from_secs(3))
                        .with_context(|| format!("round {i}"))?;
                    let want = next.wrapping_add(lost) & PSN_MASK;
                    if nak.psn != want {
                        bail!(
                            "round {i}: the responder NAKed PSN {:#x}, not the lost {want:#x}",
                            nak.psn
                        );
                    }
                    self.report.naks_acted_on += 1;
                    next = next.wrapping_add(new) & PSN_MASK;
                    self.go_back(nak.psn, plan.pace)?;
                    self.report.go_backs_after_nak += 1;
                }
            }
        }
        self.steady(next, plan.tail, plan.pace)?;
        Ok(self.report)
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

/// The requester's reading thread: every response to arrive, decoded, into `out`.
fn read_responses(rx: &UdpSocket, stop: &AtomicBool, out: Sender<Bth>) {
    let mut buf = [0u8; 9000];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, _)) = rx.recv_from(&mut buf) else {
            continue;
        };
        if let Some(b) = Bth::decode(&buf[..n]) {
            if out.send(b).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn a_request_payload_decodes_to_what_was_encoded_and_its_icrc_holds() {
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let msg = RoceMsg::send_only(0x11, 0xFF_FFFE, 64);
        let p = udp_payload(a.into(), b.into(), 0xC0DE, &msg).expect("payload");
        assert_eq!(p.len(), 12 + 64 + 4);
        let bth = Bth::decode(&p).expect("decodes");
        assert_eq!(
            bth,
            Bth {
                opcode: 0x04,
                dest_qp: 0x11,
                ack_req: true,
                psn: 0xFF_FFFE,
                syndrome: None
            }
        );
        assert!(bth.is_rc_request());
        // The frame the kernel writes around it: ID 0, DF, any TOS and TTL.
        let mut h = frame::Ipv4Hdr::new(a, b);
        h.ttl = 1;
        h.tos = 106;
        let f = frame::udp_frame(&Eth::default(), &L3::V4(h), 0xC0DE, 4791, &p);
        assert!(frame::icrc_ok(&f, 14, 34));
        assert_eq!(frame_len(a.into(), p.len()), f.len() as u64);
    }

    #[test]
    fn an_ack_and_a_nak_decode_with_their_syndromes() {
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1));
        let ack =
            udp_payload(a.into(), b.into(), 1, &RoceMsg::ack(0x22, 7, SYNDROME_ACK)).expect("ack");
        let nak = udp_payload(
            a.into(),
            b.into(),
            1,
            &RoceMsg::ack(0x22, 7, SYNDROME_NAK_PSN_SEQ_ERR),
        )
        .expect("nak");
        let (ack, nak) = (Bth::decode(&ack), Bth::decode(&nak));
        assert_eq!(
            ack.map(|b| (b.syndrome, b.is_nak())),
            Some((Some(0x1F), false))
        );
        assert_eq!(
            nak.map(|b| (b.syndrome, b.is_nak())),
            Some((Some(0x60), true))
        );
        assert!(!ack.is_some_and(|b| b.is_rc_request()));
        assert_eq!(Bth::decode(&[0u8; 15]), None);
    }

    #[test]
    fn the_responder_naks_once_per_gap_drops_until_the_expected_and_acks_duplicates() {
        let mut s = Sequence {
            expected: None,
            naked: None,
            lose: [0xFF_FFFF].into_iter().collect(),
            msn: 0,
        };
        let mut seen = Vec::new();
        for psn in [0xFF_FFFD, 0xFF_FFFE, 0xFF_FFFF, 0, 1, 0xFF_FFFF, 0, 1, 0, 2] {
            seen.push(match s.answer(psn) {
                Answer::Ack(p) => format!("A{p:x}"),
                Answer::Nak(p) => format!("N{p:x}"),
                Answer::Drop => "-".into(),
            });
        }
        assert_eq!(
            seen,
            ["Afffffd", "Afffffe", "-", "Nffffff", "-", "Affffff", "A0", "A1", "A0", "A2"]
        );
    }

    #[test]
    fn a_plan_names_the_psns_its_nak_rounds_lose() {
        let plan = ResendPlan {
            first_psn: 0xFF_FFF0,
            rounds: vec![
                Round::AfterSilence {
                    new: 10,
                    silence: Duration::ZERO,
                    back: 3,
                },
                Round::AfterNak { new: 10, lost: 4 },
                Round::AfterNak { new: 5, lost: 0 },
            ],
            tail: 1,
            pace: Duration::ZERO,
        };
        assert_eq!(plan.lost_psns(), [0xFF_FFFE, 0x00_0004]);
    }

    #[test]
    fn wait_until_returns_at_the_deadline_not_a_timer_slack_later() {
        tight_timer_slack();
        let mut late = Vec::new();
        for _ in 0..50 {
            let due = Instant::now() + Duration::from_micros(1500);
            wait_until(due);
            late.push(Instant::now().duration_since(due));
        }
        late.sort();
        assert!(
            late[25] < Duration::from_micros(50),
            "median lateness {:?}",
            late[25]
        );
    }
}
