//! `roce-gen`: send RoCEv2 traffic (plain, CE-marked, CNPs, ACK/NAK, in VXLAN) and
//! report exactly what was sent, per flow. See `roce-gen --help` and `roce_testkit::gen`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use roce_testkit::gen::{self, GenArgs, GenError};

#[derive(Parser)]
#[command(
    name = "roce-gen",
    version,
    about = "Send RoCEv2 test traffic and report what was sent, per flow",
    long_about = "Send RoCEv2 test traffic (SEND/WRITE/READ/ACK/NAK/RNR-NAK, CE-marked packets, \
CNPs, PSN gaps), plain or in VXLAN, and report per flow what was sent (packets, bytes, ECN \
codepoints, CE marks, CNPs, ACKs/NAKs, VNI, destination QP) in the field names of \
`roce-agent flows --json`, so the receiver's flow table can be checked against it.\n\n\
Frames are crafted (--via raw, AF_PACKET: any opcode and TOS, correct ICRC) or sent from a \
UDP socket with IP_TOS set (--via udp). With a VXLAN device as --iface the kernel \
encapsulates; --vni with --outer-src/--outer-dst on a plain interface crafts the VXLAN \
header instead (and --outer-ce marks the outer header as a congested underlay would).\n\n\
Needs root (CAP_NET_RAW for raw frames, CAP_NET_ADMIN for SO_BINDTODEVICE).",
    after_help = "EXAMPLES:\n  \
# 100 SEND packets to QP 0x12, 10 CE-marked, plus 5 CNPs, at 1000 packets/s\n  \
roce-gen -i eth1 --dst 198.18.0.2 --dst-mac 02:00:00:00:00:02 --count 100 --ce 10 --cnp 5 --rate 1000\n\n  \
# A mix of operations on 4 QPs from a UDP socket, JSON report\n  \
roce-gen -i eth1 --via udp --dst 198.18.0.2 --flows 4 --ops send,write,read,ack,nak --json\n\n  \
# RoCE in VXLAN: the kernel's VXLAN device vx0 encapsulates (VNI read from the device)\n  \
roce-gen -i vx0 --dst 198.19.0.2 --count 50 --ce 5\n\n  \
# Crafted VXLAN VNI 5001 whose outer header a switch marked CE 7 times\n  \
roce-gen -i eth1 --vni 5001 --outer-src 198.18.0.1 --outer-dst 198.18.0.2 \\\n      \
--src 198.19.0.1 --dst 198.19.0.2 --count 50 --outer-ce 7\n\n\
Exit status: 0 when everything was sent, 1 on an error, 130 when interrupted (the report \
of what was sent until then is still printed)."
)]
struct Cli {
    #[command(flatten)]
    gen: GenArgs,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SAFETY: installs an async-signal-safe handler that only stores an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    match gen::run(&cli.gen, &STOP) {
        Ok(report) => {
            if cli.gen.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("roce-gen: cannot encode the report: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", gen::render_table(&report));
            }
            if report.interrupted {
                ExitCode::from(130)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("roce-gen: {e}");
            if let GenError::Usage(_) = e {
                eprintln!("(see roce-gen --help)");
            }
            ExitCode::FAILURE
        }
    }
}
