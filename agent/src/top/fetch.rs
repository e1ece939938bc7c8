//! Asking the agent: one round of `GET /flows`, `GET /findings` and `GET /qps` makes a
//! [`Snapshot`], and [`spawn_fetcher`] asks every interval on its own thread, so a slow
//! or dead agent never holds up keys or drawing. An agent older than the QP table
//! answers `/qps` with 404: that is no error, the view goes without it.

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use crate::api::client::{Client, ClientError};
use crate::api::server::QpAnswer;
use crate::doc::finding::Findings;
use crate::doc::Document;

use super::text::seconds;

/// How long one request to the agent may take: short, so that a dead or hung agent
/// shows in the header within seconds (the UI itself never waits for it).
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// One round of asking the agent: its flow document and its findings, or why not.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When the answers arrived.
    pub at: SystemTime,
    pub flows: Result<Document, String>,
    pub findings: Result<Findings, String>,
    /// The QP table and the interfaces' visibility; None: an agent without `/qps`.
    pub qps: Result<Option<QpAnswer>, String>,
}

/// Asks the agent of `client` for `/flows` and `/findings`.
pub fn fetch(client: &Client, timeout: Duration) -> Snapshot {
    let flows = client
        .get_body("/flows", timeout)
        .map_err(|e| short_error(&e, timeout))
        .and_then(|body| {
            serde_json::from_slice::<Document>(&body)
                .map_err(|e| format!("the answer is not a roce-agent flow document: {e}"))
        });
    // A dead agent fails the same way twice: do not wait for it twice.
    let findings = match &flows {
        Ok(_) => client
            .get_body("/findings", timeout)
            .map_err(|e| short_error(&e, timeout))
            .and_then(|body| {
                serde_json::from_slice::<Findings>(&body)
                    .map_err(|e| format!("the answer is not a findings document: {e}"))
            }),
        Err(e) => Err(e.clone()),
    };
    let qps = match &flows {
        Ok(_) => match client.get_body("/qps", timeout) {
            Ok(body) => serde_json::from_slice::<QpAnswer>(&body)
                .map(Some)
                .map_err(|e| format!("the answer is not a QP table: {e}")),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(short_error(&e, timeout)),
        },
        Err(e) => Err(e.clone()),
    };
    Snapshot {
        at: SystemTime::now(),
        flows,
        findings,
        qps,
    }
}

/// The client's error without the hint meant for a one-shot command (the header
/// already names the address).
fn short_error(e: &ClientError, timeout: Duration) -> String {
    match e {
        ClientError::Connect { error, .. } | ClientError::Io { error, .. } => match error.kind() {
            // A read timeout reads "Resource temporarily unavailable" otherwise.
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("no answer within {}", seconds(timeout))
            }
            _ => error.to_string(),
        },
        other => other.to_string(),
    }
}

/// Asks the agent every `interval` on its own thread, so a slow or dead agent never
/// holds up keys or drawing. Ends when the view has gone (the receiver is dropped).
pub fn spawn_fetcher(
    client: Client,
    interval: Duration,
    answers: mpsc::Sender<Snapshot>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("top-fetch".into())
        .spawn(move || loop {
            let started = Instant::now();
            if answers.send(fetch(&client, FETCH_TIMEOUT)).is_err() {
                return;
            }
            std::thread::sleep(interval.saturating_sub(started.elapsed()));
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_agent_is_a_timeout_and_no_agent_a_refusal() {
        // Bound but never accepting: the connection is made, no answer comes.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::plain(&silent.local_addr().unwrap().to_string()).unwrap();
        let snap = fetch(&client, Duration::from_millis(200));
        assert_eq!(snap.flows.unwrap_err(), "no answer within 0.2s");
        assert_eq!(snap.findings.unwrap_err(), "no answer within 0.2s");
        assert_eq!(snap.qps.unwrap_err(), "no answer within 0.2s");
        drop(silent);
        let e = fetch(&client, Duration::from_millis(200))
            .flows
            .unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }
}
