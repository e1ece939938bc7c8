//! dcbnl against the real kernel, in a network namespace the test creates (deleted
//! by its guard, also when an assertion fails): virtual devices have no DCB, so
//! `query` gets EOPNOTSUPP (`DcbError::Unsupported`), which `audit` turns into one
//! `dcb_unsupported` Info finding; a name no device has gives `NoDevice`; the SET
//! path (acknowledged requests) gets the same answers, and `EPERM` without
//! CAP_NET_ADMIN while a GET still needs no privilege. iproute2's `dcb` is the
//! oracle for "no DCB". Needs root and iproute2.

use anyhow::{bail, Result};
use roce_agent::audit::dcb::{self, DcbApp, DcbError, IeeePfc};
use roce_agent::doc::finding::Severity;
use roce_common::policy::Policy;
use roce_testkit::netns::{unique_name, Netns};

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the dcbnl tests need root (ip netns, devices in a namespace)"
    );
}

/// A namespace with a veth pair (dcb0, dcb1) and a VXLAN device (vx0).
fn namespace() -> Result<Netns> {
    let (name, _) = unique_name("roce-dcb-");
    let ns = Netns::create_without_ipv6(name)?;
    ns.ip(&[
        "link", "add", "dcb0", "type", "veth", "peer", "name", "dcb1",
    ])?;
    ns.ip(&[
        "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789", "dev", "dcb0",
    ])?;
    Ok(ns)
}

#[test]
fn virtual_devices_have_no_dcb_and_the_audit_says_so_at_info() -> Result<()> {
    require_root();
    let ns = namespace()?;
    for dev in ["dcb0", "vx0", "lo"] {
        let state = ns.enter(|| dcb::query(dev))?;
        assert!(
            matches!(state, Err(DcbError::Unsupported)),
            "{dev}: {state:?}"
        );
        let findings = dcb::audit(dev, &state, &Policy::default());
        assert_eq!(findings.len(), 1, "{dev}: {findings:#?}");
        let f = &findings[0];
        assert_eq!(f.check, "dcb_unsupported");
        assert_eq!(f.severity, Severity::Info);
        assert_eq!(f.interface.as_deref(), Some(dev));
        assert!(
            f.found.starts_with(&format!("{dev} has no DCB")),
            "{}",
            f.found
        );
    }
    // The oracle: iproute2's dcb gets the same answer.
    let out = ns.cmd("dcb", &["app", "show", "dev", "dcb0"]).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "dcb app show succeeded on a veth");
    assert!(
        stderr.contains("Operation not supported"),
        "dcb app show: {stderr}"
    );
    Ok(())
}

#[test]
fn a_missing_device_is_no_device() -> Result<()> {
    require_root();
    let ns = namespace()?;
    let state = ns.enter(|| dcb::query("nosuchdev0"))?;
    assert!(matches!(state, Err(DcbError::NoDevice)), "{state:?}");
    let findings = dcb::audit("nosuchdev0", &state, &Policy::default());
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0].severity, Severity::Error);
    assert!(
        findings[0]
            .found
            .contains("dcbnl on nosuchdev0: no such device"),
        "{}",
        findings[0].found
    );
    Ok(())
}

#[test]
fn sets_are_acknowledged_with_the_same_answers() -> Result<()> {
    require_root();
    let ns = namespace()?;
    let apps = [DcbApp::dscp(26, 3)];
    let pfc = IeeePfc {
        enabled: 1 << 3,
        ..IeeePfc::default()
    };
    let answers = ns.enter(|| {
        [
            dcb::set_apps("dcb0", &apps),
            dcb::delete_apps("dcb0", &apps),
            dcb::set_pfc("dcb0", &pfc),
            dcb::set_apps("nosuchdev0", &apps),
        ]
    })?;
    let [set, del, pfc, missing] = answers;
    assert!(matches!(set, Err(DcbError::Unsupported)), "{set:?}");
    assert!(matches!(del, Err(DcbError::Unsupported)), "{del:?}");
    assert!(matches!(pfc, Err(DcbError::Unsupported)), "{pfc:?}");
    assert!(matches!(missing, Err(DcbError::NoDevice)), "{missing:?}");
    Ok(())
}

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` (capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_NET_ADMIN: u32 = 12;

/// Drops CAP_NET_ADMIN from the calling thread only (credentials are per thread;
/// the thread `Netns::enter` runs ends right after).
fn drop_net_admin_from_this_thread() -> Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget/capset with a version-3 header and the two data words it needs.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
            bail!("capget: {}", std::io::Error::last_os_error());
        }
        data[0].effective &= !(1 << CAP_NET_ADMIN);
        data[0].permitted &= !(1 << CAP_NET_ADMIN);
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            bail!("capset: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[test]
fn without_cap_net_admin_a_set_is_refused_and_a_get_still_answers() -> Result<()> {
    require_root();
    let ns = namespace()?;
    let (get, set) = ns.enter(|| -> Result<_> {
        drop_net_admin_from_this_thread()?;
        Ok((
            dcb::query("dcb0"),
            dcb::set_apps("dcb0", &[DcbApp::dscp(26, 3)]),
        ))
    })??;
    // dcb_doit checks CAP_NET_ADMIN on RTM_SETDCB before it looks for the device.
    assert!(matches!(set, Err(DcbError::Permission)), "{set:?}");
    assert!(matches!(get, Err(DcbError::Unsupported)), "{get:?}");
    Ok(())
}
