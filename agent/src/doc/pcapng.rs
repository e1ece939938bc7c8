//! Sampled events as a pcapng file: one interface block per interface (nanosecond
//! timestamps), one enhanced packet block per event with the bytes the event kept (its
//! headers, and payload only as `events_payload_bytes` allows) as the captured length,
//! the frame's real length as the original length (Wireshark: "captured N of M
//! bytes"), and a comment naming the kind. Wireshark and tshark open it and decode the
//! frames as RoCE.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

use crate::doc::event::Event;

/// Most bytes an event holds of a frame (the events' `packet`).
pub const SNAPLEN: u32 = 128;

/// Why an event could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PcapngError {
    #[error("writing pcapng: {0}")]
    Write(#[from] pcap_file::PcapError),
    #[error("event of {ifname} at {ts_ns} ns: its packet is not hex")]
    NotHex { ifname: String, ts_ns: u64 },
}

/// Writes events as they come.
pub struct EventPcapng<W: Write> {
    writer: PcapNgWriter<W>,
    interfaces: HashMap<String, u32>,
}

impl<W: Write> EventPcapng<W> {
    /// Writes the section header.
    pub fn new(out: W) -> Result<EventPcapng<W>, PcapngError> {
        Ok(EventPcapng {
            writer: PcapNgWriter::new(out)?,
            interfaces: HashMap::new(),
        })
    }

    /// Writes `event`'s frame, after its interface's block the first time.
    pub fn write(&mut self, event: &Event) -> Result<(), PcapngError> {
        let data = event.packet_bytes().ok_or_else(|| PcapngError::NotHex {
            ifname: event.ifname.clone(),
            ts_ns: event.ts_ns,
        })?;
        let id = match self.interfaces.get(&event.ifname) {
            Some(id) => *id,
            None => {
                let id = self.interfaces.len() as u32;
                self.writer.write_pcapng_block(InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: SNAPLEN,
                    options: vec![
                        InterfaceDescriptionOption::IfName(Cow::Owned(event.ifname.clone())),
                        // pcap-file writes raw nanoseconds: say so, or readers take
                        // them for microseconds.
                        InterfaceDescriptionOption::IfTsResol(9),
                    ],
                })?;
                self.interfaces.insert(event.ifname.clone(), id);
                id
            }
        };
        let comment = format!(
            "roce-agent event: {} ({}, 1 in {} sampled)",
            event.kind.name(),
            match event.direction {
                crate::doc::Direction::Ingress => "ingress",
                crate::doc::Direction::Egress => "egress",
            },
            event.sample
        );
        self.writer.write_pcapng_block(EnhancedPacketBlock {
            interface_id: id,
            timestamp: Duration::from_nanos(event.time_unix_ns),
            original_len: event.packet_len.max(data.len() as u32),
            data: Cow::Owned(data),
            options: vec![EnhancedPacketOption::Comment(Cow::Owned(comment))],
        })?;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.writer.into_inner()
    }
}
