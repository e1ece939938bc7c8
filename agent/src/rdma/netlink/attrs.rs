//! The kernel's numbers for RDMA netlink, written once: each constant carries the
//! kernel's own name, and [`KERNEL_NUMBERS`] lists them all by that name so that
//! `agent/tests/rdma_netlink.rs` compares every one with the C headers
//! (`linux/netlink.h`, `rdma/rdma_netlink.h`, `rdma/ib_user_ioctl_verbs.h`,
//! `rdma/rdma_user_cm.h`) through a program gcc compiles.
//!
//! The attribute and command numbers are ABI (the header says so: "don't change the
//! order or add anything between"); the ones here are all present in 6.1's header,
//! so the comparison runs against Debian's linux-libc-dev as it is.

#![allow(non_upper_case_globals)]

/// Defines each constant once and the list of (kernel name, value) from the same line.
macro_rules! kernel_numbers {
    ($( $(#[$meta:meta])* $name:ident: $ty:ty = $value:expr; )*) => {
        $( $(#[$meta])* pub const $name: $ty = $value; )*
        /// Every constant of this module by its kernel name, for the header check.
        pub const KERNEL_NUMBERS: &[(&str, u64)] = &[ $( (stringify!($name), $name as u64) ),* ];
    };
}

kernel_numbers! {
    // include/uapi/linux/netlink.h
    /// The netlink protocol of the RDMA subsystem (ib_core registers it).
    NETLINK_RDMA: i32 = 20;
    NLMSG_ERROR: u16 = 2;
    NLMSG_DONE: u16 = 3;
    NLM_F_REQUEST: u16 = 0x01;
    NLM_F_MULTI: u16 = 0x02;
    NLM_F_ACK: u16 = 0x04;
    NLM_F_ROOT: u16 = 0x100;
    NLM_F_MATCH: u16 = 0x200;
    NLM_F_DUMP: u16 = 0x300;
    NLA_F_NESTED: u16 = 1 << 15;
    NLA_F_NET_BYTEORDER: u16 = 1 << 14;
    NLM_F_CAPPED: u16 = 0x100;

    // include/uapi/rdma/rdma_netlink.h: the client index of nldev in the message type
    RDMA_NL_NLDEV: u16 = 5;

    // enum rdma_nldev_command
    RDMA_NLDEV_CMD_GET: u16 = 1;
    RDMA_NLDEV_CMD_PORT_GET: u16 = 5;
    RDMA_NLDEV_CMD_RES_QP_GET: u16 = 10;
    RDMA_NLDEV_CMD_RES_CM_ID_GET: u16 = 11;
    RDMA_NLDEV_CMD_STAT_SET: u16 = 16;
    RDMA_NLDEV_CMD_STAT_GET: u16 = 17;

    // enum rdma_nldev_attr
    RDMA_NLDEV_ATTR_PAD: u16 = 0;
    RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
    RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
    RDMA_NLDEV_ATTR_PORT_INDEX: u16 = 3;
    RDMA_NLDEV_ATTR_CAP_FLAGS: u16 = 4;
    RDMA_NLDEV_ATTR_FW_VERSION: u16 = 5;
    RDMA_NLDEV_ATTR_NODE_GUID: u16 = 6;
    RDMA_NLDEV_ATTR_SYS_IMAGE_GUID: u16 = 7;
    RDMA_NLDEV_ATTR_PORT_STATE: u16 = 12;
    RDMA_NLDEV_ATTR_PORT_PHYS_STATE: u16 = 13;
    RDMA_NLDEV_ATTR_DEV_NODE_TYPE: u16 = 14;
    RDMA_NLDEV_ATTR_RES_QP: u16 = 19;
    RDMA_NLDEV_ATTR_RES_QP_ENTRY: u16 = 20;
    RDMA_NLDEV_ATTR_RES_LQPN: u16 = 21;
    RDMA_NLDEV_ATTR_RES_RQPN: u16 = 22;
    RDMA_NLDEV_ATTR_RES_RQ_PSN: u16 = 23;
    RDMA_NLDEV_ATTR_RES_SQ_PSN: u16 = 24;
    RDMA_NLDEV_ATTR_RES_PATH_MIG_STATE: u16 = 25;
    RDMA_NLDEV_ATTR_RES_TYPE: u16 = 26;
    RDMA_NLDEV_ATTR_RES_STATE: u16 = 27;
    RDMA_NLDEV_ATTR_RES_PID: u16 = 28;
    RDMA_NLDEV_ATTR_RES_KERN_NAME: u16 = 29;
    RDMA_NLDEV_ATTR_RES_CM_ID: u16 = 30;
    RDMA_NLDEV_ATTR_RES_CM_ID_ENTRY: u16 = 31;
    RDMA_NLDEV_ATTR_RES_PS: u16 = 32;
    RDMA_NLDEV_ATTR_RES_SRC_ADDR: u16 = 33;
    RDMA_NLDEV_ATTR_RES_DST_ADDR: u16 = 34;
    RDMA_NLDEV_ATTR_NDEV_INDEX: u16 = 50;
    RDMA_NLDEV_ATTR_NDEV_NAME: u16 = 51;
    RDMA_NLDEV_ATTR_DRIVER: u16 = 52;
    RDMA_NLDEV_ATTR_DRIVER_ENTRY: u16 = 53;
    RDMA_NLDEV_ATTR_DRIVER_STRING: u16 = 54;
    RDMA_NLDEV_ATTR_DRIVER_U32: u16 = 57;
    RDMA_NLDEV_ATTR_RES_PDN: u16 = 60;
    RDMA_NLDEV_ATTR_RES_CM_IDN: u16 = 63;
    RDMA_NLDEV_ATTR_DEV_PROTOCOL: u16 = 67;
    RDMA_NLDEV_ATTR_STAT_MODE: u16 = 74;
    RDMA_NLDEV_ATTR_STAT_RES: u16 = 75;
    RDMA_NLDEV_ATTR_STAT_AUTO_MODE_MASK: u16 = 76;
    RDMA_NLDEV_ATTR_STAT_COUNTER: u16 = 77;
    RDMA_NLDEV_ATTR_STAT_COUNTER_ENTRY: u16 = 78;
    RDMA_NLDEV_ATTR_STAT_COUNTER_ID: u16 = 79;
    RDMA_NLDEV_ATTR_STAT_HWCOUNTERS: u16 = 80;
    RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY: u16 = 81;
    RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME: u16 = 82;
    RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE: u16 = 83;
    RDMA_NLDEV_ATTR_DEV_DIM: u16 = 84;

    // enum rdma_nl_counter_mode, enum rdma_nl_counter_mask
    RDMA_COUNTER_MODE_NONE: u32 = 0;
    RDMA_COUNTER_MODE_AUTO: u32 = 1;
    RDMA_COUNTER_MODE_MANUAL: u32 = 2;
    RDMA_COUNTER_MASK_QP_TYPE: u32 = 1;

    // include/uapi/rdma/ib_user_ioctl_verbs.h, enum ib_uverbs_qp_type: the QP types
    // RDMA_NLDEV_ATTR_RES_TYPE carries (ib_core's enum ib_qp_type uses these values;
    // SMI 0 and GSI 1 are kernel-only, ib_verbs.h)
    IB_UVERBS_QPT_RC: u8 = 2;
    IB_UVERBS_QPT_UC: u8 = 3;
    IB_UVERBS_QPT_UD: u8 = 4;
    IB_UVERBS_QPT_RAW_PACKET: u8 = 8;
    IB_UVERBS_QPT_XRC_INI: u8 = 9;
    IB_UVERBS_QPT_XRC_TGT: u8 = 10;
    IB_UVERBS_QPT_DRIVER: u8 = 0xff;

    // include/uapi/rdma/rdma_user_cm.h, enum rdma_ucm_port_space
    RDMA_PS_IPOIB: u32 = 0x0002;
    RDMA_PS_IB: u32 = 0x013f;
    RDMA_PS_TCP: u32 = 0x0106;
    RDMA_PS_UDP: u32 = 0x0111;
}

/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)`: the netlink message type of an nldev command.
pub const fn nldev_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + op
}

/// `RDMA_NL_GET_OP(type)`.
pub const fn nldev_op(kind: u16) -> u16 {
    kind & ((1 << 10) - 1)
}

/// `RDMA_NL_GET_CLIENT(type)`.
pub const fn nl_client(kind: u16) -> u16 {
    (kind & (((1 << 6) - 1) << 10)) >> 10
}

/// The attribute type without the NLA_F_* flag bits.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// `struct nlmsghdr`: length, type, flags, sequence, port id.
pub const NLMSG_HDRLEN: usize = 16;
/// `struct nlattr`: length, type.
pub const NLA_HDRLEN: usize = 4;
/// `sizeof(struct __kernel_sockaddr_storage)`, what SRC_ADDR and DST_ADDR carry.
pub const SOCKADDR_STORAGE_LEN: usize = 128;

/// The QP type's name as iproute2's `rdma` prints it (`qp_types_to_str`); the kernel's
/// enum ib_qp_type: SMI 0, GSI 1, then the uverbs values, DRIVER 0xff.
pub fn qp_type_name(kind: u8) -> String {
    let name = match kind {
        0 => "SMI",
        1 => "GSI",
        IB_UVERBS_QPT_RC => "RC",
        IB_UVERBS_QPT_UC => "UC",
        IB_UVERBS_QPT_UD => "UD",
        5 => "RAW_IPV6",
        6 => "RAW_ETHERTYPE",
        IB_UVERBS_QPT_RAW_PACKET => "RAW_PACKET",
        IB_UVERBS_QPT_XRC_INI => "XRC_INI",
        IB_UVERBS_QPT_XRC_TGT => "XRC_TGT",
        IB_UVERBS_QPT_DRIVER => "DRIVER",
        n => return format!("UNKNOWN({n})"),
    };
    name.to_string()
}

/// The QP state's name (ib_verbs.h, enum ib_qp_state; iproute2's `qp_states_to_str`).
pub fn qp_state_name(state: u8) -> String {
    const NAMES: [&str; 7] = ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"];
    match NAMES.get(usize::from(state)) {
        Some(name) => (*name).to_string(),
        None => format!("UNKNOWN({state})"),
    }
}

/// enum ib_qp_state: the states before the QP has its remote end (RTR sets it).
pub const QP_STATE_RESET: u8 = 0;
pub const QP_STATE_INIT: u8 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_types_split_back_into_client_and_op() {
        let kind = nldev_type(RDMA_NLDEV_CMD_RES_QP_GET);
        assert_eq!(kind, 0x140a);
        assert_eq!(nl_client(kind), RDMA_NL_NLDEV);
        assert_eq!(nldev_op(kind), RDMA_NLDEV_CMD_RES_QP_GET);
    }

    #[test]
    fn names_follow_iproute2() {
        assert_eq!(qp_type_name(1), "GSI");
        assert_eq!(qp_type_name(2), "RC");
        assert_eq!(qp_type_name(7), "UNKNOWN(7)");
        assert_eq!(qp_type_name(0xff), "DRIVER");
        assert_eq!(qp_type_name(0x20), "UNKNOWN(32)");
        assert_eq!(qp_state_name(3), "RTS");
        assert_eq!(qp_state_name(6), "ERR");
        assert_eq!(qp_state_name(7), "UNKNOWN(7)");
    }

    #[test]
    fn every_name_is_listed_once() {
        let mut names: Vec<&str> = KERNEL_NUMBERS.iter().map(|(n, _)| *n).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all);
    }
}
