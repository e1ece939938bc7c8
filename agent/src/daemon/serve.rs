//! The daemon's loop: the API server, the collector every interval, interfaces
//! followed as they come and go, SIGHUP reloads, and shutdown on SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use tokio::sync::watch;

use crate::api;
use crate::config::Settings;
use crate::datapath::attach::Attachments;
use crate::datapath::loader;
use crate::sys::netif;
use crate::telemetry::collector::Collector;

use super::launch::{load_datapath, remove_fresh_datapath, start_events};
use super::reload::{reload, reload_web, Reload};
use super::{error_text, Launch};

/// How long a shutdown waits for open API connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub(super) async fn serve(launch: Launch, mut settings: Settings) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigterm = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;

    // The web configuration is read, and the API address claimed, before anything is
    // attached, so that a bad file or a busy port changes nothing.
    let web = launch.web_config(&settings)?;
    let limits = api_limits();
    let listener = bind(&settings.listen).await?;
    let local = listener
        .local_addr()
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    warn_if_open(local, &web);
    let (web_tx, web_rx) = watch::channel(Arc::new(web));

    let pin_dir = launch.pin_dir.as_deref();
    // A datapath pinned earlier is adopted; one made now is removed again should the
    // start fail, so that a refused start leaves nothing behind.
    let fresh = pin_dir.is_none_or(|d| !crate::datapath::pin::holds_datapath(d));
    let loaded = match load_datapath(&settings, pin_dir) {
        Ok(l) => l,
        Err(e) => {
            // Maps may be pinned already (a verifier refusal comes after them); but
            // a directory another agent holds is that agent's.
            let busy = e.chain().any(|c| {
                matches!(
                    c.downcast_ref(),
                    Some(crate::datapath::pin::PinError::Busy(_))
                )
            });
            remove_fresh_datapath(fresh && !busy, pin_dir);
            return Err(e);
        }
    };
    let mut collector = Collector::new(loaded);
    // A fresh datapath counts from its attachment on.
    let counting_since = std::time::Instant::now();
    let mut attachments = Attachments::new(crate::datapath::qos::TcMechanism::from_env());
    if let Err(e) = attachments.apply(collector.loaded_mut(), &settings) {
        attachments.release(collector.loaded_mut());
        drop(collector);
        remove_fresh_datapath(fresh, pin_dir);
        return Err(anyhow!(e));
    }
    match pin_dir {
        Some(dir) if fresh => {
            tracing::info!(pin_dir = %dir.display(), "datapath pinned: it keeps running when the agent exits")
        }
        Some(dir) => {
            tracing::info!(pin_dir = %dir.display(), "adopted the pinned datapath: counters continue")
        }
        None => tracing::info!("--no-pin: the datapath goes when the agent exits"),
    }

    let first = match collector.poll() {
        Ok(p) => p.document,
        Err(e) => {
            tracing::warn!(error = %e, "reading the flow table failed");
            Arc::new(crate::telemetry::live::LiveDocument::default())
        }
    };
    // The QP table joined with that first poll, so that GET /qps answers from the
    // start.
    let mut qp_watcher = crate::daemon::qp_task::QpWatcher::new(Default::default());
    let (watched_tx, watched_rx) = watch::channel(watched_of(&settings));
    let first_qps = tokio::task::block_in_place(|| qp_watcher.round(&first, &watched_rx.borrow()));
    let (qps_tx, qps_rx) = watch::channel(Arc::new(first_qps));
    let (tx, rx) = watch::channel(first);
    let qp_task = tokio::spawn(crate::daemon::qp_task::every(
        qp_watcher,
        rx.clone(),
        watched_rx,
        qps_tx,
    ));

    let mut auditor = launch.auditor(&settings);
    if fresh {
        auditor = auditor.counting_from_zero(counting_since);
    }
    let verdicts = auditor.verdicts_shared();
    let findings = tokio::task::block_in_place(|| auditor.round(None));
    let (findings_tx, findings_rx) =
        watch::channel(Arc::new(crate::doc::finding::Findings { findings }));
    let findings_tx = Arc::new(findings_tx);
    let mut audit_task = tokio::spawn(crate::daemon::audit_task::every(
        auditor,
        settings.interval,
        rx.clone(),
        findings_tx.clone(),
    ));

    // Sampled events from the kernel programs; GET /events subscribes here.
    let events = start_events(collector.loaded_mut(), &settings);
    let events_keep = events.as_ref().map(|e| e.keep.clone());
    let events_sample = Arc::new(std::sync::atomic::AtomicU32::new(settings.events_sample));
    let reloads = Arc::new(crate::telemetry::metrics::ReloadCounts::default());
    let exporter = Arc::new(crate::telemetry::metrics::Exporter {
        host: std::sync::RwLock::new(crate::telemetry::metrics::HostSources {
            sysfs_root: launch.sysfs_root.clone(),
            interfaces: settings.tc_interfaces(),
        }),
        top_flows: settings.top_flows,
        reloads: reloads.clone(),
        events_ring: events.as_ref().and_then(|e| e.progress.clone()),
        events_feed: events.as_ref().map(|e| e.sender.clone()),
    });
    let feed = events.map(|e| api::server::EventFeed {
        sender: e.sender,
        sample: events_sample.clone(),
    });
    let routes =
        api::server::router_with_qps(rx.clone(), findings_rx.clone(), feed, Some(qps_rx.clone()))
            .merge(api::server::metrics_router_with_qps(
                rx.clone(),
                findings_rx,
                exporter.clone(),
                Some(qps_rx),
            ));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let web_summary = web_rx.borrow().summary();
    let max_connections = limits.max_connections;
    let mut server = tokio::spawn(api::listen::serve(
        listener,
        routes,
        web_rx,
        limits,
        async {
            let _ = stop_rx.await;
        },
    ));
    tracing::info!(listen = %local, web = %web_summary, max_connections, interval_s = settings.interval.as_secs_f64(), required_mtu = settings.required_mtu(), "serving GET /flows, GET /findings, GET /qps and GET /metrics");

    let mut ticker = new_ticker(settings.interval).await;
    // Link changes wake the loop at once; the interval check catches what they miss.
    let mut link_events = match netif::link_events() {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!(error = %e, "no rtnetlink link events: interfaces are checked every interval only");
            None
        }
    };
    let mut server_done = None;
    let mut throttle = crate::daemon::throttle::Throttle::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                match tokio::task::block_in_place(|| collector.poll()) {
                    Ok(p) => {
                        tracing::debug!(flows = p.document.len(), entries = p.entries, elapsed = ?p.elapsed, read = ?p.read, "polled");
                        attachments.log_changes(&p.document.counters.qos);
                        // Shared, not copied: the collector keeps it for the next rates.
                        tx.send_replace(p.document);
                        // Interfaces that appeared, went away or were re-created.
                        follow_interfaces(&mut attachments, collector.loaded_mut(), &settings, &mut throttle);
                    }
                    Err(e) => {
                        if let Some(left_out) = throttle.allow("poll", std::time::Instant::now()) {
                            tracing::warn!(error = %e, left_out, "reading the flow table failed");
                        }
                    }
                }
            }
            Some(()) = async {
                match link_events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                tokio::task::block_in_place(|| {
                    follow_interfaces(&mut attachments, collector.loaded_mut(), &settings, &mut throttle)
                });
            }
            _ = sighup.recv() => {
                let reloaded = tokio::task::block_in_place(|| {
                    reload(&launch, &settings, &mut attachments, collector.loaded_mut())
                });
                // The events' settings at once: the log says "configuration reloaded"
                // already, and a GET /events that follows it must find them.
                if let Reload::Applied(new) = &reloaded {
                    events_sample.store(new.events_sample, std::sync::atomic::Ordering::Relaxed);
                    if let Some(k) = &events_keep { k.set(new); }
                }
                let config_ok = match &reloaded {
                    Reload::Applied(_) => Some(true),
                    Reload::Refused => Some(false),
                    Reload::NoFile => None,
                };
                // The web configuration of the settings now in force.
                let web_ok = match &reloaded {
                    Reload::Applied(new) => reload_web(&launch, new, &web_tx),
                    Reload::Refused | Reload::NoFile => reload_web(&launch, &settings, &web_tx),
                };
                if web_ok == Some(true) {
                    warn_if_open(local, &web_tx.borrow());
                }
                // One reload of one or both files; nothing asked of any file is neither
                // a success nor a failure.
                if config_ok.is_some() || web_ok.is_some() {
                    reloads.record(config_ok != Some(false) && web_ok != Some(false));
                }
                if let Reload::Applied(new) = reloaded {
                    if new.interval != settings.interval {
                        ticker = new_ticker(new.interval).await;
                    }
                    audit_task.abort();
                    audit_task = tokio::spawn(crate::daemon::audit_task::every(
                        launch.auditor(&new).continuing(verdicts.clone()),
                        new.interval,
                        rx.clone(),
                        findings_tx.clone(),
                    ));
                    exporter.set_interfaces(new.tc_interfaces());
                    watched_tx.send_replace(watched_of(&new));
                    settings = *new;
                }
            }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            r = &mut server => { server_done = Some(r); break; }
        }
    }

    audit_task.abort();
    qp_task.abort();
    attachments.release(collector.loaded_mut());
    match pin_dir {
        Some(dir) => {
            tracing::info!(pin_dir = %dir.display(), "the pinned datapath keeps classifying and enforcing; `roce-agent detach` removes it")
        }
        None => tracing::info!(interfaces = %settings.interfaces.join(","), "detached"),
    }
    match server_done {
        Some(Ok(())) => Err(anyhow!("the API server stopped unexpectedly")),
        Some(Err(e)) => Err(anyhow!(e).context("the API server task failed")),
        None => {
            let _ = stop_tx.send(());
            // The server cuts what is open after the grace; this is the backstop.
            if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
            Ok(())
        }
    }
}

/// The interfaces whose RoCE visibility the agent reports: the classifier's and the
/// mirror collectors.
fn watched_of(settings: &Settings) -> crate::telemetry::qps::Watched {
    crate::telemetry::qps::Watched {
        interfaces: settings.interfaces.clone(),
        mirrors: settings.mirror_interfaces.clone(),
    }
}

/// Applies `settings` again when an interface is not where its programs are (it
/// appeared, went away, was re-created or renamed); a failure is retried at the next
/// check.
fn follow_interfaces(
    attachments: &mut Attachments,
    loaded: &mut loader::Loaded,
    settings: &Settings,
    throttle: &mut crate::daemon::throttle::Throttle,
) {
    if !attachments.drifted(settings) {
        return;
    }
    if let Err(e) = attachments.apply(loaded, settings) {
        if let Some(left_out) = throttle.allow("interfaces", std::time::Instant::now()) {
            tracing::warn!(error = %error_text(&anyhow!(e)), left_out, "attaching to an interface that changed failed; trying again at the next check");
        }
    }
}

/// The bounds of the API's HTTP surface, with the soft open-files limit raised to the
/// hard one first (a service manager's 1,024 would refuse connections long before the
/// cap).
fn api_limits() -> api::listen::Limits {
    let limits = api::listen::Limits::from_env();
    let limits = api::listen::Limits {
        shutdown_grace: SHUTDOWN_GRACE,
        ..limits
    };
    match api::listen::raise_open_files_limit() {
        Ok((soft, hard)) => {
            tracing::debug!(soft, hard, "open files limit");
            limits.within(soft)
        }
        Err(e) => {
            tracing::warn!(error = %e, "raising the open files limit failed");
            limits.within(1024)
        }
    }
}

/// Warns when the API on `local` answers other hosts with no TLS and no users.
fn warn_if_open(local: std::net::SocketAddr, web: &api::web_config::WebConfig) {
    if !local.ip().is_loopback() && web.tls.is_none() && web.users.is_empty() {
        tracing::warn!(listen = %local, "the API (flows, findings, metrics, events) is reachable from other hosts without authentication: bind it to loopback, or serve it with TLS and users (--web-config-file), unless a firewall or a scraper needs it");
    }
}

/// The API's listener on `listen` (`:PORT`: every address, IPv6 and IPv4, or IPv4's
/// alone on a host without IPv6).
async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let mut failure = None;
    for addr in crate::config::bind_addresses(listen) {
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(l) => return Ok(l),
            // No IPv6 here: the next address is IPv4's.
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrNotAvailable
                    || e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
            {
                failure = Some(e)
            }
            Err(e) => return Err(anyhow!(e).context(format!("cannot listen on {listen}"))),
        }
    }
    let e = failure.unwrap_or_else(|| std::io::Error::other("no address to bind"));
    Err(anyhow!(e).context(format!("cannot listen on {listen}")))
}

/// An interval ticker whose first (immediate) tick is already taken.
async fn new_ticker(every: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    ticker
}
