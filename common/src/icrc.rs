//! RoCEv2 invariant CRC (ICRC), computed as the Linux soft-RoCE driver does: CRC-32
//! over 8 bytes of 1s (the masked LRH), the IP header with its variant fields set to
//! 1s (IPv4 TOS, TTL, checksum; IPv6 traffic class, flow label, hop limit), the UDP
//! header with its checksum set to 1s, the BTH with byte 4 (FECN/BECN) set to 1s, and
//! the rest of the RoCE packet up to the ICRC. The ICRC is stored little-endian.

const fn crc32_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static TABLE: [u32; 256] = crc32_table();

/// Running CRC-32 (IEEE, reflected), without the final inversion.
#[derive(Clone, Copy, Debug)]
pub struct Crc32(u32);

impl Default for Crc32 {
    fn default() -> Self {
        Crc32(0xFFFF_FFFF)
    }
}

impl Crc32 {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = TABLE[((self.0 ^ b as u32) & 0xFF) as usize] ^ (self.0 >> 8);
        }
    }
    pub fn update_byte(&mut self, b: u8) {
        self.update(&[b]);
    }
    pub fn finish(self) -> u32 {
        !self.0
    }
}

/// Where the masked headers go: a running CRC, or a buffer that one fast CRC call
/// then reads whole.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Crc32 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// The masked headers collected in one buffer (at most 8 + 60 + 13 bytes for IPv4
/// with options); `overflow` when they did not fit.
#[cfg(feature = "std")]
struct Head {
    buf: [u8; 96],
    n: usize,
    overflow: bool,
}

#[cfg(feature = "std")]
impl Sink for Head {
    fn put(&mut self, bytes: &[u8]) {
        match self.buf.get_mut(self.n..self.n + bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.n += bytes.len();
            }
            None => self.overflow = true,
        }
    }
}

/// Feeds the masked LRH, IP header, UDP header and BTH up to byte 4 of the BTH
/// (inclusive, masked); the caller adds `udp_up_to_icrc[13..]`.
fn masked_headers<S: Sink>(s: &mut S, ip_header: &[u8], udp_up_to_icrc: &[u8]) -> Option<()> {
    s.put(&[0xFF; 8]);
    match ip_header.first()? >> 4 {
        4 => {
            if ip_header.len() < 20 {
                return None;
            }
            s.put(&ip_header[..1]);
            s.put(&[0xFF]); // TOS
            s.put(&ip_header[2..8]);
            s.put(&[0xFF]); // TTL
            s.put(&ip_header[9..10]);
            s.put(&[0xFF, 0xFF]); // header checksum
            s.put(&ip_header[12..]);
        }
        6 => {
            if ip_header.len() < 40 {
                return None;
            }
            s.put(&[0x6F, 0xFF, 0xFF, 0xFF]); // version, traffic class, flow label
            s.put(&ip_header[4..7]);
            s.put(&[0xFF]); // hop limit
            s.put(&ip_header[8..40]);
        }
        _ => return None,
    }
    s.put(&udp_up_to_icrc[..6]);
    s.put(&[0xFF, 0xFF]); // UDP checksum
    s.put(&udp_up_to_icrc[8..12]);
    s.put(&[0xFF]); // BTH byte 4: FECN, BECN, reserved
    Some(())
}

/// The ICRC of a RoCEv2 packet given its IP header (IPv4 with options, or IPv6 without
/// extension headers) and the UDP datagram up to, not including, the ICRC.
/// Returns None when the headers are too short to be what they claim.
///
/// With `std`, the CRC is crc32fast's (carry-less multiplication where the CPU has
/// it): `analyze` checks every RoCE frame of a capture, and the byte-wise table was
/// most of its time.
pub fn icrc(ip_header: &[u8], udp_up_to_icrc: &[u8]) -> Option<u32> {
    if udp_up_to_icrc.len() < 8 + 12 {
        return None;
    }
    #[cfg(feature = "std")]
    {
        let mut head = Head {
            buf: [0; 96],
            n: 0,
            overflow: false,
        };
        masked_headers(&mut head, ip_header, udp_up_to_icrc)?;
        if !head.overflow {
            let mut h = crc32fast::Hasher::new();
            h.update(&head.buf[..head.n]);
            h.update(&udp_up_to_icrc[13..]);
            return Some(h.finalize());
        }
    }
    icrc_bytewise(ip_header, udp_up_to_icrc)
}

/// [`icrc`] with the byte-wise table only (no_std, and the oracle of the fast path).
pub fn icrc_bytewise(ip_header: &[u8], udp_up_to_icrc: &[u8]) -> Option<u32> {
    if udp_up_to_icrc.len() < 8 + 12 {
        return None;
    }
    let mut c = Crc32::default();
    masked_headers(&mut c, ip_header, udp_up_to_icrc)?;
    c.update(&udp_up_to_icrc[13..]);
    Some(c.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        let mut c = Crc32::default();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xCBF4_3926);
    }

    #[test]
    #[cfg(feature = "std")]
    fn fast_path_agrees_with_the_bytewise_table() {
        // A simple generator: the headers' variant fields and lengths vary.
        let mut x = 0x9E37_79B9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for len in [
            20usize, 21, 63, 64, 65, 127, 128, 129, 500, 1500, 4200, 9000,
        ] {
            for v6 in [false, true] {
                let ip_len = if v6 {
                    40
                } else {
                    20 + 4 * (next() as usize % 11)
                };
                let mut ip: std::vec::Vec<u8> = (0..ip_len).map(|_| next() as u8).collect();
                ip[0] = if v6 {
                    0x60 | (ip[0] & 0xF)
                } else {
                    0x40 | (ip_len / 4) as u8
                };
                let udp: std::vec::Vec<u8> = (0..len).map(|_| next() as u8).collect();
                assert_eq!(
                    icrc(&ip, &udp),
                    icrc_bytewise(&ip, &udp),
                    "len {len} v6 {v6}"
                );
                assert!(icrc(&ip, &udp).is_some());
            }
        }
        assert_eq!(icrc(&[0x45; 20], &[0; 19]), None);
        assert_eq!(icrc(&[0x45; 19], &[0; 40]), None);
    }

    #[test]
    fn seed_matches_soft_roce_constant() {
        // rxe seeds its CRC with the state after 8 bytes of 0xFF: 0xdebb20e3.
        let mut c = Crc32::default();
        c.update(&[0xFF; 8]);
        assert_eq!(c.0, 0xDEBB_20E3);
    }
}
