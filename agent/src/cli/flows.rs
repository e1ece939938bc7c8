//! `roce-agent flows`: a running agent's flow table, as a table or its JSON.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::api;
use crate::config::DEFAULT_LISTEN;
use crate::doc::table;
use crate::doc::Document;

/// How long `flows` waits for the agent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct FlowsArgs {
    /// Print the JSON document exactly as the agent served it
    #[arg(long)]
    pub json: bool,
    /// Address of the running agent's API (its --listen)
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_LISTEN)]
    pub api: String,
}

/// `roce-agent flows`.
pub fn flows(args: FlowsArgs) -> anyhow::Result<()> {
    let body = api::client::get_body(&args.api, "/flows", CLIENT_TIMEOUT)?;
    let doc: Document = serde_json::from_slice(&body).with_context(|| {
        format!(
            "the answer of {} is not a roce-agent flow document",
            args.api
        )
    })?;
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    let written = if args.json {
        out.write_all(&body).and_then(|()| {
            if body.last() != Some(&b'\n') {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
    } else {
        out.write_all(table::render(&doc).as_bytes())
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e).context("writing to stdout"),
    }
}
