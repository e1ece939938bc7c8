//! CNPs off the policy's CNP class (`cnp_wrong_class`): a CNP must travel on the CNP
//! DSCP (a strict-priority queue of its own on the switches), or it waits behind the
//! very data it should slow down, and DCQCN reacts late. The kernel counts them per
//! flow (CNP_WRONG_CLASS, a hash by FLOW_SLOTS index of the flows that have any),
//! `analyze` per flow on the same rule; the DSCP is the outer one, what the fabric
//! queues by.

/// The CNPs of one flow on a DSCP other than the policy's CNP DSCP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CnpWrongClass {
    pub packets: u64,
    /// The DSCPs they carried, one bit each.
    pub dscps: u64,
}

impl CnpWrongClass {
    /// Counts one CNP on `dscp`.
    #[inline(always)]
    pub fn count(&mut self, dscp: u8) {
        self.packets += 1;
        self.dscps |= dscp_bit(dscp);
    }

    /// The DSCPs, lowest first.
    pub fn dscp_list(&self) -> impl Iterator<Item = u8> + '_ {
        (0..64u8).filter(|d| self.dscps & dscp_bit(*d) != 0)
    }
}

/// The bit of `dscp` in [`CnpWrongClass::dscps`].
#[inline(always)]
pub fn dscp_bit(dscp: u8) -> u64 {
    1u64 << (dscp & 63)
}

/// Whether a packet of `opcode` with outer DSCP `dscp` is a CNP off the CNP DSCP
/// `cnp_dscp`.
#[inline(always)]
pub fn wrong_class(opcode: u8, dscp: u8, cnp_dscp: u8) -> bool {
    crate::bth::is_cnp(opcode) && dscp != cnp_dscp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cnps_off_the_cnp_dscp_count() {
        assert!(wrong_class(0x81, 26, 48));
        assert!(wrong_class(0x80, 0, 48), "the other CNP opcode");
        assert!(!wrong_class(0x81, 48, 48));
        assert!(!wrong_class(0x11, 26, 48), "an ACK is no CNP");
        let mut c = CnpWrongClass::default();
        c.count(26);
        c.count(0);
        c.count(26);
        assert_eq!(c.packets, 3);
        let mut dscps = c.dscp_list();
        assert_eq!(
            (dscps.next(), dscps.next(), dscps.next()),
            (Some(0), Some(26), None)
        );
    }
}
