//! BPF_PROG_TEST_RUN: run a loaded program on one packet in the kernel, without any
//! interface. aya 0.14 has no wrapper, so this is the raw `bpf(2)` call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// What one test run returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRunOutput {
    /// The program's return code (an XDP or TC action).
    pub retval: u32,
    /// The packet as the program left it.
    pub data: Vec<u8>,
    /// The context (e.g. `__sk_buff`) as the program left it, when one was asked for.
    pub ctx: Vec<u8>,
    /// Mean run time in ns over `repeat` runs.
    pub duration_ns: u32,
}

/// Input of one test run.
#[derive(Clone, Copy, Debug, Default)]
pub struct TestRun<'a> {
    pub data: &'a [u8],
    /// Runs of the same packet (0 and 1 both mean once).
    pub repeat: u32,
    /// Context in (e.g. an `__sk_buff` with mark/priority), if any.
    pub ctx_in: Option<&'a [u8]>,
    /// Bytes of context to read back (192 for `__sk_buff`); 0 for none.
    pub ctx_out_len: usize,
}

/// Runs `prog` on `run.data` through BPF_PROG_TEST_RUN.
pub fn test_run(prog: BorrowedFd<'_>, run: &TestRun<'_>) -> io::Result<TestRunOutput> {
    check_input(run.data)?;
    // Room for programs that grow the packet (encapsulation) as well.
    let mut out = vec![0u8; run.data.len() + 512];
    let mut ctx_out = vec![0u8; run.ctx_out_len];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: run.data.len() as u32,
        data_size_out: out.len() as u32,
        data_in: run.data.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: run.repeat,
        ..Default::default()
    };
    if let Some(ctx) = run.ctx_in {
        attr.ctx_size_in = ctx.len() as u32;
        attr.ctx_in = ctx.as_ptr() as u64;
    }
    if !ctx_out.is_empty() {
        attr.ctx_size_out = ctx_out.len() as u32;
        attr.ctx_out = ctx_out.as_mut_ptr() as u64;
    }
    // SAFETY: attr points at valid buffers of the sizes given, alive for the call.
    unsafe { bpf_test_run(&mut attr)? };
    out.truncate(attr.data_size_out as usize);
    ctx_out.truncate(attr.ctx_size_out as usize);
    Ok(TestRunOutput {
        retval: attr.retval,
        data: out,
        ctx: ctx_out,
        duration_ns: attr.duration,
    })
}

/// Runs `prog` once on `data` and returns only its return code: no output buffers,
/// so the kernel copies nothing back (`analyze`'s kernel engine runs every frame of
/// a capture through here).
pub fn run_once(prog: BorrowedFd<'_>, data: &[u8]) -> io::Result<u32> {
    check_input(data)?;
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: attr points at `data`, alive for the call; no output buffer is given.
    unsafe { bpf_test_run(&mut attr)? };
    Ok(attr.retval)
}

/// Frames shorter than an Ethernet header: the kernel answers EINVAL; say why.
fn check_input(data: &[u8]) -> io::Result<()> {
    if data.len() < 14 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "BPF_PROG_TEST_RUN needs at least 14 bytes",
        ));
    }
    Ok(())
}

/// The BPF_PROG_TEST_RUN syscall on `attr`.
///
/// # Safety
/// Every buffer `attr` points at is valid for its size and alive for the call.
unsafe fn bpf_test_run(attr: &mut TestRunAttr) -> io::Result<()> {
    // SAFETY: the caller's promise, passed on.
    unsafe { crate::sys::bpf(BPF_PROG_TEST_RUN, attr) }.map(drop)
}
