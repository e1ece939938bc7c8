//! InfiniBand Base Transport Header and the extension headers that follow it.

pub const BTH_LEN: usize = 12;
pub const RETH_LEN: usize = 16;
pub const AETH_LEN: usize = 4;
pub const DETH_LEN: usize = 8;
pub const IMMDT_LEN: usize = 4;
pub const IETH_LEN: usize = 4;
pub const ATOMIC_ETH_LEN: usize = 28;
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
pub const XRCETH_LEN: usize = 4;
/// Reliable Datagram Extended Transport Header: on every RD packet, first after the BTH.
pub const RDETH_LEN: usize = 4;
pub const ICRC_LEN: usize = 4;

/// Transport bits (opcode 7:5).
pub const TRANSPORT_RC: u8 = 0x00;
pub const TRANSPORT_UC: u8 = 0x20;
pub const TRANSPORT_RD: u8 = 0x40;
pub const TRANSPORT_UD: u8 = 0x60;
pub const TRANSPORT_CNP: u8 = 0x80;
pub const TRANSPORT_XRC: u8 = 0xA0;

/// Operation codes (low five bits), shared by RC, UC and XRC where they apply.
pub mod op {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0A;
    pub const WRITE_ONLY_IMM: u8 = 0x0B;
    pub const READ_REQUEST: u8 = 0x0C;
    pub const READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const READ_RESPONSE_LAST: u8 = 0x0F;
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACKNOWLEDGE: u8 = 0x11;
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const COMPARE_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    /// RD only.
    pub const RESYNC: u8 = 0x15;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
}

/// The CNP opcode of RoCEv2 (Annex A17); 0x80 is accepted too, as some NICs send it.
pub const OPCODE_CNP: u8 = 0x81;

/// Fields of a parsed BTH, in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    /// Byte 1: SE, M, PadCnt, TVer.
    pub flags: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl Bth {
    /// Parses a BTH from its three big-endian words.
    #[inline(always)]
    pub fn from_words(w0: u32, w1: u32, w2: u32) -> Self {
        Bth {
            opcode: (w0 >> 24) as u8,
            flags: (w0 >> 16) as u8,
            pkey: w0 as u16,
            fecn: w1 & 0x8000_0000 != 0,
            becn: w1 & 0x4000_0000 != 0,
            dest_qp: w1 & 0x00FF_FFFF,
            ack_req: w2 & 0x8000_0000 != 0,
            psn: w2 & 0x00FF_FFFF,
        }
    }

    #[inline(always)]
    pub fn pad_count(&self) -> u8 {
        (self.flags >> 4) & 0x3
    }

    #[inline(always)]
    pub fn transport(&self) -> u8 {
        self.opcode & 0xE0
    }

    #[inline(always)]
    pub fn is_cnp(&self) -> bool {
        is_cnp(self.opcode)
    }
}

#[inline(always)]
pub fn is_cnp(opcode: u8) -> bool {
    opcode == OPCODE_CNP || opcode == 0x80
}

/// True for opcodes whose BTH is followed (after any XRCETH) by an AETH.
#[inline(always)]
pub fn has_aeth(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC {
        return false;
    }
    matches!(
        opcode & 0x1F,
        op::READ_RESPONSE_FIRST
            | op::READ_RESPONSE_LAST
            | op::READ_RESPONSE_ONLY
            | op::ACKNOWLEDGE
            | op::ATOMIC_ACKNOWLEDGE
    )
}

/// True for the ACKNOWLEDGE opcode (RC 0x11, XRC 0xB1): the packets counted as ACK/NAK.
#[inline(always)]
pub fn is_acknowledge(opcode: u8) -> bool {
    opcode == op::ACKNOWLEDGE || opcode == TRANSPORT_XRC | op::ACKNOWLEDGE
}

/// True for RC and XRC responses: READ RESPONSE FIRST, MIDDLE, LAST and ONLY,
/// ACKNOWLEDGE and ATOMIC ACKNOWLEDGE. A response's PSN is one of the requests the
/// responder took (or, in a NAK, the one it expected).
#[inline(always)]
pub fn is_response(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC {
        return false;
    }
    (op::READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE).contains(&(opcode & 0x1F))
}

/// True for the responses whose PSN is their request's: ACKNOWLEDGE (handled with the
/// AETH), READ RESPONSE FIRST and ONLY, ATOMIC ACKNOWLEDGE (RC and XRC). MIDDLE and
/// LAST carry the PSNs after their READ's.
#[inline(always)]
pub fn answers_request(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC {
        return false;
    }
    matches!(
        opcode & 0x1F,
        op::READ_RESPONSE_FIRST | op::READ_RESPONSE_ONLY | op::ATOMIC_ACKNOWLEDGE
    )
}

/// True for the requests a response answers whatever their AckReq bit: READ and the
/// atomics (RC and XRC).
#[inline(always)]
pub fn expects_response(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC {
        return false;
    }
    matches!(
        opcode & 0x1F,
        op::READ_REQUEST | op::COMPARE_SWAP | op::FETCH_ADD
    )
}

/// True for RC and XRC request opcodes: the packets whose PSNs are tracked for gaps.
#[inline(always)]
pub fn is_tracked_request(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC {
        return false;
    }
    let o = opcode & 0x1F;
    o <= op::READ_REQUEST
        || o == op::COMPARE_SWAP
        || o == op::FETCH_ADD
        || o == op::SEND_LAST_INV
        || o == op::SEND_ONLY_INV
}

/// True for FIRST and MIDDLE packets of a multi-packet message, whose payload is one path MTU.
#[inline(always)]
pub fn is_first_or_middle(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC && t != TRANSPORT_UC {
        return false;
    }
    matches!(
        opcode & 0x1F,
        op::SEND_FIRST | op::SEND_MIDDLE | op::WRITE_FIRST | op::WRITE_MIDDLE
    )
}

/// True for the opcodes the InfiniBand spec defines (IBA 9.2, table 38; Annex A17 for
/// the CNP): RC and XRC 0x00-0x14, 0x16, 0x17; UC 0x00-0x0B; RD 0x00-0x15; UD 0x04,
/// 0x05; the CNP 0x81 (and 0x80). The others are reserved or vendor-specific: what
/// follows their BTH is unknown.
#[inline(always)]
pub fn is_defined(opcode: u8) -> bool {
    let o = opcode & 0x1F;
    match opcode & 0xE0 {
        TRANSPORT_RC | TRANSPORT_XRC => {
            o <= op::FETCH_ADD || o == op::SEND_LAST_INV || o == op::SEND_ONLY_INV
        }
        TRANSPORT_UC => o <= op::WRITE_ONLY_IMM,
        TRANSPORT_RD => o <= op::RESYNC,
        TRANSPORT_UD => o == op::SEND_ONLY || o == op::SEND_ONLY_IMM,
        _ => is_cnp(opcode),
    }
}

/// Bytes of extension headers between the BTH and the payload of a defined opcode
/// ([`is_defined`]; the others get what their low five bits would carry), in wire
/// order: XRCETH (XRC requests), RDETH (RD) then DETH (RD requests, UD), then RETH,
/// AtomicETH, AETH [+ AtomicAckETH], ImmDt or IETH as the operation says. A CNP: its 16
/// reserved bytes.
#[inline(always)]
pub fn ext_headers_len(opcode: u8) -> usize {
    let t = opcode & 0xE0;
    if t == TRANSPORT_CNP {
        return 16;
    }
    let o = opcode & 0x1F;
    // XRC requests carry an XRCETH; XRC responses do not.
    let xrc = if t == TRANSPORT_XRC && is_tracked_request(opcode) {
        XRCETH_LEN
    } else {
        0
    };
    // Every RD packet carries an RDETH, its requests (all but the READ responses and
    // the acknowledgements) a DETH after it; UD packets a DETH.
    let datagram = match t {
        TRANSPORT_RD if (op::READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE).contains(&o) => {
            RDETH_LEN
        }
        TRANSPORT_RD => RDETH_LEN + DETH_LEN,
        TRANSPORT_UD => DETH_LEN,
        _ => 0,
    };
    let ext = match o {
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM | op::WRITE_LAST_IMM => IMMDT_LEN,
        op::WRITE_FIRST | op::WRITE_ONLY | op::READ_REQUEST => RETH_LEN,
        op::WRITE_ONLY_IMM => RETH_LEN + IMMDT_LEN,
        op::READ_RESPONSE_FIRST
        | op::READ_RESPONSE_LAST
        | op::READ_RESPONSE_ONLY
        | op::ACKNOWLEDGE => AETH_LEN,
        op::ATOMIC_ACKNOWLEDGE => AETH_LEN + ATOMIC_ACK_ETH_LEN,
        op::COMPARE_SWAP | op::FETCH_ADD => ATOMIC_ETH_LEN,
        op::SEND_LAST_INV | op::SEND_ONLY_INV => IETH_LEN,
        _ => 0,
    };
    xrc + datagram + ext
}

/// True when a RETH follows the BTH (and XRCETH) directly.
#[inline(always)]
pub fn has_reth(opcode: u8) -> bool {
    let t = opcode & 0xE0;
    if t != TRANSPORT_RC && t != TRANSPORT_XRC && t != TRANSPORT_UC {
        return false;
    }
    matches!(
        opcode & 0x1F,
        op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM | op::READ_REQUEST
    )
}

/// Class of an AETH syndrome (bits 7:5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyndromeClass {
    Ack,
    RnrNak,
    Nak,
    Reserved,
}

#[inline(always)]
pub fn syndrome_class(syndrome: u8) -> SyndromeClass {
    match syndrome >> 5 {
        0b000 => SyndromeClass::Ack,
        0b001 => SyndromeClass::RnrNak,
        0b011 => SyndromeClass::Nak,
        _ => SyndromeClass::Reserved,
    }
}

/// A short name for an opcode, for tables and logs.
pub fn opcode_name(opcode: u8) -> &'static str {
    if is_cnp(opcode) {
        return "CNP";
    }
    match opcode & 0x1F {
        op::SEND_FIRST => "SEND_FIRST",
        op::SEND_MIDDLE => "SEND_MIDDLE",
        op::SEND_LAST => "SEND_LAST",
        op::SEND_LAST_IMM => "SEND_LAST_IMM",
        op::SEND_ONLY => "SEND_ONLY",
        op::SEND_ONLY_IMM => "SEND_ONLY_IMM",
        op::WRITE_FIRST => "WRITE_FIRST",
        op::WRITE_MIDDLE => "WRITE_MIDDLE",
        op::WRITE_LAST => "WRITE_LAST",
        op::WRITE_LAST_IMM => "WRITE_LAST_IMM",
        op::WRITE_ONLY => "WRITE_ONLY",
        op::WRITE_ONLY_IMM => "WRITE_ONLY_IMM",
        op::READ_REQUEST => "READ_REQUEST",
        op::READ_RESPONSE_FIRST => "READ_RESPONSE_FIRST",
        op::READ_RESPONSE_MIDDLE => "READ_RESPONSE_MIDDLE",
        op::READ_RESPONSE_LAST => "READ_RESPONSE_LAST",
        op::READ_RESPONSE_ONLY => "READ_RESPONSE_ONLY",
        op::ACKNOWLEDGE => "ACKNOWLEDGE",
        op::ATOMIC_ACKNOWLEDGE => "ATOMIC_ACKNOWLEDGE",
        op::COMPARE_SWAP => "COMPARE_SWAP",
        op::FETCH_ADD => "FETCH_ADD",
        op::SEND_LAST_INV => "SEND_LAST_INV",
        op::SEND_ONLY_INV => "SEND_ONLY_INV",
        _ => "RESERVED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bth_words() {
        let b = Bth::from_words(0x0A40_FFFF, 0x4000_1234, 0x8000_0102);
        assert_eq!(b.opcode, 0x0A);
        assert_eq!(b.pad_count(), 0);
        assert_eq!(b.flags, 0x40);
        assert_eq!(b.pkey, 0xFFFF);
        assert!(!b.fecn && b.becn);
        assert_eq!(b.dest_qp, 0x1234);
        assert!(b.ack_req);
        assert_eq!(b.psn, 0x102);
    }

    #[test]
    fn syndrome_classes_follow_bits_7_to_5() {
        assert_eq!(syndrome_class(0x1F), SyndromeClass::Ack);
        assert_eq!(syndrome_class(0x20), SyndromeClass::RnrNak);
        assert_eq!(syndrome_class(0x60), SyndromeClass::Nak);
        assert_eq!(syndrome_class(0x63), SyndromeClass::Nak);
        assert_eq!(syndrome_class(0x40), SyndromeClass::Reserved);
    }

    #[test]
    fn request_opcodes_are_rc_and_xrc_only() {
        assert!(is_tracked_request(0x04));
        assert!(is_tracked_request(0x0C));
        assert!(is_tracked_request(0x14));
        assert!(is_tracked_request(0xA4));
        assert!(!is_tracked_request(0x24)); // UC
        assert!(!is_tracked_request(0x64)); // UD
        assert!(!is_tracked_request(0x11)); // ACK
        assert!(!is_tracked_request(0x10)); // READ response
        assert!(!is_tracked_request(0x81)); // CNP
    }

    #[test]
    fn defined_opcodes_are_the_specs_per_transport() {
        let defined = (0..=255u8).filter(|o| is_defined(*o)).count();
        // RC and XRC 23 each, UC 12, RD 22, UD 2, CNP 2.
        assert_eq!(defined, 23 + 23 + 12 + 22 + 2 + 2);
        for o in [0x15, 0x18, 0x1F, 0x2C, 0x60, 0x66, 0x82, 0xB5, 0xC0, 0xFF] {
            assert!(!is_defined(o), "{o:#x}");
        }
        for o in [0x00, 0x14, 0x17, 0x2B, 0x55, 0x64, 0x65, 0x80, 0x81, 0xB7] {
            assert!(is_defined(o), "{o:#x}");
        }
    }

    #[test]
    fn rd_packets_carry_an_rdeth_and_rd_requests_a_deth() {
        // SEND FIRST, WRITE ONLY, READ request, CmpSwap, RESYNC: RDETH + DETH + ...
        assert_eq!(ext_headers_len(0x40), RDETH_LEN + DETH_LEN);
        assert_eq!(ext_headers_len(0x4A), RDETH_LEN + DETH_LEN + RETH_LEN);
        assert_eq!(ext_headers_len(0x4C), RDETH_LEN + DETH_LEN + RETH_LEN);
        assert_eq!(ext_headers_len(0x53), RDETH_LEN + DETH_LEN + ATOMIC_ETH_LEN);
        assert_eq!(ext_headers_len(0x55), RDETH_LEN + DETH_LEN);
        // READ responses and acknowledgements: RDETH, no DETH.
        assert_eq!(ext_headers_len(0x4E), RDETH_LEN);
        assert_eq!(ext_headers_len(0x51), RDETH_LEN + AETH_LEN);
        assert_eq!(
            ext_headers_len(0x52),
            RDETH_LEN + AETH_LEN + ATOMIC_ACK_ETH_LEN
        );
    }

    #[test]
    fn aeth_follows_responses_and_acks() {
        for o in [0x0D, 0x0F, 0x10, 0x11, 0x12, 0xB1] {
            assert!(has_aeth(o), "{o:#x}");
        }
        for o in [0x0E, 0x04, 0x31, 0x81] {
            assert!(!has_aeth(o), "{o:#x}");
        }
    }
}
