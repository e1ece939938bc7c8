//! The reader of the EVENTS ring buffer: each record the kernel programs wrote
//! (`roce_common::event::EventRecord`, one sampled CE, CNP, NAK, RNR NAK or PSN gap)
//! becomes an [`Event`] published on a broadcast channel, which `GET /events`
//! subscribes to. The reader never waits for a subscriber: a slow one loses the oldest
//! events (the broadcast drops them and the subscriber learns how many), an absent one
//! costs nothing.
//!
//! An event keeps the frame's bytes up to the end of its last transport header
//! (`roce_common::headers`) and `events_payload_bytes` of what follows ([`Keep`]): by
//! default no application data leaves the host. A reload changes it
//! ([`KeepHandle::set`]).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use roce_common::config::RuntimeConfig;
use roce_common::event::EventRecord;
use roce_common::headers::transport_headers_end;
use roce_common::key::FlowKey;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{broadcast, watch};

use crate::config::Settings;
use crate::datapath::loader::{LoadError, Loaded};
use crate::doc::event::{ecn_name, hex, monotonic_to_unix_offset_ns, Event, EventKind};
use crate::doc::{key_addr, Direction, Family};
use crate::telemetry::ring_progress::RingProgress;

/// Events the broadcast holds for a subscriber that reads slower than they come.
pub const EVENTS_CHANNEL_CAPACITY: usize = 4096;

/// How long an interface name is trusted (interfaces come, go and get renamed).
const IFNAME_TTL: Duration = Duration::from_secs(1);

/// Interface index -> name, as the collector resolves them (`netif::name_of`).
pub type Resolver = Arc<dyn Fn(u32) -> Option<String> + Send + Sync>;

/// Why the reader could not start.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("taking the EVENTS ring buffer: {0}")]
    Load(#[from] Box<LoadError>),
    #[error("the events reader must be started inside a tokio runtime")]
    NoRuntime,
    #[error("registering the EVENTS ring buffer with the runtime: {0}")]
    Register(#[source] std::io::Error),
}

/// What of a sampled frame an event keeps: the bytes up to the end of its last
/// transport header, as the classifier reads the frame with these ports, and
/// `payload_bytes` of what follows (never more than the record holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    pub roce_port: u16,
    pub vxlan_port: u16,
    /// `events_payload_bytes`.
    pub payload_bytes: u32,
}

impl Default for Keep {
    /// Headers only, on the default ports.
    fn default() -> Self {
        let cfg = RuntimeConfig::default();
        Keep {
            roce_port: cfg.roce_port,
            vxlan_port: cfg.vxlan_port,
            payload_bytes: 0,
        }
    }
}

impl Keep {
    /// What `settings` ask for: their ports and `events_payload_bytes`.
    pub fn for_settings(settings: &Settings) -> Keep {
        Keep {
            roce_port: settings.runtime.roce_port,
            vxlan_port: settings.runtime.vxlan_port,
            payload_bytes: settings.events_payload_bytes,
        }
    }

    /// The bytes of `packet` (a frame from its Ethernet header, cut at the record's
    /// 128 bytes) that an event keeps.
    pub fn kept<'a>(&self, packet: &'a [u8]) -> &'a [u8] {
        let cfg = RuntimeConfig {
            roce_port: self.roce_port,
            vxlan_port: self.vxlan_port,
            ..RuntimeConfig::default()
        };
        let end = transport_headers_end(packet, &cfg).saturating_add(self.payload_bytes as usize);
        &packet[..end.min(packet.len())]
    }
}

/// Changes what the running reader keeps (a reload's `events_payload_bytes` and ports).
#[derive(Clone, Debug)]
pub struct KeepHandle(Arc<watch::Sender<Keep>>);

impl KeepHandle {
    /// What `settings` ask for, from the next record on.
    pub fn set(&self, settings: &Settings) {
        self.0.send_replace(Keep::for_settings(settings));
    }

    /// What the reader keeps now.
    pub fn get(&self) -> Keep {
        *self.0.borrow()
    }
}

/// A started reader: where its events are published, the ring's positions, and what
/// it keeps of each frame.
pub struct Spawned {
    /// Subscribe to it (`Sender::subscribe`) to receive the events.
    pub sender: broadcast::Sender<Arc<Event>>,
    /// Records written into and read out of the ring (None when its pages could not
    /// be mapped: the events flow all the same).
    pub progress: Option<Arc<RingProgress>>,
    /// What the reader keeps of each frame; a reload sets it.
    pub keep: KeepHandle,
}

/// Takes the EVENTS ring buffer out of `loaded` and starts a task that turns its
/// records into [`Event`]s, each keeping what `keep` says of its frame. Must be called
/// inside a tokio runtime; the task lives as long as the runtime. A ring of a pinned
/// datapath may hold records written while no agent ran: they are read first.
pub fn spawn(loaded: &mut Loaded, resolve: Resolver, keep: Keep) -> Result<Spawned, EventsError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(EventsError::NoRuntime);
    }
    let ring = loaded.take_events().map_err(Box::new)?;
    let progress = match RingProgress::map(ring.as_fd()) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) => {
            tracing::warn!(error = %e, "the EVENTS ring's positions are unavailable: no roce_agent_events_ring_* metrics");
            None
        }
    };
    // tokio 1.54 deprecates AsyncFd::new / with_interest for `register*`, which is
    // unsafe because the fd must stay open and the same while registered.
    // SAFETY: the RingBuf owns its MapData, whose fd stays open and unchanged until the
    // RingBuf (moved into the AsyncFd) is dropped; as_raw_fd always returns it.
    let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| EventsError::Register(e.into_parts().1))?;
    let (tx, _) = broadcast::channel(EVENTS_CHANNEL_CAPACITY);
    let (keep_tx, keep_rx) = watch::channel(keep);
    let reader = Reader {
        names: IfnameCache::new(resolve),
        tx: tx.clone(),
        keep: keep_rx,
        read: 0,
        malformed: 0,
    };
    tokio::spawn(reader.run(ring));
    Ok(Spawned {
        sender: tx,
        progress,
        keep: KeepHandle(Arc::new(keep_tx)),
    })
}

/// The record in the bytes of one ring-buffer item; None when they are too short.
pub fn decode(bytes: &[u8]) -> Option<EventRecord> {
    if bytes.len() < size_of::<EventRecord>() {
        return None;
    }
    // SAFETY: at least size_of::<EventRecord>() bytes; EventRecord is plain integers
    // (any bit pattern is a value), read unaligned.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<EventRecord>()) })
}

/// The event of one record, seen on `ifname`, with what `keep` says of its frame; None
/// for a kind this agent does not know. `unix_offset_ns` is the wall clock minus the
/// monotonic clock (0: `time_unix_ns` unknown).
pub fn event_from_record(
    rec: &EventRecord,
    ifname: String,
    unix_offset_ns: i128,
    keep: &Keep,
) -> Option<Event> {
    let kind = *EventKind::ALL.get(rec.kind as usize)?;
    let key: &FlowKey = &rec.key;
    let tunnelled = key.tunnelled();
    let family = |v6: bool| if v6 { Family::Ipv6 } else { Family::Ipv4 };
    let time_unix_ns = if unix_offset_ns == 0 {
        0
    } else {
        u64::try_from(rec.ts_ns as i128 + unix_offset_ns).unwrap_or(0)
    };
    Some(Event {
        ts_ns: rec.ts_ns,
        ifname,
        direction: Direction::of_key(key),
        kind,
        family: family(key.outer_v6()),
        src: key_addr(&key.src, key.outer_v6()),
        dst: key_addr(&key.dst, key.outer_v6()),
        sport: rec.sport,
        vni: tunnelled.then_some(key.vni),
        inner_family: tunnelled.then(|| family(key.inner_v6())),
        inner_src: tunnelled.then(|| key_addr(&key.inner_src, key.inner_v6())),
        inner_dst: tunnelled.then(|| key_addr(&key.inner_dst, key.inner_v6())),
        dest_qp: key.dest_qp,
        opcode: rec.opcode,
        psn: rec.psn,
        dscp: rec.dscp(),
        ecn: ecn_name(rec.ecn()).to_string(),
        inner_ecn: tunnelled.then(|| ecn_name(rec.inner_ecn()).to_string()),
        sample: rec.sample,
        packet_len: rec.frame_len,
        packet: hex(keep.kept(rec.packet())),
        time_unix_ns,
        rtt_us: (kind == EventKind::RttSpike).then_some(rec.rtt_us),
    })
}

/// The task's state.
struct Reader {
    names: IfnameCache,
    tx: broadcast::Sender<Arc<Event>>,
    /// What an event keeps of its frame (a reload changes it).
    keep: watch::Receiver<Keep>,
    /// Records read, and those that were not events (short, unknown kind).
    read: u64,
    malformed: u64,
}

impl Reader {
    async fn run(mut self, mut ring: AsyncFd<RingBuf<MapData>>) {
        loop {
            let mut guard = match ring.readable_mut().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "waiting on the EVENTS ring buffer failed: no more events");
                    return;
                }
            };
            self.drain(guard.get_inner_mut());
            // Cleared only if no wakeup came in since the guard was taken (tokio
            // compares readiness ticks), so a record committed meanwhile is not missed.
            guard.clear_ready();
        }
    }

    /// Reads every record in the ring now; returns how many.
    fn drain(&mut self, ring: &mut RingBuf<MapData>) -> usize {
        let offset = monotonic_to_unix_offset_ns();
        let keep = *self.keep.borrow_and_update();
        let mut n = 0;
        while let Some(item) = ring.next() {
            n += 1;
            let Some(rec) = decode(&item) else {
                self.malformed += 1;
                continue;
            };
            drop(item);
            let ifname = self.names.name(rec.ifindex());
            match event_from_record(&rec, ifname, offset, &keep) {
                // An error only says that nobody subscribes right now.
                Some(ev) => {
                    let _ = self.tx.send(Arc::new(ev));
                }
                None => self.malformed += 1,
            }
        }
        self.read += n as u64;
        if n > 0 {
            tracing::trace!(
                records = n,
                read = self.read,
                malformed = self.malformed,
                subscribers = self.tx.receiver_count(),
                "events read"
            );
        }
        n
    }
}

/// Interface names by index, each resolved again after `IFNAME_TTL`.
struct IfnameCache {
    resolve: Resolver,
    names: HashMap<u32, (String, Instant)>,
}

impl IfnameCache {
    fn new(resolve: Resolver) -> Self {
        IfnameCache {
            resolve,
            names: HashMap::new(),
        }
    }

    /// The name of `ifindex`, or `if#N` as the flows document writes an unknown one.
    fn name(&mut self, ifindex: u32) -> String {
        let now = Instant::now();
        if let Some((name, at)) = self.names.get(&ifindex) {
            if now.duration_since(*at) < IFNAME_TTL {
                return name.clone();
            }
        }
        let name = (self.resolve)(ifindex).unwrap_or_else(|| format!("if#{ifindex}"));
        self.names.insert(ifindex, (name.clone(), now));
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_common::counters::STAT_NAMES_EVENTS;
    use roce_common::event::{EVENT_CE, EVENT_PACKET_BYTES, EVENT_PSN_GAP};
    use roce_common::key::{addr_v4_mapped, KEY_EGRESS, KEY_INNER_V6, KEY_TUNNELLED};
    use roce_testkit::frame::{roce_frame, Eth, RoceMsg, L3};
    use std::net::Ipv4Addr;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn v4(a: [u8; 4]) -> [u32; 4] {
        addr_v4_mapped(u32::from_ne_bytes(a))
    }

    const PATTERN: &[u8] = b"ROCEPAYLOADPATTERN";

    /// An RC WRITE ONLY of 200 bytes of [`PATTERN`]: 70 bytes of headers (Ethernet,
    /// IPv4, UDP, BTH, RETH), the payload, the ICRC.
    fn write_frame() -> Vec<u8> {
        let l3 = L3::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let msg = RoceMsg::write_only(0x1234, 42, 200).with_payload_pattern(PATTERN);
        roce_frame(&Eth::default(), &l3, 49152, &msg)
    }

    /// A record of `kind` whose packet is the first 128 bytes of [`write_frame`].
    fn record(kind: u8) -> EventRecord {
        let frame = write_frame();
        let mut packet = [0u8; EVENT_PACKET_BYTES];
        packet.copy_from_slice(&frame[..EVENT_PACKET_BYTES]);
        EventRecord {
            ts_ns: 1_000,
            key: FlowKey {
                src: v4([198, 18, 0, 1]),
                dst: v4([198, 18, 0, 2]),
                dest_qp: 0x1234,
                ifindex: 7,
                ..FlowKey::default()
            },
            psn: 42,
            frame_len: frame.len() as u32,
            sample: 10,
            sport: 49152,
            kind,
            opcode: 0x0a,
            outer_tos: (26 << 2) | 3,
            inner_tos: 0,
            captured: EVENT_PACKET_BYTES as u8,
            _pad: 0,
            rtt_us: 0,
            packet,
        }
    }

    #[test]
    fn kinds_are_in_the_kernels_order() {
        for (i, kind) in EventKind::ALL.iter().enumerate() {
            assert_eq!(kind.name(), STAT_NAMES_EVENTS[i].1);
        }
    }

    #[test]
    fn a_plain_ce_record_becomes_the_documented_event() {
        let ev = event_from_record(&record(EVENT_CE), "eth1".into(), 5, &Keep::default()).unwrap();
        let v = serde_json::to_value(&ev).unwrap();
        assert_eq!(v["ts_ns"], 1000);
        assert_eq!(v["time_unix_ns"], 1005);
        assert_eq!(v["ifname"], "eth1");
        assert_eq!(v["direction"], "ingress");
        assert_eq!(v["kind"], "ce");
        assert_eq!(v["family"], "ipv4");
        assert_eq!(v["src"], "198.18.0.1");
        assert_eq!(v["dst"], "198.18.0.2");
        assert_eq!(v["sport"], 49152);
        assert!(v["vni"].is_null() && v["inner_family"].is_null() && v["inner_ecn"].is_null());
        assert_eq!(v["dest_qp"], 0x1234);
        assert_eq!(v["opcode"], 10);
        assert_eq!(v["psn"], 42);
        assert_eq!(v["dscp"], 26);
        assert_eq!(v["ecn"], "ce");
        assert_eq!(v["sample"], 10);
        assert_eq!(v["packet_len"], 42 + 12 + 16 + 200 + 4);
        assert_eq!(v["packet"], hex(&write_frame()[..70]), "the headers only");
    }

    /// Hex of the part of `frame` that `payload_bytes` keeps, on the default ports.
    fn kept(frame: &[u8], payload_bytes: u32) -> Vec<u8> {
        let keep = Keep {
            payload_bytes,
            ..Keep::default()
        };
        keep.kept(frame).to_vec()
    }

    #[test]
    fn an_event_keeps_its_headers_and_the_payload_bytes_asked_for() {
        let frame = write_frame();
        let sample = &frame[..EVENT_PACKET_BYTES];
        assert_eq!(kept(sample, 0), &frame[..70]);
        assert_eq!(kept(sample, 18), &frame[..88]);
        assert_eq!(&kept(sample, 18)[70..], PATTERN);
        // Never more than the record holds.
        assert_eq!(kept(sample, 128), sample);
        // A frame that is not RoCE on these ports: up to its UDP header.
        let other = Keep {
            roce_port: 4792,
            ..Keep::default()
        };
        assert_eq!(other.kept(sample), &frame[..42]);
        assert_eq!(kept(&[], 64), b"");
        // Each record as the keep in force says, from the next on.
        let rec = record(EVENT_CE);
        let ev = |keep: &Keep| event_from_record(&rec, "e".into(), 0, keep).unwrap();
        let more = Keep {
            payload_bytes: 64,
            ..Keep::default()
        };
        assert_eq!(ev(&Keep::default()).packet_bytes().unwrap(), &frame[..70]);
        assert_eq!(ev(&more).packet_bytes().unwrap(), &frame[..128]);
        assert_eq!(ev(&more).packet_len, frame.len() as u32);
    }

    #[test]
    fn keep_follows_the_settings_and_its_handle() {
        let settings = Settings {
            events_payload_bytes: 32,
            runtime: RuntimeConfig {
                roce_port: 4792,
                ..RuntimeConfig::default()
            },
            ..Settings::default()
        };
        let keep = Keep::for_settings(&settings);
        assert_eq!(
            (keep.roce_port, keep.vxlan_port, keep.payload_bytes),
            (4792, 4789, 32)
        );
        assert_eq!(Keep::for_settings(&Settings::default()), Keep::default());
        let (tx, mut rx) = watch::channel(Keep::default());
        let handle = KeepHandle(Arc::new(tx));
        handle.set(&settings);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), keep);
        assert_eq!(handle.get(), keep);
    }

    #[test]
    fn a_tunnelled_egress_record_names_its_inner_layer() {
        let mut rec = record(EVENT_PSN_GAP);
        rec.key.flags = KEY_TUNNELLED | KEY_INNER_V6 | KEY_EGRESS;
        rec.key.vni = 5001;
        rec.key.inner_src = [
            u32::from_ne_bytes([0x20, 0x01, 0x0d, 0xb8]),
            0,
            0,
            1u32.to_be(),
        ];
        rec.inner_tos = 2;
        let ev = event_from_record(&rec, "eth0".into(), 0, &Keep::default()).unwrap();
        assert_eq!(ev.kind, EventKind::PsnGap);
        assert_eq!(ev.direction, Direction::Egress);
        assert_eq!(ev.vni, Some(5001));
        assert_eq!(ev.inner_family, Some(Family::Ipv6));
        assert_eq!(
            ev.inner_src.map(|a| a.to_string()).as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(ev.inner_ecn.as_deref(), Some("ect0"));
        assert_eq!(ev.time_unix_ns, 0);
    }

    #[test]
    fn unknown_kinds_and_short_items_are_no_events() {
        assert!(event_from_record(&record(9), "x".into(), 0, &Keep::default()).is_none());
        assert!(decode(&[0u8; 16]).is_none());
        let rec = record(EVENT_CE);
        // SAFETY: the bytes of a plain-integer struct.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&rec as *const EventRecord).cast::<u8>(),
                size_of::<EventRecord>(),
            )
        };
        assert_eq!(decode(bytes), Some(rec));
    }

    #[test]
    fn interface_names_are_cached_for_a_second_and_unknown_ones_are_numbered() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let mut names = IfnameCache::new(Arc::new(move |i| {
            counted.fetch_add(1, Ordering::Relaxed);
            (i == 7).then(|| "eth1".to_string())
        }));
        assert_eq!(names.name(7), "eth1");
        assert_eq!(names.name(7), "eth1");
        assert_eq!(names.name(9), "if#9");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }
}
