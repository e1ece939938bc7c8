//! SIGHUP: the configuration read again, validated in full, applied in one step or
//! not at all.

use anyhow::anyhow;

use crate::config::Settings;
use crate::datapath::attach::Attachments;
use crate::datapath::loader;

use super::{error_text, Launch};

/// SIGHUP: reads the configuration again, validates all of it, and applies it in one
/// step. A refused file changes nothing (the message names FILE:LINE:COLUMN); a file
/// that validates but fails to apply (an attach refused) is rolled back. Returns the
/// settings now in force when they changed.
pub(super) fn reload(
    launch: &Launch,
    current: &Settings,
    attachments: &mut Attachments,
    loaded: &mut loader::Loaded,
) -> Option<Settings> {
    let Some(path) = launch.config.as_deref() else {
        tracing::warn!("SIGHUP: there is no --config file to read again; nothing changes");
        return None;
    };
    let new = match launch.settings() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&e), "SIGHUP: the configuration was refused; the one in force stays");
            return None;
        }
    };
    for (what, changed) in [
        ("listen", new.listen != current.listen),
        (
            "flows_map_size",
            new.flows_map_size != current.flows_map_size,
        ),
    ] {
        if changed {
            tracing::warn!(
                setting = what,
                "SIGHUP: this setting takes effect at the next start only"
            );
        }
    }
    match attachments.apply(loaded, &new) {
        Ok(()) => {
            tracing::info!(file = %path.display(), interfaces = ?new.interfaces, vteps = ?new.vteps, "SIGHUP: configuration reloaded");
            Some(new)
        }
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&anyhow!(e)), "SIGHUP: applying the configuration failed; going back to the one in force");
            if let Err(back) = attachments.apply(loaded, current) {
                tracing::error!(error = %error_text(&anyhow!(back)), "restoring the configuration in force failed");
            }
            None
        }
    }
}
