//! Running the long-lived commands: a sink (alone, or as an identity of a
//! fleet: a standby until it holds the identity's lease) with its
//! exporters, listeners and relay, and a watcher (alone, routing through a
//! fleet's coordinator, or as a watcher identity).

use std::sync::Arc;
use std::time::Duration;

use crate::args::{SinkArgs, WatchArgs, watch_config};
#[cfg(feature = "bench")]
use crate::commit_log;
use crate::{feed_log, identity, observe, service_manager};

/// Makes a future that resolves when the process is asked to stop.
pub type StopMaker = dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A stop that also comes when an operator asks for `active`'s identity to
/// be handed over; the receiver tells whether that was asked.
fn stop_or_handover(
    active: &identity::ActiveIdentity,
    stop: &StopMaker,
) -> (
    Box<StopMaker>,
    tokio::sync::watch::Receiver<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (asked, hearing) = tokio::sync::watch::channel(false);
    let requested = active.handover_requested();
    let listener = tokio::spawn(async move {
        requested.await;
        tracing::info!("a handover of this identity was asked for: draining, then releasing it");
        service_manager::handing_over();
        let _ = asked.send(true);
    });
    let heard = hearing.clone();
    let signalled = stop();
    // The signal's future is shared by every stop made here.
    let signalled = futures::FutureExt::shared(signalled);
    let maker = move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let mut heard = heard.clone();
        let signalled = signalled.clone();
        Box::pin(async move {
            tokio::select! {
                () = signalled => {}
                _ = heard.wait_for(|asked| *asked) => {}
            }
        })
    };
    (Box::new(maker), hearing, listener)
}

/// After an identity's work stopped and its lease was released: starts
/// over as a standby if the stop was a handover (not a signal).
fn after_release(
    handover: &tokio::sync::watch::Receiver<bool>,
    epoch: i64,
    stop: &StopMaker,
) -> anyhow::Result<()> {
    let signalled = futures::FutureExt::now_or_never(stop()).is_some();
    if *handover.borrow() && !signalled {
        return Err(identity::start_over_after_handover(epoch));
    }
    Ok(())
}

/// Opens and serves a sink, with its exporters, listeners and relay, until
/// `stop` resolves; `listening` is called once it listens.
pub async fn serve_sink(
    args: &SinkArgs,
    config: &sink::SinkConfig,
    problems: observe::RecentProblems,
    stop: &StopMaker,
    role: Option<fleet::RoleStatus>,
    listening: impl FnOnce() + Send,
) -> anyhow::Result<()> {
    let sink = Arc::new(sink::Sink::open(config)?);
    sink.describe_process(|| {
        serde_json::json!({
            "heap": serde_json::to_value(crate::heap::figures()).unwrap_or_default(),
            "memory": serde_json::to_value(crate::heap::resident_figures()).unwrap_or_default(),
        })
    });
    if let Some(role) = role.clone() {
        sink.describe_fleet(move || serde_json::to_value(role.report()).unwrap_or_default());
    }
    // Listeners of the feed, each on a thread it ends once the
    // sink is gone and its feed closed.
    let mut listeners = Vec::new();
    let mut exporters = Vec::new();
    if args.export.wanted() {
        let (observed, thread) = observe::SinkObserved::attach(
            sink.clone(),
            config.root.clone(),
            config.state_dir.clone(),
            problems,
        )?;
        listeners.push(thread);
        exporters = observe::export(
            Arc::new(observed.with_role(role)),
            args.export.metrics_listen,
            args.export.otlp("tailflight-sink", None),
            stop(),
        )
        .await?;
    }
    if let Some(path) = &args.feed_log {
        listeners.push(feed_log::attach(&sink, path)?);
    }
    let relay = match (args.events.kafka(), sink.outbox()) {
        (Some(settings), Some(outbox)) => Some(kafka_relay::KafkaRelay::start(
            outbox.clone(),
            settings,
            tokio::runtime::Handle::current(),
        )?),
        _ => None,
    };
    #[cfg(feature = "bench")]
    if let Some(path) = &args.commit_log {
        listeners.push(commit_log::attach(&sink, path)?);
    }
    let health = sink.clone();
    let watchdog = tokio::spawn(service_manager::watchdog(move || {
        match health.health().reason() {
            None => Ok(()),
            Some(reason) => Err(format!("poisoned: {reason}")),
        }
    }));
    let stopping = stop();
    let served = sink::serve_and_tell(
        sink,
        config,
        async move {
            stopping.await;
            service_manager::stopping();
        },
        // The journal's replay is done and the sink listens.
        || {
            service_manager::ready("serving");
            listening();
        },
    )
    .await;
    watchdog.abort();
    if let Some(relay) = relay {
        let _ = tokio::task::spawn_blocking(move || relay.stop()).await;
    }
    for thread in listeners {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    for exporter in exporters {
        exporter.abort();
    }
    served
}

/// A sink identity of a fleet: a standby until it holds the identity's
/// lease, then [`serve_sink`], publishing its endpoint once it listens;
/// a planned stop releases the lease for a standby to take over at once.
pub async fn run_sink_identity(
    args: &SinkArgs,
    config: &sink::SinkConfig,
    problems: observe::RecentProblems,
    stop: &StopMaker,
) -> anyhow::Result<()> {
    let advertise = match &args.advertise {
        Some(url) => url.clone(),
        None => {
            anyhow::ensure!(
                !config.listen.ip().is_unspecified(),
                "--listen {} is no address a client can reach: give --advertise",
                config.listen
            );
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{}", config.listen)
        }
    };
    let identity = args.fleet.identity().unwrap_or_default();
    let role = fleet::RoleStatus::new(fleet::Kind::Sink, identity, args.fleet.cluster());
    // Until it is active, the process shows its role alone; that listener
    // is let go of (its port with it) before the sink's own starts.
    let (standby_over, standby_ends) = tokio::sync::oneshot::channel::<()>();
    let mut standby_exporters = Vec::new();
    if args.export.wanted() {
        let stopping = stop();
        standby_exporters = observe::export(
            Arc::new(observe::fleet::StandbyObserved::new(
                role.clone(),
                problems.clone(),
            )),
            args.export.metrics_listen,
            args.export.otlp("tailflight-sink", None),
            async move {
                tokio::select! {
                    _ = standby_ends => {}
                    () = stopping => {}
                }
            },
        )
        .await?;
    }
    let became = identity::become_active(
        &args.fleet,
        fleet::Kind::Sink,
        &config.state_dir,
        &role,
        stop,
    )
    .await;
    let _ = standby_over.send(());
    for mut exporter in standby_exporters {
        if tokio::time::timeout(Duration::from_secs(2), &mut exporter)
            .await
            .is_err()
        {
            exporter.abort();
            let _ = exporter.await;
        }
    }
    let Some(active) = became? else {
        return Ok(());
    };
    role.activated();
    tracing::info!(identity, %advertise, "active for the sink identity: opening its state");
    let (stop_here, handover, listener) = stop_or_handover(&active, stop);
    let mut config = config.clone();
    config.federation =
        crate::catalogue::federation(&role, identity, &advertise, config.tls.as_ref());
    let (listening_tx, listening_rx) = tokio::sync::oneshot::channel();
    let publish = async {
        if listening_rx.await.is_ok() {
            active.publish_endpoint(advertise.clone()).await;
        }
    };
    let serve = serve_sink(
        args,
        &config,
        problems,
        &*stop_here,
        Some(role.clone()),
        move || {
            let _ = listening_tx.send(());
        },
    );
    let (served, ()) = tokio::join!(serve, publish);
    listener.abort();
    let epoch = active.epoch();
    active.release().await;
    served?;
    after_release(&handover, epoch, stop)
}

/// Runs the watcher until `stop` resolves: as an identity of a fleet with
/// --identity (a standby until it holds the lease), routing over the
/// cluster's sink identities with --coordinator.
pub async fn run_watcher(
    args: &WatchArgs,
    progress: Arc<watcher::Progress>,
    role: Option<fleet::RoleStatus>,
    stop: &StopMaker,
) -> anyhow::Result<()> {
    let mut config = watch_config(args);
    let mut active: Option<identity::ActiveIdentity> = None;
    if let Some(role) = role {
        match identity::become_active(
            &args.fleet,
            fleet::Kind::Watcher,
            &config.state_dir,
            &role,
            stop,
        )
        .await?
        {
            Some(held) => active = Some(held),
            None => return Ok(()),
        }
        role.activated();
    }
    // Kept for as long as the watcher runs: it follows the endpoints.
    let mut _directory = None;
    if args.fleet.coordinated() && config.sinks.is_empty() {
        let coordinator = match &active {
            Some(active) => Some(active.coordinator().clone()),
            None => args.fleet.connect(None, stop()).await?,
        };
        let Some(coordinator) = coordinator else {
            return Ok(());
        };
        let directory = match fleet::follow_sinks(&coordinator, args.sinks_patience).await {
            Ok(directory) => directory,
            Err(e) => {
                // A standby may do better: let it have the identity now.
                if let Some(active) = active {
                    active.release().await;
                }
                return Err(e.into());
            }
        };
        config.sinks = directory.identities().to_vec();
        config.followed_sinks = config
            .sinks
            .iter()
            .filter_map(|identity| directory.endpoint(identity))
            .collect();
        _directory = Some(directory);
    }
    let (stopping, handover) = match &active {
        Some(active) => {
            let (stop_here, handover, listener) = stop_or_handover(active, stop);
            (stop_here(), Some((handover, listener)))
        }
        None => (stop(), None),
    };
    let watched = watcher::run(config, progress, async move {
        stopping.await;
        service_manager::stopping();
    })
    .await;
    if let Some(active) = active {
        let epoch = active.epoch();
        if let Some((_, listener)) = &handover {
            listener.abort();
        }
        active.release().await;
        watched?;
        if let Some((handover, _)) = handover {
            return after_release(&handover, epoch, stop);
        }
        return Ok(());
    }
    watched
}
