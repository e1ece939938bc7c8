//! The NIC's PFC storm watchdog (`pfc_watchdog`): a NIC whose receive pipeline stalls
//! keeps pausing its switch, and the pause spreads through the fabric (a pause storm).
//! Microsoft's RoCEv2 NICs (SIGCOMM 2016) stop pausing after 100 ms of a stalled
//! pipeline; mlx5 has the same watchdog as the ethtool tunable `pfc-prevention-tout`
//! (ms; 0 off, "auto" 100 ms), which its firmware leaves at 8 s. Read with
//! ETHTOOL_GTUNABLE (`sys::ethtool`), or in a fixture tree (`--sysfs-root` other than
//! /sys) from `class/net/IF/ethtool-tunables`, what `ethtool --get-tunable IF
//! pfc-prevention-tout` prints.

use std::path::Path;

use super::{finding, Finding, Severity};
use crate::sys::ethtool::{fixture_file, EthtoolError, EthtoolSocket};

/// A watchdog slower than this leaves a storm the time to spread.
pub const MAX_TOUT_MS: u16 = 100;

/// The watchdog's timeout of `ifname`, ms; None where the NIC has none (veth, vxlan)
/// or it could not be read (said at debug level).
pub fn read(sysfs_root: &Path, socket: Option<&EthtoolSocket>, ifname: &str) -> Option<u16> {
    if let Some(path) = fixture_file(sysfs_root, ifname, "ethtool-tunables") {
        return parse(&std::fs::read_to_string(path).ok()?);
    }
    match socket?.pfc_prevention_tout(ifname) {
        Ok(ms) => Some(ms),
        Err(EthtoolError::Unsupported { .. } | EthtoolError::NoDevice { .. }) => None,
        Err(e) => {
            tracing::debug!(error = %e, "the PFC watchdog tunable not read");
            None
        }
    }
}

/// `pfc-prevention-tout: 8000` (ethtool's words) as 8000.
fn parse(text: &str) -> Option<u16> {
    text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        (name.trim() == "pfc-prevention-tout")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The finding for `ifname`'s watchdog at `tout_ms`.
pub fn audit(ifname: &str, tout_ms: u16) -> Finding {
    let fix = format!("ethtool --set-tunable {ifname} pfc-prevention-tout {MAX_TOUT_MS}");
    let expected =
        format!("a PFC storm watchdog that stops a stalled port's pauses within {MAX_TOUT_MS} ms");
    match tout_ms {
        0 => finding(
            "pfc_watchdog",
            Some(ifname),
            Severity::Warning,
            "the PFC storm watchdog is off (pfc-prevention-tout 0): a stalled receive pipeline pauses the switch without end",
            expected,
            fix,
        ),
        ms if ms > MAX_TOUT_MS => finding(
            "pfc_watchdog",
            Some(ifname),
            Severity::Warning,
            format!(
                "pfc-prevention-tout {ms} ms{}: a stalled receive pipeline holds its priority paused that long before the NIC stops",
                if ms == 8000 { " (the firmware's default)" } else { "" }
            ),
            expected,
            fix,
        ),
        ms => finding(
            "pfc_watchdog",
            Some(ifname),
            Severity::Info,
            format!("pfc-prevention-tout {ms} ms"),
            expected,
            "none needed",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_left_at_8_s_or_off_is_a_warning_and_100_ms_is_not() {
        let f = audit("eth1", 8000);
        assert_eq!(
            (f.check.as_str(), f.severity),
            ("pfc_watchdog", Severity::Warning)
        );
        assert!(
            f.found
                .starts_with("pfc-prevention-tout 8000 ms (the firmware's default)"),
            "{}",
            f.found
        );
        assert_eq!(f.fix, "ethtool --set-tunable eth1 pfc-prevention-tout 100");
        assert_eq!(audit("eth1", 0).severity, Severity::Warning);
        assert_eq!(audit("eth1", 101).severity, Severity::Warning);
        assert_eq!(audit("eth1", 100).severity, Severity::Info);
        assert_eq!(parse("pfc-prevention-tout: 8000\n"), Some(8000));
        assert_eq!(parse("PFC prevention timeout\n"), None);
    }
}
