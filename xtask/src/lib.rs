//! Project tasks shared by `cargo xtask ...`, the integration tests and the benches.

pub mod lab;
pub mod setup;
pub mod sock;
