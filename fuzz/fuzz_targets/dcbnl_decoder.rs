//! The dcbnl decoder (`roce_agent::audit::dcb::decode_ieee_reply`) on arbitrary bytes
//! as a kernel reply to RTM_GETDCB / DCB_CMD_IEEE_GET: a state or an error, never a
//! panic; and what it decodes goes through the DCB audit (`dcb::audit`) as the agent
//! would judge it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_agent::audit::dcb::{audit, decode_ieee_reply};
use roce_common::policy::Policy;

fuzz_target!(|data: &[u8]| {
    let decoded = decode_ieee_reply(data);
    if let Ok(state) = &decoded {
        for d in 0..64u8 {
            let _ = state.dscp_priorities(d);
        }
        if let Some(pfc) = &state.pfc {
            let _ = pfc.enabled_priorities();
        }
    }
    let findings = audit("eth0", &decoded, &Policy::default());
    let _ = format!("{findings:?}");
});
