//! Running the engine on several CPUs: one thread reads the capture in batches, says
//! which worker counts each frame ([`Split`]) and hands each batch to every worker; a
//! worker walks and counts its own frames ([`Worker::process`]). With the kernel
//! engine the programs load while the reader fills the workers' queues, and each
//! worker is pinned to a CPU.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread;

use super::capture::{Batch, CaptureReader, Format};
use super::engine::{load_kernel, pin_to_cpu, Engine, Shard, Split, Worker};
use super::{AnalyzeError, AnalyzeOptions};
use crate::loader::{LoadError, Loaded};

/// Batches queued for each worker: enough to keep it busy, few enough to keep
/// memory small (a batch holds about one read, `capture::READ_BYTES`).
const DEPTH: usize = 4;

/// What the reader saw.
pub struct ReadEnd {
    pub frames: u64,
    pub format: Format,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Why reading stopped early.
    pub error: Option<AnalyzeError>,
}

/// A finished run: the workers' shards, what the reader saw, the first error that
/// stopped the run (a worker's before the reader's), and the kernel engine's loaded
/// programs (to read their maps).
pub struct Run {
    pub shards: Vec<Shard>,
    pub read: ReadEnd,
    pub error: Option<AnalyzeError>,
    pub loaded: Option<Loaded>,
}

/// Reads every batch of `reader` and sends it to every worker, until the end, an
/// error, or a worker that stopped.
fn read_all(
    mut reader: CaptureReader,
    split: &Split<'_>,
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
        // work on (each batch is assigned by this thread anyway).
        let behind = pool.iter().filter(|a| Arc::strong_count(a) > 1).count() >= 2;
        split.assign(&mut batch, behind);
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
        error,
    }
}

/// Runs `engine` over the capture with `workers` workers (kernel engine: worker `i`
/// pinned to `cpus[i % cpus.len()]`). Errors before the first frame (the kernel
/// engine cannot load) are `Err`.
pub fn run(
    reader: CaptureReader,
    engine: Engine,
    workers: usize,
    cpus: &[usize],
    opts: &AnalyzeOptions,
) -> Result<Run, AnalyzeError> {
    let workers = workers.max(1);
    let format = reader.format();
    let progress = super::progress_bar(opts.progress, reader.position().1);
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..workers).map(|_| sync_channel(DEPTH)).unzip();
    let cfg = opts.load.config;
    let policy = &opts.policy;
    let split = Split::new(workers, cfg, policy);
    thread::scope(|s| {
        let split = &split;
        let reading = s.spawn(move || read_all(reader, split, txs, progress));
        let loaded = match engine {
            Engine::Reference => None,
            Engine::Kernel => match load_kernel(&opts.load) {
                Ok(l) => Some(l),
                Err(e) => {
                    // Closing the queues stops the reader.
                    drop(rxs);
                    let _ = reading.join();
                    return Err(e);
                }
            },
        };
        let mut handles = Vec::with_capacity(workers);
        for (i, rx) in rxs.into_iter().enumerate() {
            let (worker, pin) = match &loaded {
                None => (Ok(Worker::reference(i, cfg, policy)), None),
                Some(l) => {
                    let prog = l.xdp_fd().map_err(AnalyzeError::from).and_then(|fd| {
                        fd.try_clone_to_owned().map_err(|source| {
                            AnalyzeError::Load(LoadError::Fd {
                                name: "xdp_classify",
                                source,
                            })
                        })
                    });
                    let pin = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
                    (prog.map(|fd| Worker::kernel(i, cfg, policy, fd)), pin)
                }
            };
            handles.push(s.spawn(move || work(worker?, rx, pin)));
        }
        let mut shards = Vec::with_capacity(workers);
        let mut error = None;
        for h in handles {
            match h.join() {
                Ok(Ok(shard)) => shards.push(shard),
                Ok(Err(e)) => error = error.or(Some(e)),
                Err(_) => error = error.or(Some(AnalyzeError::Worker)),
            }
        }
        let read = reading.join().unwrap_or_else(|_| ReadEnd {
            frames: 0,
            format,
            first_ns: None,
            last_ns: None,
            error: Some(AnalyzeError::Worker),
        });
        Ok(Run {
            shards,
            read,
            error,
            loaded,
        })
    })
}

/// One worker's thread: every batch, until the reader closes the queue.
fn work(
    mut w: Worker<'_>,
    rx: Receiver<Arc<Batch>>,
    pin: Option<usize>,
) -> Result<Shard, AnalyzeError> {
    if let Some(cpu) = pin {
        pin_to_cpu(cpu)?;
    }
    for batch in rx {
        w.process(&batch)?;
    }
    Ok(w.shard)
}
