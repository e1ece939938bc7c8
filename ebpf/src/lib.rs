#![no_std]
// The programs live in the `roce-ebpf` binary (src/main.rs); this empty library
// only lets the agent name the crate as a build dependency.
