//! The per-priority PFC pause counters of a NIC: mlx5's among its ethtool statistics
//! (read with `sys::ethtool`), else the DCB PFC state's frame counts.

pub use crate::sys::ethtool::{stats, stats_from_text, EthtoolError, EthtoolSocket, Stat};

/// Which way a pause frame went, seen from the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PauseDirection {
    /// Received from the link partner: it asked this port to stop sending.
    Rx,
    /// Sent by this port: its receive buffer for the priority filled up.
    Tx,
}

impl PauseDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseDirection::Rx => "rx",
            PauseDirection::Tx => "tx",
        }
    }
}

/// Per-priority PFC pause counters of one interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PfcCounters {
    pub ifname: String,
    /// `[direction][priority]`: pause frames (None: the source does not count it).
    pub frames: [[Option<u64>; 8]; 2],
    /// `[direction][priority]`: time paused, in microseconds (mlx5 only).
    pub duration_us: [[Option<u64>; 8]; 2],
    /// `[level]` ([`StormLevel`]): the times the port kept sending pauses past its PFC
    /// storm watchdog's warning threshold, and past its timeout, after which it stopped
    /// pausing (mlx5's `tx_pause_storm_{warning,error}_events`).
    pub storm_events: [Option<u64>; 2],
}

/// How far a pause storm went before the NIC's watchdog counted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StormLevel {
    Warning,
    Error,
}

impl StormLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            StormLevel::Warning => "warning",
            StormLevel::Error => "error",
        }
    }
}

impl PfcCounters {
    /// Whether any counter was found.
    pub fn is_empty(&self) -> bool {
        self.frames
            .iter()
            .chain(&self.duration_us)
            .flatten()
            .chain(&self.storm_events)
            .all(Option::is_none)
    }
}

/// The mlx5 per-priority pause statistics among `stats`: `rx_prio{p}_pause`,
/// `tx_prio{p}_pause` (frames) and `rx_prio{p}_pause_duration`,
/// `tx_prio{p}_pause_duration` (microseconds), and the storm watchdog's
/// `tx_pause_storm_warning_events`, `tx_pause_storm_error_events`. Other names are
/// ignored.
pub fn pfc_from_stats(ifname: &str, stats: &[Stat]) -> PfcCounters {
    let mut pfc = PfcCounters {
        ifname: ifname.to_string(),
        ..PfcCounters::default()
    };
    for s in stats {
        let storm = match s.name.as_str() {
            "tx_pause_storm_warning_events" => Some(StormLevel::Warning),
            "tx_pause_storm_error_events" => Some(StormLevel::Error),
            _ => None,
        };
        if let Some(level) = storm {
            pfc.storm_events[level as usize] = Some(s.value);
            continue;
        }
        let Some((direction, rest)) = s
            .name
            .strip_prefix("rx_prio")
            .map(|r| (PauseDirection::Rx, r))
            .or_else(|| {
                s.name
                    .strip_prefix("tx_prio")
                    .map(|r| (PauseDirection::Tx, r))
            })
        else {
            continue;
        };
        let Some((digit, kind)) = rest.split_at_checked(1) else {
            continue;
        };
        let Some(priority) = digit.parse::<usize>().ok().filter(|p| *p < 8) else {
            continue;
        };
        let table = match kind {
            "_pause" => &mut pfc.frames,
            "_pause_duration" => &mut pfc.duration_us,
            _ => continue,
        };
        table[direction as usize][priority] = Some(s.value);
    }
    pfc
}

/// PFC pause frames from a DCB PFC reply (`ieee_pfc`): `requests` are the frames the
/// port sent (tx), `indications` those it received (rx). No durations.
pub fn pfc_from_dcb(ifname: &str, pfc: &crate::audit::dcb::IeeePfc) -> PfcCounters {
    PfcCounters {
        ifname: ifname.to_string(),
        frames: [pfc.indications.map(Some), pfc.requests.map(Some)],
        duration_us: [[None; 8]; 2],
        storm_events: [None; 2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx5_pause_names_map_to_direction_and_priority() {
        let stats: Vec<Stat> = [
            ("rx_prio3_pause", 7),
            ("tx_prio3_pause", 11),
            ("rx_prio3_pause_duration", 1500),
            ("tx_prio0_pause_duration", 20),
            ("rx_prio3_pause_transition", 99),
            ("tx_prio8_pause", 5),
            ("rx_prio_pause", 5),
            ("rx_pause_ctrl_phy", 5),
            ("tx_pause_storm_warning_events", 1),
            ("rx_prio7_packets", 1),
        ]
        .iter()
        .map(|(n, v)| Stat {
            name: n.to_string(),
            value: *v,
        })
        .collect();
        let pfc = pfc_from_stats("eth1", &stats);
        let (rx, tx) = (PauseDirection::Rx as usize, PauseDirection::Tx as usize);
        assert_eq!(pfc.frames[rx][3], Some(7));
        assert_eq!(pfc.frames[tx][3], Some(11));
        assert_eq!(pfc.duration_us[rx][3], Some(1500));
        assert_eq!(pfc.duration_us[tx][0], Some(20));
        let found = pfc
            .frames
            .iter()
            .chain(&pfc.duration_us)
            .flatten()
            .flatten()
            .count();
        assert_eq!(found, 4, "{pfc:?}");
        assert_eq!(
            pfc.storm_events,
            [Some(1), None],
            "the watchdog's warnings, no error count"
        );
        assert!(!pfc.is_empty());
        assert!(pfc_from_stats("veth0", &[]).is_empty());
    }

    #[test]
    fn dcb_requests_are_sent_frames_and_indications_received_ones() {
        let mut ieee = crate::audit::dcb::IeeePfc::default();
        ieee.requests[3] = 4;
        ieee.indications[3] = 9;
        let pfc = pfc_from_dcb("eth1", &ieee);
        assert_eq!(pfc.frames[PauseDirection::Tx as usize][3], Some(4));
        assert_eq!(pfc.frames[PauseDirection::Rx as usize][3], Some(9));
        assert_eq!(pfc.duration_us, [[None; 8]; 2]);
    }
}
