//! `tailflight fleet`: the cluster as etcd records it (every identity, its
//! active process, the processes standing by, takeovers), and planned
//! handovers (`tailflight fleet handover IDENTITY`) for draining a node.

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::{Args, Subcommand};
use fleet::{ClusterView, Kind};

use crate::identity::FleetArgs;
use crate::process::say;

#[derive(Args, Clone)]
pub struct ClusterArgs {
    #[command(subcommand)]
    action: Option<ClusterAction>,
    /// Print the view as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    fleet: FleetArgs,
}

#[derive(Subcommand, Clone)]
enum ClusterAction {
    /// List every identity, its active process and the ones standing by (the default).
    List,
    /// Hand an identity over to a standby now: its active process drains
    /// (as for a planned stop), releases the lease and stands by itself.
    Handover {
        #[arg(value_name = "IDENTITY")]
        name: String,
        /// The identity is a watcher's.
        #[arg(long)]
        watcher: bool,
        /// Hand over even with no process standing by (the same process
        /// takes the identity back after its pause).
        #[arg(long)]
        force: bool,
        /// How long to wait for the new active process (0: do not wait).
        #[arg(long, default_value = "60s", value_parser = crate::parse::parse_duration)]
        wait: Duration,
    },
}

pub fn run(args: ClusterArgs) -> anyhow::Result<std::process::ExitCode> {
    if !args.fleet.coordinated() {
        bail!("tailflight fleet needs --coordinator etcd://HOST:PORT,...");
    }
    if args.fleet.identity().is_some() {
        bail!(
            "--identity is for sinks and watchers; name the identity to hand over after `handover`"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let Some(coordinator) = args.fleet.connect(None, std::future::pending()).await? else {
            bail!("the coordinator is unreachable");
        };
        match args.action.clone().unwrap_or(ClusterAction::List) {
            ClusterAction::List => {
                let view = fleet::view::read(&coordinator).await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&view)?);
                } else {
                    print!("{}", table(&view));
                }
                Ok(std::process::ExitCode::SUCCESS)
            }
            ClusterAction::Handover {
                name: identity,
                watcher,
                force,
                wait,
            } => {
                let kind = if watcher { Kind::Watcher } else { Kind::Sink };
                let asked = Instant::now();
                let requested = fleet::handover::request(&coordinator, kind, &identity, force).await?;
                if !args.json {
                    say!(
                        "asked {} pid {} (epoch {}) to hand {} {identity} over",
                        requested.from.host,
                        requested.from.pid,
                        requested.epoch,
                        kind.singular()
                    );
                }
                if wait.is_zero() {
                    return Ok(std::process::ExitCode::SUCCESS);
                }
                let taken = tokio::time::timeout(
                    wait,
                    fleet::handover::wait_taken_over(&coordinator, kind, &identity, requested.epoch),
                )
                .await;
                let Ok((member, epoch)) = taken else {
                    say!(
                        "tailflight fleet: no process took {identity} over within {wait:?} (is one standing by?)"
                    );
                    return Ok(std::process::ExitCode::from(3));
                };
                let seconds = asked.elapsed().as_secs_f64();
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "identity": identity,
                            "kind": kind.singular(),
                            "from": {"host": requested.from.host, "pid": requested.from.pid, "epoch": requested.epoch},
                            "to": {"host": member.host, "pid": member.pid, "epoch": epoch, "endpoint": member.endpoint},
                            "seconds": seconds,
                        })
                    );
                } else {
                    println!(
                        "{identity}: now active on {} pid {} (epoch {epoch}{}), {seconds:.2} s after the request",
                        member.host,
                        member.pid,
                        member
                            .endpoint
                            .as_deref()
                            .map(|e| format!(", serving at {e}"))
                            .unwrap_or_default()
                    );
                }
                Ok(std::process::ExitCode::SUCCESS)
            }
        }
    })
}

/// The view as a table, one row per process.
fn table(view: &ClusterView) -> String {
    let mut rows = vec![
        [
            "KIND",
            "IDENTITY",
            "NODE",
            "PID",
            "ROLE",
            "EPOCH",
            "ENDPOINT",
            "TAKEOVERS",
        ]
        .map(String::from),
    ];
    for identity in &view.identities {
        let endpoint = identity
            .active
            .as_ref()
            .and_then(|active| active.member.endpoint.clone())
            .unwrap_or_else(|| "-".into());
        if identity.members.is_empty() && identity.active.is_some() {
            // Active, but its announcement is not (yet) there.
            rows.push([
                identity.kind.clone(),
                identity.identity.clone(),
                "-".into(),
                "-".into(),
                "active".into(),
                "-".into(),
                endpoint.clone(),
                identity.takeovers.to_string(),
            ]);
        }
        for member in &identity.members {
            rows.push([
                identity.kind.clone(),
                identity.identity.clone(),
                member.node.clone(),
                member.pid.to_string(),
                member.role.as_str().into(),
                if member.epoch > 0 {
                    member.epoch.to_string()
                } else {
                    "-".into()
                },
                if member.role == fleet::Role::Active {
                    endpoint.clone()
                } else {
                    "-".into()
                },
                identity.takeovers.to_string(),
            ]);
        }
        if identity.active.is_none() {
            rows.push([
                identity.kind.clone(),
                identity.identity.clone(),
                "-".into(),
                "-".into(),
                "NO ACTIVE PROCESS".into(),
                "-".into(),
                "-".into(),
                identity.takeovers.to_string(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..8)
        .map(|column| rows.iter().map(|row| row[column].len()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}
