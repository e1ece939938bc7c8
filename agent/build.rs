//! Builds the kernel programs (`ebpf/`, target bpfel-unknown-none) with aya-build
//! and leaves the object in OUT_DIR, where `loader` embeds it.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "roce-ebpf")
        .ok_or_else(|| anyhow!("roce-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("roce-ebpf has no directory"))?;
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
        .context("building the eBPF programs (needs nightly with rust-src and bpf-linker: run `cargo xtask setup`)")
}
