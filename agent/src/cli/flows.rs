//! `roce-agent flows`: a running agent's flow table, as a table or its JSON.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::api_args::{api_help, ApiClientArgs};
use crate::doc::table;
use crate::doc::Document;

/// How long `flows` waits for the agent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The text after `roce-agent flows --help`'s options.
pub const AFTER_HELP: &str = concat!(
    "Examples:\n  \
    roce-agent flows\n  \
    roce-agent flows --json | jq '.flows[] | select(.ecn.ce > 0)'\n  \
    roce-agent flows --json --pretty\n  \
    roce-agent flows --api 127.0.0.1:9473\n  \
    roce-agent flows --api :9474                        # the agent on this host, port 9474\n  \
    roce-agent flows --api https://agent1:9473 --ca-file ca.pem\n  \
    ROCE_AGENT_AUTH=ops:secret roce-agent flows --api https://agent1:9473 --ca-file ca.pem\n\n\
    --json prints the document as the agent served it, on one line; --pretty indents it. ",
    api_help!(),
    "\n\n\
    Exit status: 0 success, 1 no agent answers (or its answer is not a flow table, or it \
    refuses the request), 2 usage error (an --api that is not an address, an unreadable \
    or invalid --ca-file, --cert-file, --key-file or --auth-file)."
);

#[derive(Debug, Args)]
pub struct FlowsArgs {
    /// Print the JSON document exactly as the agent served it: one line
    #[arg(long)]
    pub json: bool,
    /// With --json: indent the document (two spaces a level, keys in the agent's order)
    #[arg(long, requires = "json")]
    pub pretty: bool,
    #[command(flatten)]
    pub api: ApiClientArgs,
}

/// `roce-agent flows`.
pub fn flows(args: FlowsArgs) -> anyhow::Result<()> {
    let client = args.api.client()?;
    let body = client.get_body("/flows", CLIENT_TIMEOUT)?;
    let doc: Document = serde_json::from_slice(&body).with_context(|| {
        format!(
            "the answer of {} is not a roce-agent flow document",
            client.addr()
        )
    })?;
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    let written = if args.json && args.pretty {
        out.write_all(&indent_json(&body))
            .and_then(|()| out.write_all(b"\n"))
    } else if args.json {
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

/// `json` (valid JSON) indented as `serde_json::to_vec_pretty` writes it, its keys in
/// their order and every value's text as it was.
fn indent_json(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    let mut bytes = json.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                out.push(b);
            }
            b'{' | b'[' => {
                out.push(b);
                while bytes.next_if(u8::is_ascii_whitespace).is_some() {}
                if let Some(close @ (b'}' | b']')) = bytes.peek().copied() {
                    out.push(close);
                    bytes.next();
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(b);
            }
            b',' => {
                out.push(b);
                newline(&mut out, depth);
            }
            b':' => out.extend_from_slice(b": "),
            b if b.is_ascii_whitespace() => {}
            b => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indenting_matches_serde_json_pretty_and_keeps_the_order() {
        let compact = br#"{"flows":[{"z":1,"a":"x, \"y\": [z]","e":{},"l":[]}],"counters":{"roce":0,"n":[1,2.5,null,true]}}"#;
        let value: serde_json::Value = serde_json::from_slice(compact).unwrap();
        let pretty = String::from_utf8(indent_json(compact)).unwrap();
        // The keys stay in the served order ("z" before "a"), so compare as values
        // and check the layout against serde_json's own.
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&pretty).unwrap(),
            value
        );
        assert!(pretty.find("\"z\"").unwrap() < pretty.find("\"a\"").unwrap());
        let ordered = br#"{"a":[{"b":1,"c":{}}],"d":{"e":[],"f":"g h"}}"#;
        let v: serde_json::Value = serde_json::from_slice(ordered).unwrap();
        assert_eq!(
            String::from_utf8(indent_json(ordered)).unwrap(),
            serde_json::to_string_pretty(&v).unwrap()
        );
        assert_eq!(indent_json(b"{ }"), b"{}");
    }
}
