//! The options every client of a running agent shares (`flows`, `events`, `top`,
//! `qps`): where the agent is, the TLS to speak to it, the credentials to send.
//! Each command flattens [`ApiClientArgs`] into its own `Args` and asks it for a
//! [`Client`].

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::Args;

use crate::api::client::{parse_address, Client, ClientError, Credentials, TlsFiles, AUTH_ENV};
use crate::config::DEFAULT_LISTEN;

/// The paragraph of a client's `--help` (after its examples) on the address forms,
/// TLS and credentials: `concat!(..., api_help!())`.
macro_rules! api_help {
    () => {
        "--api takes HOST:PORT, [IPV6]:PORT or http://HOST:PORT for plain HTTP, \
        https://HOST:PORT for an agent that serves TLS (run --web-config-file), and :PORT \
        for the agent on this host (127.0.0.1:PORT). Over https:// the agent's certificate \
        must chain to a CA of --ca-file (without it, to the built-in web roots) and name \
        the host of --api; --cert-file and --key-file present a client certificate to an \
        agent that asks for one. Basic-auth credentials, user:password, come from the \
        environment variable ROCE_AGENT_AUTH or the first line of --auth-file, never from \
        the command line."
    };
}
pub(crate) use api_help;

/// Where a running agent is and how to reach it.
#[derive(Clone, Debug, Args)]
pub struct ApiClientArgs {
    /// Address of the running agent's API (its --listen): HOST:PORT or http://HOST:PORT, https://HOST:PORT when it serves TLS; :PORT is the agent on this host (127.0.0.1:PORT)
    #[arg(long = "api", value_name = "[https://]HOST:PORT", default_value = DEFAULT_LISTEN, value_parser = parse_address)]
    pub addr: String,
    /// With https://: trust the CA certificates of this PEM file (the CA that signed the agent's certificate) instead of the built-in web roots
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// With https://: present this client certificate (PEM), for an agent that asks for one (mutual TLS); needs --key-file
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The private key of --cert-file (PEM)
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Send the basic-auth credentials of this file's first line, user:password (instead of the environment variable ROCE_AGENT_AUTH=user:password)
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
}

impl ApiClientArgs {
    /// The client these options describe: the TLS files read, the credentials of
    /// `--auth-file` or of `ROCE_AGENT_AUTH`.
    pub fn client(&self) -> Result<Client, ClientError> {
        self.client_with(std::env::var_os(AUTH_ENV).as_deref())
    }

    /// [`ApiClientArgs::client`] with `auth_env` for the value of `ROCE_AGENT_AUTH`.
    fn client_with(&self, auth_env: Option<&OsStr>) -> Result<Client, ClientError> {
        let credentials = Credentials::find(auth_env, self.auth_file.as_deref())?;
        let files = TlsFiles {
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        };
        Client::new(&self.addr, files, credentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cmd {
        #[command(flatten)]
        api: ApiClientArgs,
    }

    fn parse(args: &[&str]) -> Result<ApiClientArgs, clap::Error> {
        Cmd::try_parse_from(std::iter::once("cmd").chain(args.iter().copied())).map(|c| c.api)
    }

    #[test]
    fn addresses_keep_https_and_default_to_the_local_agent() {
        assert_eq!(parse(&[]).unwrap().addr, "127.0.0.1:9473");
        assert_eq!(
            parse(&["--api", "https://:9474"]).unwrap().addr,
            "https://127.0.0.1:9474"
        );
        let e = parse(&["--api", "9473"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
    }

    #[test]
    fn a_certificate_needs_its_key_and_tls_files_need_https() {
        for args in [&["--cert-file", "c.crt"][..], &["--key-file", "c.key"]] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{e}");
            assert!(e.to_string().contains("required"), "{e}");
        }
        let args = parse(&["--api", "127.0.0.1:1", "--ca-file", "ca.pem"]).unwrap();
        let e = args.client_with(None).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(
            e.to_string().contains("use --api https://127.0.0.1:1"),
            "{e}"
        );
    }

    #[test]
    fn credentials_come_from_the_environment_value_or_the_file() {
        let args = parse(&["--api", "127.0.0.1:1"]).unwrap();
        assert!(args.client_with(None).is_ok());
        let e = args.client_with(Some(OsStr::new("no-colon"))).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().starts_with("ROCE_AGENT_AUTH: "), "{e}");
        let args = parse(&["--api", "127.0.0.1:1", "--auth-file", "/nonexistent/auth"]).unwrap();
        let e = args.client_with(Some(OsStr::new("a:b"))).unwrap_err();
        assert!(
            e.to_string().starts_with("--auth-file /nonexistent/auth: "),
            "{e}"
        );
        // A missing CA file is named with its flag, a usage error.
        let args = parse(&[
            "--api",
            "https://127.0.0.1:1",
            "--ca-file",
            "/nonexistent/ca.pem",
        ])
        .unwrap();
        let e = args.client_with(None).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(
            e.to_string()
                .starts_with("--ca-file /nonexistent/ca.pem: cannot read it: "),
            "{e}"
        );
    }
}
