//! Running an engine on several CPUs: one thread reads the capture in batches, says
//! which worker counts each frame ([`Split`]) and hands each batch to every worker; a
//! worker walks and counts its own frames ([`Work::process`]).

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread;

use super::capture::{Batch, CaptureReader, Format, UnsupportedLink};
use super::engine::{pin_to_cpu, Split, Work};
use super::AnalyzeError;

/// Batches queued for each worker: enough to keep it busy, few enough to keep
/// memory small (a batch holds about one read, `capture::READ_BYTES`).
const DEPTH: usize = 4;

/// What the reader saw.
pub struct ReadEnd {
    pub frames: u64,
    pub format: Format,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Frames skipped: pcapng interfaces of a link type not read.
    pub unsupported: Vec<UnsupportedLink>,
    /// Why reading stopped early.
    pub error: Option<AnalyzeError>,
}

/// A finished run: the workers (what they counted), what the reader saw, and the
/// first error that stopped the run (a worker's before the reader's).
pub struct Run<W> {
    pub workers: Vec<W>,
    pub read: ReadEnd,
    pub error: Option<AnalyzeError>,
}

/// How the reader treats the ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icrc {
    /// Checked by the reader when the workers are the slower side, else by them.
    Balance,
    /// Not checked (the workers do not tally).
    Skip,
}

/// Reads every batch of `reader` and sends it to every worker, until the end, an
/// error, or a worker that stopped.
fn read_all(
    mut reader: CaptureReader,
    split: &Split<'_>,
    icrc: Icrc,
    txs: Vec<SyncSender<Arc<Batch>>>,
    progress: Option<indicatif::ProgressBar>,
) -> ReadEnd {
    // Batches come back to the pool once every worker has dropped them; workers
    // take them in order, so the oldest is freed first.
    let mut pool: VecDeque<Arc<Batch>> = VecDeque::new();
    let (mut first_ns, mut last_ns, mut error) = (None, None, None);
    loop {
        let free = pool.front().is_some_and(|a| Arc::strong_count(a) == 1);
        let mut batch = if free {
            pool.pop_front()
                .and_then(|a| Arc::try_unwrap(a).ok())
                .unwrap_or_default()
        } else {
            Batch::default()
        };
        match reader.fill(&mut batch) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                error = Some(e);
                break;
            }
        }
        // Workers still on two batches or more are the slower side: take their ICRC
        // work on (each batch is walked by this thread anyway).
        let behind = pool.iter().filter(|a| Arc::strong_count(a) > 1).count() >= 2;
        split.assign(&mut batch, icrc == Icrc::Balance && behind);
        first_ns = first_ns.or(Some(batch.frame(0).ts_ns));
        last_ns = Some(batch.frame(batch.len() - 1).ts_ns);
        let batch = Arc::new(batch);
        // A worker that stopped (its error ends the run) closed its queue.
        if txs.iter().any(|tx| tx.send(batch.clone()).is_err()) {
            break;
        }
        pool.push_back(batch);
        if let Some(pb) = &progress {
            pb.set_position(reader.position().0);
        }
    }
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    ReadEnd {
        frames: reader.frames(),
        format: reader.format(),
        first_ns,
        last_ns,
        unsupported: reader.unsupported().to_vec(),
        error,
    }
}

/// Runs `workers` over the capture, each (with a CPU) pinned to it, the frames
/// assigned by `split` (which must split between `workers.len()` workers).
pub fn run<W: Work>(
    reader: CaptureReader,
    split: &Split<'_>,
    icrc: Icrc,
    workers: Vec<(W, Option<usize>)>,
    progress: bool,
) -> Run<W> {
    let format = reader.format();
    let progress = super::progress_bar(progress, reader.position().1);
    let (txs, rxs): (Vec<_>, Vec<_>) = workers.iter().map(|_| sync_channel(DEPTH)).unzip();
    thread::scope(|s| {
        let reading = s.spawn(move || read_all(reader, split, icrc, txs, progress));
        let handles: Vec<_> = workers
            .into_iter()
            .zip(rxs)
            .map(|((w, cpu), rx)| s.spawn(move || work(w, rx, cpu)))
            .collect();
        let mut done = Vec::with_capacity(handles.len());
        let mut error = None;
        for h in handles {
            match h.join() {
                Ok(Ok(w)) => done.push(w),
                Ok(Err(e)) => error = error.or(Some(e)),
                Err(_) => error = error.or(Some(AnalyzeError::Worker)),
            }
        }
        let read = reading.join().unwrap_or_else(|_| ReadEnd {
            frames: 0,
            format,
            first_ns: None,
            last_ns: None,
            unsupported: Vec::new(),
            error: Some(AnalyzeError::Worker),
        });
        Run {
            workers: done,
            read,
            error,
        }
    })
}

/// One worker's thread: every batch, until the reader closes the queue (or this
/// worker fails: its queue closes and the reader stops).
fn work<W: Work>(
    mut w: W,
    rx: Receiver<Arc<Batch>>,
    pin: Option<usize>,
) -> Result<W, AnalyzeError> {
    if let Some(cpu) = pin {
        pin_to_cpu(cpu)?;
    }
    for batch in rx {
        w.process(&batch)?;
    }
    Ok(w)
}
