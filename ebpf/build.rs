// Rebuild the kernel object when the linker changes (a new bpf-linker changes the BTF).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
