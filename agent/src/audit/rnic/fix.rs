//! `check --fix` and `--dry-run` on the RNIC's ECN knobs and the rdma_cm ToS: what
//! would be written where ([`plan_fix`], [`KnobWrite`]), and the writes themselves
//! ([`fix`]), each read back.

use super::*;

/// One knob `fix` writes: the policy's value into a file the audit flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobWrite {
    /// The check whose finding this answers.
    pub check: &'static str,
    pub interface: String,
    /// The file written, under the root.
    pub path: PathBuf,
    /// The same file as the host names it (`/sys/...`): the `Change`'s `what`.
    pub host_path: PathBuf,
    /// A directory to make first: rdma_cm's configfs group of the device (on configfs,
    /// making `DEV` creates `DEV/ports/N/...`; in a fixture the whole path is made).
    pub make_dir: Option<PathBuf>,
    /// What the knob held, as the `Change` shows it.
    pub before: String,
    pub value: u8,
}

impl KnobWrite {
    /// The shell command that makes this write on the host, as the finding's fix says
    /// it: `echo 1 > /sys/class/net/eth1/ecn/roce_np/enable/3`, after `mkdir -p` of
    /// rdma_cm's group of the device when the write makes it (`check --dry-run`).
    pub fn command(&self) -> String {
        let echo = format!("echo {} > {}", self.value, self.host_path.display());
        // host_path: /sys/kernel/config/rdma_cm/DEV/ports/N/default_roce_tos.
        match (&self.make_dir, self.host_path.ancestors().nth(3)) {
            (Some(_), Some(group)) => format!("mkdir -p {} && {echo}", group.display()),
            _ => echo,
        }
    }

    /// Writes the value as `echo` does and reads it back.
    pub fn apply(&self) -> Result<Change, RnicError> {
        let not_written = |path: &Path, e: io::Error| RnicError::NotWritten {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        if let Some(dir) = &self.make_dir {
            fs::create_dir_all(dir).map_err(|e| not_written(dir, e))?;
        }
        // A missing knob is an error, never a new file. The exception is the file of a
        // group just made: configfs makes it itself (O_CREAT on it changes nothing there),
        // a fixture tree needs it made.
        let mut file = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .create(self.make_dir.is_some())
            .open(&self.path)
            .map_err(|e| not_written(&self.path, e))?;
        // One write call: a sysfs store sees exactly one buffer.
        file.write_all(format!("{}\n", self.value).as_bytes())
            .map_err(|e| not_written(&self.path, e))?;
        drop(file);
        match read_tos(&self.path) {
            Ok(v) if v == self.value => Ok(Change {
                check: self.check.to_string(),
                interface: self.interface.clone(),
                what: self.host_path.display().to_string(),
                before: self.before.clone(),
                after: self.value.to_string(),
            }),
            Ok(v) => Err(RnicError::NotApplied {
                path: self.path.clone(),
                wrote: self.value,
                reads: v.to_string(),
            }),
            Err(e) => Err(RnicError::NotApplied {
                path: self.path.clone(),
                wrote: self.value,
                reads: e.to_string(),
            }),
        }
    }
}

/// What a knob held, for a `Change`'s before.
fn before_text<T: ToString>(read: &Result<T, RnicError>) -> String {
    match read {
        Ok(v) => v.to_string(),
        Err(RnicError::Unreadable { problem, .. }) => format!("unreadable ({problem})"),
        Err(e) => e.to_string(),
    }
}

fn knob_write(
    check: &'static str,
    interface: &str,
    root: &Path,
    knob: &Knob,
    before: String,
    value: u8,
) -> KnobWrite {
    KnobWrite {
        check,
        interface: interface.to_string(),
        path: knob.under(root),
        host_path: knob.on_host(),
        make_dir: None,
        before,
        value,
    }
}

/// The writes that would make `interfaces` pass the RNIC audit, or why one cannot be
/// planned. Every knob the audit flags is written, an unreadable one included (the
/// value read back tells whether it took).
pub fn plan_fix(
    root: &Path,
    interfaces: &[String],
    policy: &Policy,
) -> Vec<Result<KnobWrite, RnicError>> {
    let interfaces = distinct(interfaces);
    let mut plan = Vec::new();
    for netdev in &interfaces {
        let knobs = match read_ecn_knobs(root, netdev) {
            Ok(Some(knobs)) => knobs,
            Ok(None) => continue,
            Err(e) => {
                plan.push(Err(e));
                continue;
            }
        };
        for side in [Side::Np, Side::Rp] {
            for p in lossless_priorities(policy) {
                let enable = &knobs.enable(side)[p];
                if *enable != Ok(true) {
                    let before = before_text(&enable.clone().map(u8::from));
                    let knob = side.enable_knob(netdev, p);
                    plan.push(Ok(knob_write(side.check(), netdev, root, &knob, before, 1)));
                }
            }
        }
        let want = policy.qos.cnp_dscp;
        if knobs.cnp_dscp != Ok(want) {
            let before = before_text(&knobs.cnp_dscp);
            plan.push(Ok(knob_write(
                "cnp_dscp",
                netdev,
                root,
                &cnp_dscp_knob(netdev),
                before,
                want,
            )));
        }
    }
    let ports = match read_rnic_ports(root) {
        Ok(ports) => ports,
        Err(e) => {
            plan.push(Err(e));
            return plan;
        }
    };
    let want = roce_tos_for(policy.qos.roce_dscp);
    for (port, netdev) in audited_ports(&ports, &interfaces) {
        let (before, make_dir) = match &port.default_roce_tos {
            Ok(tos) if tos.value() == want => continue,
            Ok(RoceTos::Unset) => (
                "0 (unset)".to_string(),
                Some(root.join(format!(
                    "kernel/config/rdma_cm/{}/ports/{}",
                    port.device, port.port
                ))),
            ),
            other => (before_text(&other.clone().map(RoceTos::value)), None),
        };
        let knob = roce_tos_knob(&port.device, port.port);
        plan.push(Ok(KnobWrite {
            make_dir,
            ..knob_write("roce_tos", netdev, root, &knob, before, want)
        }));
    }
    plan
}

/// Writes what [`plan_fix`] plans, on `interfaces` only: one result per knob, a
/// [`Change`] (before/after) for each that was written and took, an error naming the
/// file for each that was not. A failed knob does not stop the others.
pub fn fix(root: &Path, interfaces: &[String], policy: &Policy) -> Vec<Result<Change, RnicError>> {
    plan_fix(root, interfaces, policy)
        .into_iter()
        .map(|planned| planned.and_then(|w| w.apply()))
        .collect()
}
