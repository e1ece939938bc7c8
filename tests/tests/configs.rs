//! The example configurations in `configs/` are valid, and a broken file is refused
//! with FILE:LINE:COLUMN. No root needed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use roce_agent::config::{ConfigError, ConfigFile, Overrides, Settings};

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn load(name: &str) -> ConfigFile {
    let path = configs_dir().join(name);
    ConfigFile::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn with_iface(name: &str) -> Overrides {
    Overrides {
        interfaces: vec![name.to_string()],
        ..Default::default()
    }
}

#[test]
fn every_example_config_parses() {
    let mut seen = 0;
    for entry in std::fs::read_dir(configs_dir()).expect("configs/ exists") {
        let path = entry.expect("readable directory").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let file = ConfigFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            // With an interface from the command line every example must resolve.
            Settings::resolve(Some(&file), &with_iface("veth0"), true)
                .unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        }
    }
    assert!(
        seen >= 2,
        "expected host.toml and lab.toml, found {seen} files"
    );
}

#[test]
fn host_config_is_the_documented_defaults_with_two_interfaces() {
    let file = load("host.toml");
    let s = Settings::resolve(Some(&file), &Overrides::default(), true).unwrap();
    assert_eq!(s.interfaces, vec!["eth1", "eth2"]);
    assert_eq!(s.listen, "127.0.0.1:9473");
    assert_eq!(s.interval, Duration::from_secs(1));
    assert_eq!(s.flows_map_size, 65536);
    assert_eq!((s.runtime.roce_port, s.runtime.vxlan_port), (4791, 4789));
    assert_eq!(s.default_pmtu, 4096);
    // Apart from the interfaces, the file says exactly what no file says.
    let defaults = Settings::resolve(None, &with_iface("eth1"), true).unwrap();
    assert_eq!(
        Settings {
            interfaces: vec![],
            ..s
        },
        Settings {
            interfaces: vec![],
            ..defaults
        }
    );
}

#[test]
fn lab_config_needs_an_interface_from_the_command_line() {
    let file = load("lab.toml");
    let e = Settings::resolve(Some(&file), &Overrides::default(), true).unwrap_err();
    assert!(e.to_string().contains("interfaces"), "{e}");
    let s = Settings::resolve(Some(&file), &with_iface("rlab1x0a"), true).unwrap();
    assert_eq!(s.interfaces, vec!["rlab1x0a"]);
    assert_eq!(s.interval, Duration::from_millis(250));
    assert_eq!(s.flows_map_size, 4096);
    assert_eq!(s.runtime.default_pmtu_log2, 10);
}

#[test]
fn broken_copy_of_an_example_names_file_line_and_column() {
    let text = std::fs::read_to_string(configs_dir().join("host.toml")).unwrap();
    let (line_no, _) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("roce_port"))
        .expect("host.toml sets roce_port");
    let broken = text.replacen("roce_port = 4791", "roce_port = \"4791\"", 1);
    let dir = std::env::temp_dir().join(format!("roce-configs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broken.toml");
    std::fs::write(&path, broken).unwrap();
    let e = ConfigFile::load(&path).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    let expected = format!("{}:{}:13: ", path.display(), line_no + 1);
    assert!(e.to_string().starts_with(&expected), "{e}");
    assert!(matches!(e, ConfigError::Parse { .. }));
}

#[test]
fn out_of_range_value_in_an_example_names_the_key() {
    let text = std::fs::read_to_string(configs_dir().join("lab.toml")).unwrap();
    let broken = text.replacen("default_pmtu = 1024", "default_pmtu = 1500", 1);
    let file = ConfigFile::parse(Path::new("lab.toml"), broken).unwrap();
    let e = Settings::resolve(Some(&file), &with_iface("veth0"), true).unwrap_err();
    let line = text
        .lines()
        .position(|l| l.starts_with("default_pmtu"))
        .unwrap()
        + 1;
    assert_eq!(
        e.to_string(),
        format!("lab.toml:{line}:16: default_pmtu: 1500 is not an InfiniBand MTU: use 256, 512, 1024, 2048 or 4096")
    );
}

#[test]
fn vtep_config_enforces_and_propagates_with_the_documented_policy() {
    use roce_agent::config::{EcnPropagation, HostMode};
    use roce_common::policy::Policy;
    let f = load("vtep.toml");
    let s = match Settings::resolve(Some(&f), &Overrides::default(), true) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        (s.mode, s.ecn_propagation),
        (HostMode::Enforce, EcnPropagation::Kernel)
    );
    assert_eq!(s.vteps, vec!["eth0"]);
    // Every [qos] value written out is the default.
    assert_eq!(s.policy, Policy::default());
}
