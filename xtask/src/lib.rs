//! Project tasks shared by `cargo xtask ...`. The namespace lab and the other test
//! tooling live in `roce-testkit` (`testkit/`).

pub mod setup;
