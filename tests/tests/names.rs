//! The names declared once in `roce_common::names` are exactly the kernel object's:
//! a map or program renamed on one side only fails here, not at attach time on a host.

use roce_agent::loader::{load, LoadOptions};
use roce_common::names::{map, program};

#[test]
fn every_declared_map_and_program_is_in_the_object_and_nothing_else() {
    let loaded = load(&LoadOptions::default()).expect("loading the object (run as root)");
    let (maps, programs) = loaded.object_names();
    // aya also creates maps of its own for .rodata/.bss and logging: only ours count.
    let ours: Vec<&String> = maps
        .iter()
        .filter(|n| {
            n.starts_with(|c: char| c.is_ascii_uppercase())
                && n.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    let mut declared: Vec<&str> = map::ALL.to_vec();
    declared.sort();
    assert_eq!(ours, declared, "maps of the object: {maps:?}");
    let mut declared: Vec<&str> = program::ALL.to_vec();
    declared.sort();
    assert_eq!(programs, declared);
}
