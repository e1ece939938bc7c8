//! `roce-agent detach`: removes the pinned datapath.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The pin directory of the datapath to remove (run --pin-dir)
    #[arg(long, value_name = "DIR", default_value = crate::datapath::pin::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Print what was removed as JSON, on one line: {"links": [...], "filters": [...], "qdiscs": [...], "programs": [...], "maps": [...]}
    #[arg(long)]
    pub json: bool,
    /// With --json: indent the document (two spaces a level)
    #[arg(long, requires = "json")]
    pub pretty: bool,
}

/// `roce-agent detach`.
pub fn detach(args: DetachArgs) -> anyhow::Result<()> {
    let removed = crate::datapath::pin::detach(&args.pin_dir).with_context(|| {
        format!(
            "detaching the datapath pinned under {}",
            args.pin_dir.display()
        )
    })?;
    if args.json {
        let json = if args.pretty {
            serde_json::to_string_pretty(&removed)?
        } else {
            serde_json::to_string(&removed)?
        };
        println!("{json}");
        return Ok(());
    }
    if removed.links.is_empty()
        && removed.filters.is_empty()
        && removed.programs.is_empty()
        && removed.maps.is_empty()
    {
        println!("nothing pinned under {}", args.pin_dir.display());
        return Ok(());
    }
    println!(
        "detached {} links and {} tc filters; removed {} program and {} map pins and {}",
        removed.links.len(),
        removed.filters.len(),
        removed.programs.len(),
        removed.maps.len(),
        args.pin_dir.display()
    );
    for l in &removed.links {
        println!("  link {l}");
    }
    for f in &removed.filters {
        println!("  tc filter {f}");
    }
    for q in &removed.qdiscs {
        println!("  clsact qdisc of {q} (left empty)");
    }
    Ok(())
}
