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

/// The ECN -> CNP loop timed on one flow that carries CNPs (the flow to the reaction
/// point's QP): `ce_to_cnp`, from the first CE-marked RoCE packet between its two hosts
/// that no CNP had answered yet to the CNP that answered it (the notification point's
/// reaction); `interval`, between the flow's successive CNPs (its pacing: DCQCN sends
/// at most one a QP per `min_time_between_cnps`). Marks and CNPs are matched by host
/// pair, as NAKs are: a CNP names the marked packets' sender QP, which the wire does
/// not tie to their destination QP. The kernel keeps one per CNP flow (CNP_TIMES, by
/// FLOW_SLOTS index), `analyze` one per flow of a capture. 2,888 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CnpTimes {
    pub ce_to_cnp: crate::rtt::RttHist,
    pub interval: crate::rtt::RttHist,
    /// When the flow's last CNP was seen (0: none yet), on the clock of the samples.
    pub last_cnp_ns: u64,
}

impl CnpTimes {
    /// Adds the times of the same flow kept elsewhere (another worker, another CPU's
    /// table): the counts add, the last CNP is the later one.
    pub fn merge(&mut self, o: &CnpTimes) {
        self.ce_to_cnp.merge(&o.ce_to_cnp);
        self.interval.merge(&o.interval);
        self.last_cnp_ns = self.last_cnp_ns.max(o.last_cnp_ns);
    }
}

/// Where the kernel's CNP timing keeps what it hands the map helpers (one per CPU):
/// in a map's memory, not on the stack, which the counting programs have used up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CnpScratch {
    /// The host pair of a mark, or the other way for a CNP (`NakKey`, PSN 0).
    pub pair: crate::nak::NakKey,
    /// The packet's flow slot, and the time.
    pub slot: u32,
    /// The packet's opcode and outer DSCP.
    pub opcode: u8,
    pub dscp: u8,
    /// A CNP that answers the marks seen here (it leaves, or the copies hold both
    /// directions).
    pub answers: bool,
    pub _pad: u8,
    pub now_ns: u64,
    /// Always zero: a flow's first CNP off class is counted from it.
    pub zero: CnpWrongClass,
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
