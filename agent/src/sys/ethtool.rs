//! The SIOCETHTOOL ioctl: NIC statistics as `ethtool -S` reads them (there is no
//! netlink equivalent for driver statistics), and the PFC storm watchdog's tunable as
//! `ethtool --get-tunable IF pfc-prevention-tout` reads it. `telemetry::ethtool` finds
//! the pause counters among the statistics; the audit judges the watchdog.
//!
//! Three requests on any socket, no privilege needed: ETHTOOL_GSSET_INFO (how many
//! statistics), ETHTOOL_GSTRINGS (their names, 32 bytes each) and ETHTOOL_GSTATS (their
//! values, u64 each, in the same order). veth answers too (`peer_ifindex`,
//! `rx_queue_0_xdp_packets`, ...), which is what the tests read.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SIOCETHTOOL` (linux/sockios.h).
const SIOCETHTOOL: libc::Ioctl = 0x8946;
/// ethtool commands (linux/ethtool.h).
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GTUNABLE: u32 = 0x48;
/// The PFC storm watchdog's tunable and its type (linux/ethtool.h: `enum tunable_id`,
/// `enum tunable_type_id`).
const ETHTOOL_PFC_PREVENTION_TOUT: u32 = 3;
const ETHTOOL_TUNABLE_U16: u32 = 3;
/// The string set of driver statistics.
const ETH_SS_STATS: u32 = 1;
/// Every name is padded with NULs to this many bytes.
pub const ETH_GSTRING_LEN: usize = 32;
/// Statistics accepted at most (mlx5 with many channels has a few thousand).
const MAX_STATS: usize = 1 << 16;
/// Extra room in the reply buffers: the kernel writes as many entries as the driver
/// has *now*, not as many as the buffer holds, so a count that grows between two
/// requests (a driver reconfigured in between) must still fit.
const SLACK_ENTRIES: usize = 1024;

/// Why the statistics of an interface could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    #[error("{0:?} is not an interface name")]
    BadName(String),
    #[error("{ifname}: no such device")]
    NoDevice { ifname: String },
    #[error("{ifname}: the driver has no ethtool statistics")]
    Unsupported { ifname: String },
    #[error("{ifname}: {request}: {error}")]
    Ioctl {
        ifname: String,
        request: &'static str,
        error: io::Error,
    },
    #[error("{ifname}: the statistics changed while they were read ({first} names, then {then})")]
    Changed {
        ifname: String,
        first: usize,
        then: usize,
    },
    #[error("{ifname}: {count} statistics is more than the {MAX_STATS} accepted")]
    TooMany { ifname: String, count: usize },
    #[error("opening a socket for SIOCETHTOOL: {0}")]
    Socket(io::Error),
}

/// One driver statistic, as `ethtool -S` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub name: String,
    pub value: u64,
}

/// The names of an ETHTOOL_GSTRINGS reply: `count` fields of [`ETH_GSTRING_LEN`]
/// bytes, each ending at its first NUL (a name that fills its field has none).
/// Bytes that are not UTF-8 are replaced; a reply shorter than `count` fields gives
/// the names it has.
pub fn parse_names(data: &[u8], count: usize) -> Vec<String> {
    data.chunks_exact(ETH_GSTRING_LEN)
        .take(count)
        .map(|field| {
            let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            String::from_utf8_lossy(&field[..end]).into_owned()
        })
        .collect()
}

/// A socket to send SIOCETHTOOL requests on; one serves every interface.
pub struct EthtoolSocket {
    fd: OwnedFd,
}

impl EthtoolSocket {
    pub fn open() -> Result<EthtoolSocket, EthtoolError> {
        // SAFETY: socket() takes no pointers; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(EthtoolError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: fd is a new, valid descriptor that nothing else owns.
        Ok(EthtoolSocket {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Every driver statistic of `ifname`, in the driver's order.
    pub fn stats(&self, ifname: &str) -> Result<Vec<Stat>, EthtoolError> {
        let count = self.stats_count(ifname)?;
        if count > MAX_STATS {
            return Err(EthtoolError::TooMany {
                ifname: ifname.to_string(),
                count,
            });
        }
        let room = count + SLACK_ENTRIES;

        // struct ethtool_gstrings { u32 cmd, string_set, len; u8 data[]; }
        let mut strings = vec![0u64; (12 + room * ETH_GSTRING_LEN).div_ceil(8)];
        let header = [ETHTOOL_GSTRINGS, ETH_SS_STATS, count as u32];
        write_u32s(&mut strings, &header);
        self.request(ifname, "ETHTOOL_GSTRINGS", strings.as_mut_ptr().cast())?;
        let bytes = as_bytes(&strings);
        let names_len = u32_at(bytes, 8) as usize;

        // struct ethtool_stats { u32 cmd, n_stats; u64 data[]; }
        let mut values = vec![0u64; 1 + room];
        write_u32s(&mut values, &[ETHTOOL_GSTATS, count as u32]);
        self.request(ifname, "ETHTOOL_GSTATS", values.as_mut_ptr().cast())?;
        let values_len = u32_at(as_bytes(&values), 4) as usize;

        if names_len != count || values_len != count {
            return Err(EthtoolError::Changed {
                ifname: ifname.to_string(),
                first: count,
                then: if names_len != count {
                    names_len
                } else {
                    values_len
                },
            });
        }
        let names = parse_names(&bytes[12..], count);
        Ok(names
            .into_iter()
            .zip(&values[1..=count])
            .map(|(name, &value)| Stat { name, value })
            .collect())
    }

    /// The PFC storm watchdog's timeout of `ifname`, ms (0: off): how long a priority
    /// may stay paused by this port's own stalled receive pipeline before the NIC stops
    /// sending pauses. `Unsupported` where the driver has no such tunable (veth).
    pub fn pfc_prevention_tout(&self, ifname: &str) -> Result<u16, EthtoolError> {
        // struct ethtool_tunable { u32 cmd, id, type_id, len; u8 data[]; }
        let mut tunable = [0u64; 3];
        write_u32s(
            &mut tunable,
            &[
                ETHTOOL_GTUNABLE,
                ETHTOOL_PFC_PREVENTION_TOUT,
                ETHTOOL_TUNABLE_U16,
                2,
            ],
        );
        self.request(ifname, "ETHTOOL_GTUNABLE", tunable.as_mut_ptr().cast())?;
        let b = as_bytes(&tunable);
        Ok(u16::from_ne_bytes([b[16], b[17]]))
    }

    /// ETHTOOL_GSSET_INFO for the statistics set: how many there are.
    fn stats_count(&self, ifname: &str) -> Result<usize, EthtoolError> {
        // struct ethtool_sset_info { u32 cmd, reserved; u64 sset_mask; u32 data[]; }
        let mut info = [0u64; 3];
        write_u32s(&mut info, &[ETHTOOL_GSSET_INFO, 0]);
        info[1] = 1u64 << ETH_SS_STATS;
        self.request(ifname, "ETHTOOL_GSSET_INFO", info.as_mut_ptr().cast())?;
        // The kernel clears the mask bit of a set the driver does not have.
        if info[1] & (1u64 << ETH_SS_STATS) == 0 {
            return Err(EthtoolError::Unsupported {
                ifname: ifname.to_string(),
            });
        }
        Ok(u32_at(as_bytes(&info), 16) as usize)
    }

    fn request(
        &self,
        ifname: &str,
        request: &'static str,
        data: *mut libc::c_char,
    ) -> Result<(), EthtoolError> {
        let name = ifname.as_bytes();
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
            return Err(EthtoolError::BadName(ifname.to_string()));
        }
        // SAFETY: ifreq is plain data; all zeroes is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, &src) in ifr.ifr_name.iter_mut().zip(name) {
            *dst = src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = data;
        // SAFETY: ifr names a NUL-terminated interface and points at a buffer laid out
        // as the command in its first word says, large enough for the reply (see
        // SLACK_ENTRIES); both outlive the call.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), SIOCETHTOOL, &mut ifr) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        Err(match error.raw_os_error() {
            Some(libc::ENODEV) => EthtoolError::NoDevice {
                ifname: ifname.to_string(),
            },
            Some(libc::EOPNOTSUPP) => EthtoolError::Unsupported {
                ifname: ifname.to_string(),
            },
            _ => EthtoolError::Ioctl {
                ifname: ifname.to_string(),
                request,
                error,
            },
        })
    }
}

/// The statistics of one interface (a socket opened for the purpose).
pub fn stats(ifname: &str) -> Result<Vec<Stat>, EthtoolError> {
    EthtoolSocket::open()?.stats(ifname)
}

fn write_u32s(buf: &mut [u64], words: &[u32]) {
    for (i, w) in words.iter().enumerate() {
        let slot = &mut buf[i / 2];
        let mut b = slot.to_ne_bytes();
        b[(i % 2) * 4..(i % 2) * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        *slot = u64::from_ne_bytes(b);
    }
}

fn as_bytes(buf: &[u64]) -> &[u8] {
    // SAFETY: u64 has no padding and any byte is a valid u8; the length is exact.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), std::mem::size_of_val(buf)) }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
}

/// Where a fixture tree (`--sysfs-root DIR`, any DIR but /sys) keeps what ethtool
/// printed for `ifname` (`DIR/class/net/IF/FILE`: `ethtool-S`, `ethtool-tunables`),
/// standing for the NIC's answers on a host without that NIC; None under /sys, where
/// the NIC answers itself.
pub fn fixture_file(
    sysfs_root: &std::path::Path,
    ifname: &str,
    file: &str,
) -> Option<std::path::PathBuf> {
    (sysfs_root != std::path::Path::new("/sys"))
        .then(|| sysfs_root.join("class/net").join(ifname).join(file))
}

/// Statistics as `ethtool -S IF` prints them (`NIC statistics:`, then `name: value`
/// lines): the fixture trees' stand-in for a NIC's (`--sysfs-root DIR`:
/// `DIR/class/net/IF/ethtool-S`). Lines that are not `name: number` are skipped.
pub fn stats_from_text(text: &str) -> Vec<Stat> {
    text.lines()
        .filter_map(|l| {
            let (name, value) = l.trim().rsplit_once(':')?;
            Some(Stat {
                name: name.trim().to_string(),
                value: value.trim().parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str) -> Vec<u8> {
        let mut f = name.as_bytes().to_vec();
        f.resize(ETH_GSTRING_LEN, 0);
        f
    }

    #[test]
    fn names_end_at_their_first_nul_or_fill_the_field() {
        let full = "x".repeat(ETH_GSTRING_LEN);
        let mut data = field("peer_ifindex");
        data.extend(field("rx_queue_0_xdp_packets"));
        data.extend(full.as_bytes());
        let mut garbage_after_nul = field("tx_prio3_pause");
        garbage_after_nul[20] = b'z';
        data.extend(garbage_after_nul);
        assert_eq!(
            parse_names(&data, 4),
            [
                "peer_ifindex",
                "rx_queue_0_xdp_packets",
                full.as_str(),
                "tx_prio3_pause"
            ]
        );
        assert_eq!(parse_names(&data, 2).len(), 2);
        // A reply cut short gives the whole fields it has.
        assert_eq!(parse_names(&data[..40], 4), ["peer_ifindex"]);
        let mut bad = field("");
        bad[0] = 0xff;
        bad[1] = b'a';
        assert_eq!(parse_names(&bad, 1), ["\u{fffd}a"]);
    }

    #[test]
    fn request_words_land_where_the_kernel_reads_them() {
        let mut buf = [0u64; 2];
        write_u32s(&mut buf, &[ETHTOOL_GSTRINGS, ETH_SS_STATS, 5]);
        let b = as_bytes(&buf);
        assert_eq!((u32_at(b, 0), u32_at(b, 4), u32_at(b, 8)), (0x1b, 1, 5));
        assert_eq!(u32_at(b, 14), 0, "past the end reads as 0");
    }

    #[test]
    fn a_bad_name_is_refused_before_any_ioctl() {
        let sock = EthtoolSocket::open().unwrap();
        for bad in ["", "a-name-longer-than-15", "a\0b"] {
            assert!(
                matches!(sock.stats(bad), Err(EthtoolError::BadName(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            sock.stats("no-such-if0"),
            Err(EthtoolError::NoDevice { .. })
        ));
    }
}
