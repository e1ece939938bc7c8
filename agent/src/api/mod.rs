//! The HTTP API: the agent's server (`GET /flows`, `/findings`, `/events`, `/metrics`)
//! and the client that `flows`, `events` and `top` use to read it.
//!
//! May import: `doc`, `config`, `telemetry`, `audit`. Nothing imports it but `daemon`,
//! `cli` and `top`.

pub mod client;
pub mod server;
