//! The capture reader (`roce_agent::analyze::capture::CaptureReader`) on arbitrary
//! bytes: a pcap or pcapng file of any content must give frames or an error, never a
//! panic. The reader reads files (in 256 KiB reads), so each input is written to a
//! file in /dev/shm (a tmpfs) and read back through the real `open` and `next_frame`.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use roce_agent::analyze::capture::CaptureReader;

/// One file per fuzzing process (libFuzzer's `-jobs` run several).
fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("roce-fuzz-capture-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = path();
    if let Err(e) = std::fs::write(path, data) {
        panic!("writing {}: {e}", path.display());
    }
    let Ok(mut reader) = CaptureReader::open(path) else {
        return;
    };
    let _ = reader.format();
    let mut last = 0;
    loop {
        match reader.next_frame() {
            Ok(Some(frame)) => {
                // What `analyze` relies on: numbered in order (frames of an interface
                // whose link type is not read are skipped, with their numbers), never
                // longer than on the wire, borrowed from bytes of the file.
                assert!(frame.number > last);
                assert!(frame.data.len() as u64 <= frame.wire_len);
                assert!(frame.data.len() <= data.len());
                last = frame.number;
            }
            Ok(None) => break,
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
    let (read, size) = reader.position();
    assert!(read <= size.max(data.len() as u64));
});
