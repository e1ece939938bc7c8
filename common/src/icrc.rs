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

/// The ICRC of a RoCEv2 packet given its IP header (IPv4 with options, or IPv6 without
/// extension headers) and the UDP datagram up to, not including, the ICRC.
/// Returns None when the headers are too short to be what they claim.
pub fn icrc(ip_header: &[u8], udp_up_to_icrc: &[u8]) -> Option<u32> {
    if udp_up_to_icrc.len() < 8 + 12 {
        return None;
    }
    let mut c = Crc32::default();
    c.update(&[0xFF; 8]);
    match ip_header.first()? >> 4 {
        4 => {
            if ip_header.len() < 20 {
                return None;
            }
            c.update(&ip_header[..1]);
            c.update_byte(0xFF); // TOS
            c.update(&ip_header[2..8]);
            c.update_byte(0xFF); // TTL
            c.update_byte(ip_header[9]);
            c.update(&[0xFF, 0xFF]); // header checksum
            c.update(&ip_header[12..]);
        }
        6 => {
            if ip_header.len() < 40 {
                return None;
            }
            c.update(&[0x6F, 0xFF, 0xFF, 0xFF]); // version, traffic class, flow label
            c.update(&ip_header[4..7]);
            c.update_byte(0xFF); // hop limit
            c.update(&ip_header[8..40]);
        }
        _ => return None,
    }
    c.update(&udp_up_to_icrc[..6]);
    c.update(&[0xFF, 0xFF]); // UDP checksum
    c.update(&udp_up_to_icrc[8..12]);
    c.update_byte(0xFF); // BTH byte 4: FECN, BECN, reserved
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
    fn seed_matches_soft_roce_constant() {
        // rxe seeds its CRC with the state after 8 bytes of 0xFF: 0xdebb20e3.
        let mut c = Crc32::default();
        c.update(&[0xFF; 8]);
        assert_eq!(c.0, 0xDEBB_20E3);
    }
}
