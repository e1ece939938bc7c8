//! The `run` daemon: launch (load, attach, pin), the collector loop, SIGHUP reload,
//! the periodic audit task, and shutdown.
//!
//! May import every library module below it (`datapath`, `audit`, `telemetry`, `api`,
//! `config`, `doc`, `sys`); never `cli` (it takes a plain launch struct) or `top`.

pub mod audit_task;
pub mod throttle;
