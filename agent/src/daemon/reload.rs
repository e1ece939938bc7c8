//! SIGHUP: the configuration read again, validated in full, applied in one step or
//! not at all; and the web configuration (certificates, users, headers) read again,
//! with or without a configuration file.

use std::sync::Arc;

use anyhow::anyhow;
use tokio::sync::watch;

use crate::api::web_config::WebConfig;
use crate::config::Settings;
use crate::datapath::attach::Attachments;
use crate::datapath::loader;

use super::{error_parts, error_text, Launch};

/// What a SIGHUP did.
pub(super) enum Reload {
    /// The file was read and applied: the settings now in force.
    Applied(Box<Settings>),
    /// The file was refused, or failed to apply and was rolled back: the settings in
    /// force stay (a failed reload for `roce_agent_config_*`).
    Refused,
    /// No `--config` was given: there is nothing to read again (no reload at all).
    NoFile,
}

/// SIGHUP: reads the configuration again, validates all of it, and applies it in one
/// step. A refused file changes nothing (the message names FILE:LINE:COLUMN, in one
/// record: a parse error's caret block is its `excerpt` field); a file that validates
/// but fails to apply (an attach refused) is rolled back.
pub(super) fn reload(
    launch: &Launch,
    current: &Settings,
    attachments: &mut Attachments,
    loaded: &mut loader::Loaded,
) -> Reload {
    let Some(path) = launch.config.as_deref() else {
        if launch.flags.web_config_file.is_none() {
            tracing::info!("SIGHUP: the agent runs without --config: nothing to reload");
        }
        return Reload::NoFile;
    };
    let new = match launch.settings() {
        Ok(s) => s,
        Err(e) => {
            let (error, excerpt) = error_parts(&e);
            tracing::error!(
                file = %path.display(),
                error = %error,
                excerpt = excerpt.as_deref().map(tracing::field::display),
                "SIGHUP: the configuration was refused; the one in force stays"
            );
            return Reload::Refused;
        }
    };
    for (what, changed) in [
        ("listen", new.listen != current.listen),
        (
            "flows_map_size",
            new.flows_map_size != current.flows_map_size,
        ),
        ("log_format", new.log_format != current.log_format),
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
            tracing::info!(
                file = %path.display(),
                interfaces = %new.interfaces.join(","),
                vteps = %new.vteps.join(","),
                "SIGHUP: configuration reloaded"
            );
            Reload::Applied(Box::new(new))
        }
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&anyhow!(e)), "SIGHUP: applying the configuration failed; going back to the one in force");
            if let Err(back) = attachments.apply(loaded, current) {
                tracing::error!(error = %error_text(&anyhow!(back)), "restoring the configuration in force failed");
            }
            Reload::Refused
        }
    }
}

/// SIGHUP for the web configuration: the `web_config_file` of `settings` (those in
/// force after the configuration's own reload) read again and sent to the listener:
/// certificates for the connections accepted from now on, users and headers for the
/// next request. A refused file changes nothing: the one in force stays, and the log
/// says why. Some(true) when it was read (or dropped: no `web_config_file` any more),
/// Some(false) when refused, None when there is none before or after.
pub(super) fn reload_web(
    launch: &Launch,
    settings: &Settings,
    web: &watch::Sender<Arc<WebConfig>>,
) -> Option<bool> {
    let Some(path) = settings.web_config_file.as_deref() else {
        let before = web.borrow().source.clone()?;
        web.send_replace(Arc::new(WebConfig::plain()));
        tracing::warn!(before = %before.display(), "SIGHUP: no web_config_file any more: the API is served over plain HTTP without authentication");
        return Some(true);
    };
    match tokio::task::block_in_place(|| launch.web_config(settings)) {
        Ok(new) => {
            tracing::info!(file = %path.display(), web = %new.summary(), "SIGHUP: web_config_file reloaded");
            web.send_replace(Arc::new(new));
            Some(true)
        }
        Err(e) => {
            tracing::error!(file = %path.display(), error = %error_text(&e), "SIGHUP: web_config_file refused; the web configuration in force stays");
            Some(false)
        }
    }
}
