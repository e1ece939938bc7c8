//! The programs of a loaded object: their fds (BPF_PROG_TEST_RUN, tc), attaching
//! `xdp_classify` (native, generic, or adopted: swapped into an earlier agent's pinned
//! link), pinning programs and links, pruning stale links, detaching, and TC_TAIL's
//! `tc_egress_flows` slot.

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{MapData, MapError, ProgramArray};
use aya::programs::links::FdLink;
use aya::programs::xdp::XdpLinkId;
use aya::programs::{SchedClassifier, Xdp, XdpMode};
use aya::Ebpf;
use roce_common::names::map;
use roce_common::names::program::{XDP_COUNT, XDP_COUNT_MIRROR, XDP_MIRROR_FLOWS};
use roce_common::names::tail::{
    TC_TAIL_EGRESS_FLOWS, XDP_TAIL_CLASSIFY, XDP_TAIL_COUNT, XDP_TAIL_COUNT_MIRROR,
    XDP_TAIL_MIRROR_FLOWS,
};

use super::{
    map_error, program_error, typed_map_mut, typed_program, typed_program_mut, LoadError, Loaded,
    TC_EGRESS, TC_EGRESS_FLOWS, TC_INGRESS, XDP_BASELINE, XDP_MIRROR, XDP_PROGRAM,
};
use crate::datapath::pin::{self, PinDir};

/// How an XDP program ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    Native,
    Generic,
    /// A pinned link of an earlier agent now runs this program (its mode unchanged).
    Adopted,
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Adopted => "adopted",
        })
    }
}

impl Loaded {
    /// The loaded XDP program, for BPF_PROG_TEST_RUN.
    pub fn xdp_fd(&self) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &Xdp = typed_program(&self.ebpf, XDP_PROGRAM)?;
        Ok(prog.fd().map_err(program_error(XDP_PROGRAM))?.as_fd())
    }

    /// The instructions the verifier processed to load program `name` (the kernel's
    /// `verified_insns`, 5.16 and later), to watch the headroom below its limit.
    pub fn verified_insns(&self, name: &'static str) -> Result<Option<u32>, LoadError> {
        let prog = self.ebpf.program(name).ok_or(LoadError::Missing(name))?;
        let info = prog.info().map_err(program_error(name))?;
        Ok(info.verified_instruction_count())
    }

    /// XDP program `name`, once loaded (BPF_PROG_TEST_RUN of `xdp_mirror`).
    pub fn loaded_xdp_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &Xdp = typed_program(&self.ebpf, name)?;
        Ok(prog.fd().map_err(program_error(name))?.as_fd())
    }

    /// `xdp_mirror`, loaded (and pinned, with pins) the first time it is asked for:
    /// a datapath without mirror interfaces never verifies it.
    /// What it tail-calls goes into XDP_TAIL first: `xdp_mirror_flows` for a copy (and
    /// `xdp_count_mirror` after it), `xdp_classify` (loaded with the object) for any
    /// other frame.
    pub fn xdp_mirror_fd(&mut self) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, XDP_MIRROR)?;
        if prog.fd().is_err() {
            load_into_xdp_tail(&mut self.ebpf, XDP_COUNT_MIRROR, XDP_TAIL_COUNT_MIRROR)?;
            load_into_xdp_tail(&mut self.ebpf, XDP_MIRROR_FLOWS, XDP_TAIL_MIRROR_FLOWS)?;
            let classify: &Xdp = typed_program(&self.ebpf, XDP_PROGRAM)?;
            let classify = classify
                .fd()
                .map_err(program_error(XDP_PROGRAM))?
                .try_clone()
                .map_err(|source| LoadError::Fd {
                    name: XDP_PROGRAM,
                    source,
                })?;
            let mut tail: ProgramArray<&mut MapData> =
                typed_map_mut(&mut self.ebpf, map::XDP_TAIL)?;
            tail.set(XDP_TAIL_CLASSIFY, &classify, 0)
                .map_err(map_error(map::XDP_TAIL))?;
            let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, XDP_MIRROR)?;
            prog.load().map_err(program_error(XDP_MIRROR))?;
            self.pin_program(XDP_MIRROR)?;
        }
        let prog: &Xdp = typed_program(&self.ebpf, XDP_MIRROR)?;
        Ok(prog.fd().map_err(program_error(XDP_MIRROR))?.as_fd())
    }

    /// Loads the empty baseline program (benchmarks) and returns its fd.
    pub fn baseline_xdp_fd(&mut self) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, XDP_BASELINE)?;
        if prog.fd().is_err() {
            prog.load().map_err(program_error(XDP_BASELINE))?;
        }
        Ok(prog.fd().map_err(program_error(XDP_BASELINE))?.as_fd())
    }

    /// Loads a tc program of the object (once) and returns its fd.
    pub fn tc_fd(&mut self, name: &'static str) -> Result<BorrowedFd<'_>, LoadError> {
        let prog: &mut SchedClassifier = typed_program_mut(&mut self.ebpf, name)?;
        if prog.fd().is_err() {
            prog.load().map_err(program_error(name))?;
        }
        Ok(prog.fd().map_err(program_error(name))?.as_fd())
    }

    /// A loaded tc program, for attaching.
    pub fn tc_program(&mut self, name: &'static str) -> Result<&mut SchedClassifier, LoadError> {
        self.tc_fd(name)?;
        typed_program_mut(&mut self.ebpf, name)
    }

    /// Attaches `xdp_classify` to `ifname`: see [`Self::attach_xdp_program`].
    pub fn attach_xdp(&mut self, ifname: &str) -> Result<AttachMode, LoadError> {
        self.attach_xdp_program(ifname, XDP_PROGRAM)
    }

    /// Attaches `program` (`xdp_classify`, or `xdp_mirror` on a mirror collector
    /// interface) to `ifname`: native mode, or generic mode when the driver has no
    /// native XDP. With pins: a link pinned for this interface gets the new program in
    /// place (no packet goes unclassified), also a link of the other XDP program (the
    /// interface became, or stopped being, a mirror interface: the link's pin is
    /// renamed); a new link is pinned.
    pub fn attach_xdp_program(
        &mut self,
        ifname: &str,
        program: &'static str,
    ) -> Result<AttachMode, LoadError> {
        let Some(ifindex) = crate::sys::netif::index_of(ifname) else {
            return Err(LoadError::NoInterface(ifname.to_string()));
        };
        if program == XDP_MIRROR {
            self.xdp_mirror_fd()?;
        }
        if self.adopt_link(program, ifindex)? {
            return Ok(AttachMode::Adopted);
        }
        let other = if program == XDP_MIRROR {
            XDP_PROGRAM
        } else {
            XDP_MIRROR
        };
        if self.adopt_link_of(other, program, ifindex)? {
            return Ok(AttachMode::Adopted);
        }
        let prog: &mut Xdp = typed_program_mut(&mut self.ebpf, program)?;
        let (link, mode) = match prog.attach(ifname, XdpMode::Driver) {
            Ok(link) => (link, AttachMode::Native),
            Err(native) => {
                tracing::info!(interface = ifname, error = %native, "native XDP refused, falling back to generic mode");
                let link = prog
                    .attach(ifname, XdpMode::Skb)
                    .map_err(program_error(program))?;
                (link, AttachMode::Generic)
            }
        };
        if self.pins.is_some() {
            let owned = prog.take_link(link).map_err(program_error(program))?;
            self.pin_link(program, ifindex, owned)?;
        } else {
            self.attached.push((ifname.to_string(), program, link));
        }
        Ok(mode)
    }

    /// With pins, when `was` has a live pinned link on `ifindex`: swaps `program` into
    /// it and renames its pin to `program`'s; says true.
    fn adopt_link_of(
        &self,
        was: &'static str,
        program: &'static str,
        ifindex: u32,
    ) -> Result<bool, LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(false);
        };
        let Some(link) = pins.live_link(was, ifindex)? else {
            return Ok(false);
        };
        let prog = self
            .ebpf
            .program(program)
            .ok_or(LoadError::Missing(program))?;
        let prog_fd = prog.fd().map_err(program_error(program))?;
        pin::link_update(link.as_fd(), prog_fd.as_fd()).map_err(|source| LoadError::Link {
            what: format!("updating the pinned link of {was} on ifindex {ifindex} to {program}"),
            source,
        })?;
        let (from, to) = (pins.link(was, ifindex), pins.link(program, ifindex));
        std::fs::rename(&from, &to).map_err(|source| LoadError::Link {
            what: format!("renaming the pin {} to {}", from.display(), to.display()),
            source,
        })?;
        Ok(true)
    }

    /// With pins, when `program` has a live pinned link on `ifindex`: swaps the
    /// program inside it (BPF_LINK_UPDATE, atomic) and says true.
    pub fn adopt_link(&self, program: &'static str, ifindex: u32) -> Result<bool, LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(false);
        };
        let Some(link) = pins.live_link(program, ifindex)? else {
            return Ok(false);
        };
        let prog = self
            .ebpf
            .program(program)
            .ok_or(LoadError::Missing(program))?;
        let prog_fd = prog.fd().map_err(program_error(program))?;
        pin::link_update(link.as_fd(), prog_fd.as_fd()).map_err(|source| LoadError::Link {
            what: format!("updating the pinned link of {program} on ifindex {ifindex}"),
            source,
        })?;
        Ok(true)
    }

    /// Pins `link`, just made for `program` on `ifindex` (an XDP or a TCX link): it
    /// outlives this process from now on. Without pins it is dropped, and detaches.
    pub fn pin_link<L>(&self, program: &'static str, ifindex: u32, link: L) -> Result<(), LoadError>
    where
        FdLink: TryFrom<L, Error = aya::programs::links::LinkError>,
    {
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        let link = FdLink::try_from(link).map_err(|e| LoadError::Link {
            what: format!("the link of {program} on ifindex {ifindex} is not a bpf_link"),
            source: std::io::Error::other(e),
        })?;
        let path = pins.link(program, ifindex);
        link.pin(&path).map_err(|source| LoadError::Pinning {
            what: program,
            path,
            source,
        })?;
        Ok(())
    }

    /// Whether maps, programs and links are pinned.
    pub fn pinned(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    /// Detaches and unpins every pinned link that is not in `keep` (program,
    /// ifindex): interfaces that left the configuration, or went away. Returns what
    /// it removed.
    pub fn prune_links(&self, keep: &[(&str, u32)]) -> Result<Vec<String>, LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        for l in pins.pinned_links()? {
            let wanted = keep
                .iter()
                .any(|(p, i)| *p == l.program && *i == l.ifindex && *i != 0);
            if !wanted {
                pin::remove_link(&l.path, l.fd.as_fd())?;
                removed.push(l.path.display().to_string());
            }
        }
        Ok(removed)
    }

    /// Loads the attachable programs and pins them (replacing an earlier agent's
    /// pins: its links keep the old programs until they are swapped).
    pub(super) fn pin_programs(&mut self) -> Result<(), LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        let paths: Vec<(&'static str, std::path::PathBuf)> =
            [XDP_PROGRAM, TC_EGRESS, TC_EGRESS_FLOWS, TC_INGRESS]
                .into_iter()
                .map(|n| (n, pins.program(n)))
                .collect();
        self.tc_fd(TC_EGRESS)?;
        self.tc_fd(TC_INGRESS)?;
        for (name, _) in paths {
            self.pin_program(name)?;
        }
        Ok(())
    }

    /// Pins loaded program `name` (replacing an earlier agent's pin), with pins.
    fn pin_program(&mut self, name: &'static str) -> Result<(), LoadError> {
        let Some(pins) = &self.pins else {
            return Ok(());
        };
        let path = pins.program(name);
        if path.exists() {
            std::fs::remove_file(&path).map_err(|source| LoadError::Link {
                what: format!("removing the old pin {}", path.display()),
                source,
            })?;
        }
        let prog = self
            .ebpf
            .program_mut(name)
            .ok_or(LoadError::Missing(name))?;
        prog.pin(&path).map_err(|source| LoadError::Pinning {
            what: name,
            path: path.clone(),
            source,
        })
    }

    /// Detaches the XDP link this process made on `ifname` (a pinned one stays: the
    /// caller prunes pins).
    pub fn detach_xdp(&mut self, ifname: &str) {
        let Some(at) = self.attached.iter().position(|(n, _, _)| n == ifname) else {
            return;
        };
        let (_, program, link) = self.attached.remove(at);
        detach_link(&mut self.ebpf, ifname, program, link);
    }

    /// Detaches every XDP link this process made.
    pub fn detach_all(&mut self) {
        let links: Vec<_> = self.attached.drain(..).collect();
        for (ifname, program, link) in links {
            detach_link(&mut self.ebpf, &ifname, program, link);
        }
    }

    /// Fills (or empties) the TC_TAIL slot of `tc_egress_flows`. Emptied, `tc_egress`
    /// decides and rewrites as before but counts no egress flow (its tail call finds
    /// nothing): the benchmarks measure the policy decision alone that way. A load
    /// fills it.
    pub fn set_egress_flow_counting(&mut self, on: bool) -> Result<(), LoadError> {
        set_egress_flows_slot(&mut self.ebpf, on)
    }
}

/// Loads `xdp_count` and puts it into XDP_TAIL, where `xdp_classify` tail-calls it
/// for every RoCE packet (without it, no flow is counted: `flow_insert_failed`).
pub(super) fn load_xdp_count(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    load_into_xdp_tail(ebpf, XDP_COUNT, XDP_TAIL_COUNT)
}

/// Loads XDP program `name` and puts it into XDP_TAIL's `slot`.
fn load_into_xdp_tail(ebpf: &mut Ebpf, name: &'static str, slot: u32) -> Result<(), LoadError> {
    let prog: &mut Xdp = typed_program_mut(ebpf, name)?;
    prog.load().map_err(program_error(name))?;
    let fd = prog
        .fd()
        .map_err(program_error(name))?
        .try_clone()
        .map_err(|source| LoadError::Fd { name, source })?;
    let mut tail: ProgramArray<&mut MapData> = typed_map_mut(ebpf, map::XDP_TAIL)?;
    tail.set(slot, &fd, 0).map_err(map_error(map::XDP_TAIL))
}

/// Detaches `link` of XDP program `program` from `ifname`, logging a failure.
fn detach_link(ebpf: &mut Ebpf, ifname: &str, program: &'static str, link: XdpLinkId) {
    let detached = typed_program_mut::<&mut Xdp>(ebpf, program)
        .and_then(|prog| prog.detach(link).map_err(program_error(program)));
    if let Err(e) = detached {
        tracing::warn!(interface = %ifname, error = %e, "detaching XDP failed");
    }
}

/// Fills TC_TAIL's `tc_egress_flows` slot with the loaded program (`on`), or empties it.
pub(super) fn set_egress_flows_slot(ebpf: &mut Ebpf, on: bool) -> Result<(), LoadError> {
    let flows_fd = if on {
        let prog: &SchedClassifier = typed_program(ebpf, TC_EGRESS_FLOWS)?;
        let fd = prog.fd().map_err(program_error(TC_EGRESS_FLOWS))?;
        Some(fd.try_clone().map_err(|source| LoadError::Fd {
            name: TC_EGRESS_FLOWS,
            source,
        })?)
    } else {
        None
    };
    let mut tail: ProgramArray<&mut MapData> = typed_map_mut(ebpf, map::TC_TAIL)?;
    match flows_fd {
        Some(fd) => tail.set(TC_TAIL_EGRESS_FLOWS, &fd, 0),
        None => match tail.clear_index(&TC_TAIL_EGRESS_FLOWS) {
            Err(MapError::KeyNotFound) => Ok(()),
            other => other,
        },
    }
    .map_err(map_error(map::TC_TAIL))
}
