//! The HTTP API: the agent's server (`GET /flows`, `/findings`, `/qps`, `/events`, `/metrics`),
//! how it is served (`listen`: the accept loop, TLS, basic auth, the bounds of the HTTP
//! surface; `web_config`: the web configuration file that says how), and the client
//! that `flows`, `events`, `top` and `qps` use to read it.
//!
//! May import: `doc`, `config`, `telemetry`, `audit`. Nothing imports it but `daemon`,
//! `cli` and `top`.

pub mod client;
pub mod listen;
pub mod server;
pub mod web_config;
