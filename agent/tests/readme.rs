//! The README says what the binary does: every `roce-agent SUBCOMMAND --flag` it shows
//! (synopses, examples, inline commands) names a subcommand and flags that the
//! binary's `--help` lists. A flag added to the README but not to the binary, or
//! renamed in one and not the other, fails here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_roce-agent");

/// `(subcommand, flags)` of every command line the README shows in code (a fenced
/// block or an inline code span), with the line each flag is first named on.
fn readme_commands(readme: &str) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let lines: Vec<&str> = readme.lines().collect();
    // None: prose; Some(true): a block of commands (```sh); Some(false): of output.
    let mut fence: Option<bool> = None;
    for (i, line) in lines.iter().enumerate() {
        if let Some(lang) = line.trim_start().strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(matches!(lang.trim(), "sh" | "bash" | "shell" | "console")),
            };
            continue;
        }
        // The code of this line: all of it in a block of commands, a `$ ` line in a
        // block of output, else its inline code spans.
        let spans: Vec<String> =
            if fence == Some(true) || (fence == Some(false) && line.starts_with("$ ")) {
                let mut command = line.to_string();
                // A synopsis goes on over the indented lines below it that open with `[`.
                for next in &lines[i + 1..] {
                    if !(next.starts_with(' ') && next.trim_start().starts_with('[')) {
                        break;
                    }
                    command.push(' ');
                    command.push_str(next);
                }
                vec![command]
            } else {
                line.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect()
            };
        for span in spans {
            for (at, _) in span.match_indices("roce-agent ") {
                // `kubectl -n roce-agent ...`, `/usr/bin/roce-agent`: not our command line.
                let before = span[..at].trim_end();
                if before.ends_with(" -n") || span[..at].ends_with(['/', '-', '_']) {
                    continue;
                }
                let after = &span[at + "roce-agent ".len()..];
                let sub: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase())
                    .collect();
                if sub.is_empty() {
                    continue;
                }
                // The command ends at a comment, a shell pipe or a list operator; `|`
                // inside `[a|b]` is the synopsis' alternative, not a pipe.
                let end = [" #", " | ", "&&", ";"]
                    .iter()
                    .filter_map(|e| after.find(e))
                    .min()
                    .unwrap_or(after.len());
                let flags = out.entry(sub).or_default();
                for word in after[..end].split(|c: char| c.is_whitespace() || "[]=|".contains(c)) {
                    if let Some(flag) = word.strip_prefix("--") {
                        let flag: String = flag
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                            .collect();
                        if !flag.is_empty() {
                            flags.entry(format!("--{flag}")).or_insert(i + 1);
                        }
                    }
                }
            }
        }
    }
    out
}

fn help_of(sub: &str) -> Option<String> {
    let out = Command::new(BIN).args([sub, "--help"]).output().unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn every_subcommand_and_flag_the_readme_names_is_in_the_binarys_help() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let commands = readme_commands(&readme);
    for sub in [
        "run", "flows", "check", "analyze", "events", "top", "detach",
    ] {
        assert!(
            commands.contains_key(sub),
            "the README shows no `roce-agent {sub}`: {:?}",
            commands.keys()
        );
    }
    let mut missing = Vec::new();
    for (sub, flags) in &commands {
        let Some(help) = help_of(sub) else {
            missing.push(format!(
                "`roce-agent {sub}` (README line {}): no such subcommand",
                flags.values().min().unwrap_or(&0)
            ));
            continue;
        };
        let known: BTreeSet<&str> = help
            .split(|c: char| {
                c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == ']' || c == '<'
            })
            .filter(|w| w.starts_with("--"))
            .collect();
        for (flag, line) in flags {
            if !known.contains(flag.as_str()) {
                missing.push(format!("`roce-agent {sub} {flag}` (README line {line})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the README names what `--help` does not list:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_scan_finds_synopses_over_several_lines_and_inline_commands() {
    let text = "```sh\nroce-agent run --iface eth1 [--listen 127.0.0.1:9473]\n               [--mode audit|enforce] [--no-such-flag]\nkubectl -n roce-agent get pods\nroce-agent flows --json | jq . --slurp\n```\n```text\nFlows of roce-agent on eth1\n$ roce-agent top --api :9473\n```\nUse `roce-agent check --fix` here; point roce-agent at a port.\n";
    let found = readme_commands(text);
    let run: Vec<&str> = found["run"].keys().map(String::as_str).collect();
    assert_eq!(run, ["--iface", "--listen", "--mode", "--no-such-flag"]);
    assert_eq!(found["check"].keys().collect::<Vec<_>>(), ["--fix"]);
    assert_eq!(found["flows"].keys().collect::<Vec<_>>(), ["--json"]);
    assert_eq!(found["top"].keys().collect::<Vec<_>>(), ["--api"]);
    assert_eq!(found.len(), 4, "{:?}", found.keys());
}
