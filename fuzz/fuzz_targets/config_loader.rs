//! The config loader (`roce_agent::config`) on arbitrary text: `ConfigFile::parse`
//! (TOML into the file's schema, with line/column and an excerpt on error) and
//! `Settings::resolve` (defaults, the file, validation) must accept or give an error,
//! never panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use roce_agent::config::{ConfigFile, Overrides, Settings};

fuzz_target!(|data: &[u8]| {
    // The loader reads files with read_to_string: text that is not UTF-8 is a read
    // error before parsing; give the parser the lossy text instead, so that every
    // input reaches it.
    let text = String::from_utf8_lossy(data).into_owned();
    match ConfigFile::parse(Path::new("fuzz.toml"), text) {
        Ok(file) => {
            for require_interfaces in [false, true] {
                match Settings::resolve(Some(&file), &Overrides::default(), require_interfaces) {
                    Ok(s) => {
                        let _ = s.required_mtu();
                        let _ = s.load_options();
                    }
                    Err(e) => {
                        let _ = e.to_string();
                    }
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
