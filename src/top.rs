//! `tailflight top --from URL`: a terminal view of a watcher or a sink,
//! fed by the JSON status its `--metrics-listen` serves (`/api/status`):
//! a header (endpoint, uptime, verdict), the sources, the connections (or
//! subscriptions), the files furthest behind, and sparklines of lag and
//! throughput. It waits out a process that restarts, and drops columns on
//! a narrow terminal.

use std::time::{Duration, Instant};

use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use serde_json::Value;

#[derive(Args, Clone)]
pub struct TopArgs {
    /// The process's metrics listener, e.g. http://daq-host:9464.
    #[arg(long)]
    from: String,
    /// How often to ask.
    #[arg(long, default_value = "1s", value_parser = crate::parse::parse_duration)]
    every: Duration,
}

/// What the files table is sorted by (key `s` cycles).
#[derive(Clone, Copy, PartialEq)]
enum SortBy {
    LagBytes,
    LagSeconds,
    Path,
}

impl SortBy {
    fn next(self) -> Self {
        match self {
            SortBy::LagBytes => SortBy::LagSeconds,
            SortBy::LagSeconds => SortBy::Path,
            SortBy::Path => SortBy::LagBytes,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortBy::LagBytes => "bytes behind",
            SortBy::LagSeconds => "seconds behind",
            SortBy::Path => "path",
        }
    }
}

struct View {
    endpoint: String,
    status: Option<Value>,
    /// Why the last request failed, and since when it has been failing.
    failing: Option<(String, Instant)>,
    sort: SortBy,
    filter: String,
    editing_filter: bool,
}

pub fn run(args: TopArgs) -> anyhow::Result<std::process::ExitCode> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        anyhow::bail!(
            "tailflight top needs a terminal; for scripts, read {}/api/status",
            args.from.trim_end_matches('/')
        );
    }
    let endpoint = args.from.trim_end_matches('/').to_string();
    let url = format!("{endpoint}/api/status");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let mut view = View {
        endpoint,
        status: None,
        failing: None,
        sort: SortBy::LagBytes,
        filter: String::new(),
        editing_filter: false,
    };
    let mut terminal = ratatui::init();
    let result = (|| -> anyhow::Result<()> {
        let mut next_poll = Instant::now();
        loop {
            if Instant::now() >= next_poll {
                match fetch(&agent, &url) {
                    Ok(status) => {
                        view.status = Some(status);
                        view.failing = None;
                    }
                    Err(error) => {
                        let since = view.failing.take().map_or_else(Instant::now, |(_, t)| t);
                        view.failing = Some((error, since));
                    }
                }
                next_poll = Instant::now() + args.every;
            }
            terminal.draw(|frame| draw(frame, &view))?;
            if event::poll(next_poll.saturating_duration_since(Instant::now()))?
                && let Event::Key(key) = event::read()?
            {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                if view.editing_filter {
                    match key.code {
                        KeyCode::Enter | KeyCode::Esc => view.editing_filter = false,
                        KeyCode::Backspace => {
                            view.filter.pop();
                        }
                        KeyCode::Char(c) => view.filter.push(c),
                        _ => {}
                    }
                    continue;
                }
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('s') => view.sort = view.sort.next(),
                    KeyCode::Char('/') => {
                        view.editing_filter = true;
                        view.filter.clear();
                    }
                    KeyCode::Char('r') => next_poll = Instant::now(),
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn fetch(agent: &ureq::Agent, url: &str) -> Result<Value, String> {
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&body).map_err(|e| format!("not a tailflight status: {e}"))
}

fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2}s")
    } else {
        format!("{s:.0}s")
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn state_style(state: &str) -> Style {
    let color = match state {
        "done" | "idle" | "caught-up" => Color::Green,
        "progressing" => Color::Cyan,
        "falling-behind" => Color::Yellow,
        "stalled" | "failed" | "poisoned" => Color::Red,
        _ => Color::Gray,
    };
    Style::default().fg(color).add_modifier(Modifier::BOLD)
}

/// Bytes per second between the last two history points.
fn throughput(history: &[Value]) -> Vec<f64> {
    history
        .windows(2)
        .map(|pair| {
            let dt = (num(&pair[1]["unix_ms"]) - num(&pair[0]["unix_ms"])) / 1000.0;
            if dt > 0.0 {
                ((num(&pair[1]["bytes_total"]) - num(&pair[0]["bytes_total"])) / dt).max(0.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// One row per process of the cluster (and one for an identity with no
/// active process): kind, identity, node, pid, role, epoch, endpoint.
fn cluster_rows(cluster: &Value) -> Vec<[String; 7]> {
    let mut rows = Vec::new();
    for identity in cluster["identities"].as_array().into_iter().flatten() {
        let name = identity["identity"].as_str().unwrap_or("?").to_string();
        let kind = identity["kind"].as_str().unwrap_or("?").to_string();
        let endpoint = identity["active"]["endpoint"]
            .as_str()
            .unwrap_or("-")
            .to_string();
        for member in identity["members"].as_array().into_iter().flatten() {
            let role = member["role"].as_str().unwrap_or("?").to_string();
            let epoch = num(&member["epoch"]);
            rows.push([
                kind.clone(),
                name.clone(),
                member["node"].as_str().unwrap_or("?").to_string(),
                member["pid"].to_string(),
                role.clone(),
                if epoch > 0.0 {
                    format!("{epoch}")
                } else {
                    "-".into()
                },
                if role == "active" {
                    endpoint.clone()
                } else {
                    "-".into()
                },
            ]);
        }
        if identity["active"].is_null() {
            rows.push([
                kind,
                name,
                "-".into(),
                "-".into(),
                "no active process".into(),
                "-".into(),
                format!("for {}", seconds(num(&identity["inactive_seconds"]))),
            ]);
        }
    }
    rows
}

fn draw_cluster(frame: &mut ratatui::Frame, area: Rect, cluster: &Value, rows: Vec<[String; 7]>) {
    let takeovers: f64 = cluster["identities"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|identity| num(&identity["takeovers"]))
        .sum();
    let identities = cluster["identities"].as_array().map_or(0, Vec::len);
    let nodes: std::collections::BTreeSet<&str> = rows
        .iter()
        .map(|row| row[2].as_str())
        .filter(|node| *node != "-")
        .collect();
    let title = format!(
        " fleet {}: {identities} identities on {} nodes, {takeovers} takeovers ",
        cluster["cluster"].as_str().unwrap_or("?"),
        nodes.len()
    );
    let rows = rows.into_iter().map(|row| {
        let style = state_style(match row[4].as_str() {
            "active" => "caught-up",
            "standby" => "idle",
            "no active process" | "fenced" => "failed",
            _ => "falling-behind",
        });
        let [kind, identity, node, pid, role, epoch, endpoint] = row;
        Row::new(vec![
            Cell::from(kind),
            Cell::from(identity),
            Cell::from(node),
            Cell::from(pid),
            Cell::from(role).style(style),
            Cell::from(epoch),
            Cell::from(endpoint),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(14),
            Constraint::Length(12),
            Constraint::Length(8),
            Constraint::Length(18),
            Constraint::Length(8),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new([
            "kind", "identity", "node", "pid", "role", "epoch", "endpoint",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(title));
    frame.render_widget(table, area);
}

fn draw(frame: &mut ratatui::Frame, view: &View) {
    let area = frame.area();
    let narrow = area.width < 100;
    let cluster_rows = view
        .status
        .as_ref()
        .map(|status| cluster_rows(&status["cluster"]))
        .unwrap_or_default();
    let fleet_height = if cluster_rows.is_empty() {
        0
    } else {
        (cluster_rows.len() as u16 + 3).min(14)
    };
    let [header, fleet, sources, links, files, sparks, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(fleet_height),
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Min(4),
        Constraint::Length(4),
        Constraint::Length(1),
    ])
    .areas(area);
    let Some(status) = &view.status else {
        draw_waiting(frame, area, view);
        return;
    };
    draw_header(frame, header, status, view);
    if !cluster_rows.is_empty() {
        draw_cluster(frame, fleet, &status["cluster"], cluster_rows);
    }
    let history = status["history"].as_array().cloned().unwrap_or_default();
    let rates = throughput(&history);
    let rate_now = rates.last().copied().unwrap_or(0.0);
    if status["role"].as_str() == Some("watcher") {
        draw_watcher_sources(frame, sources, status, rate_now);
        draw_connections(frame, links, status);
        draw_files(frame, files, status, view, narrow);
    } else {
        draw_sink_summary(frame, sources, status, &history, rate_now);
        draw_subscriptions(frame, links, status);
        draw_sink_sources(frame, files, status);
    }
    draw_sparklines(frame, sparks, &history, &rates, rate_now);
    draw_footer(frame, footer, view);
}

/// No answer yet: what the view waits for.
fn draw_waiting(frame: &mut ratatui::Frame, area: Rect, view: &View) {
    let waiting = match &view.failing {
        Some((error, since)) => format!(
            "cannot reach {} for {:.0}s: {error} (retrying)",
            view.endpoint,
            since.elapsed().as_secs_f64()
        ),
        None => format!("asking {}…", view.endpoint),
    };
    frame.render_widget(Paragraph::new(waiting), area);
}

/// The role, endpoint, uptime and verdict, and whether the last ask failed.
fn draw_header(frame: &mut ratatui::Frame, area: Rect, status: &Value, view: &View) {
    let role = status["role"].as_str().unwrap_or("?");
    let verdict = if status["poisoned"].is_string() {
        "poisoned".to_string()
    } else {
        status["sources"][0]["verdict"]
            .as_str()
            .unwrap_or(if status["ready"] == true {
                "ready"
            } else {
                "not ready"
            })
            .to_string()
    };
    let mut head = vec![
        Span::styled(
            "tailflight top ",
            Style::default().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            "{role} at {}  up {}  ",
            view.endpoint,
            seconds(num(&status["uptime_seconds"]))
        )),
        Span::styled(verdict.clone(), state_style(&verdict)),
    ];
    if let Some((error, since)) = &view.failing {
        head.push(Span::styled(
            format!(
                "  unreachable for {:.0}s ({error}); showing the last answer",
                since.elapsed().as_secs_f64()
            ),
            Style::default().fg(Color::Red),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(head)), area);
}

/// A watcher's sources: verdict, lag, what is durable, files by state.
fn draw_watcher_sources(frame: &mut ratatui::Frame, area: Rect, status: &Value, rate_now: f64) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = status["sources"].as_array().into_iter().flatten().map(|s| {
        let verdict = s["verdict"].as_str().unwrap_or("?");
        let states: Vec<String> = s["files_by_state"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, n)| num(n) > 0.0)
            .map(|(state, n)| format!("{state} {}", num(n)))
            .collect();
        Row::new(vec![
            Cell::from(s["source"].as_str().unwrap_or("?").to_string()),
            Cell::from(verdict.to_string()).style(state_style(verdict)),
            Cell::from(bytes(num(&s["lag_bytes"]))),
            Cell::from(seconds(num(&s["lag_seconds"]))),
            Cell::from(format!(
                "{} ({}/s)",
                bytes(num(&s["committed_bytes"])),
                bytes(rate_now)
            )),
            Cell::from(states.join(", ")),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(12),
            Constraint::Length(15),
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(26),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new([
            "source",
            "verdict",
            "behind",
            "seconds",
            "durable (rate)",
            "files",
        ])
        .style(bold),
    )
    .block(Block::default().borders(Borders::TOP).title(" sources "));
    frame.render_widget(table, area);
}

/// A watcher's connections to its sinks.
fn draw_connections(frame: &mut ratatui::Frame, area: Rect, status: &Value) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = status["sinks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|sink| {
            let endpoint = sink["endpoint"].as_str().unwrap_or("?").to_string();
            sink["connection_stats"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |c| {
                    let up = c["up"] == true;
                    Row::new(vec![
                        Cell::from(format!("{endpoint} #{}", num(&c["index"]))),
                        Cell::from(if up { "up" } else { "down" }).style(state_style(if up {
                            "caught-up"
                        } else {
                            "stalled"
                        })),
                        Cell::from(bytes(num(&c["in_flight_bytes"]))),
                        Cell::from(seconds(num(&c["oldest_unacked_seconds"]))),
                        Cell::from(bytes(num(&c["sent_bytes"]))),
                        Cell::from(format!("{}", num(&c["reconnects"]))),
                    ])
                })
        });
    let table = Table::new(
        rows,
        [
            Constraint::Min(24),
            Constraint::Length(5),
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(11),
            Constraint::Length(10),
        ],
    )
    .header(
        Row::new([
            "connection",
            "",
            "in flight",
            "oldest",
            "sent",
            "reconnects",
        ])
        .style(bold),
    )
    .block(
        Block::default()
            .borders(Borders::TOP)
            .title(" connections "),
    );
    frame.render_widget(table, area);
}

/// A sink's totals: durable bytes and rate, rounds, files, what it holds,
/// its disks.
fn draw_sink_summary(
    frame: &mut ratatui::Frame,
    area: Rect,
    status: &Value,
    history: &[Value],
    rate_now: f64,
) {
    let sink = &status["sink"];
    let lines = vec![
        Line::from(format!(
            "durable {} since start ({}/s)  rounds {}  files {} ({} sealed)",
            bytes(history.last().map_or(0.0, |p| num(&p["bytes_total"]))),
            bytes(rate_now),
            num(&status["commit_rounds"]),
            num(&sink["files"]),
            num(&sink["sealed_files"]),
        )),
        Line::from(format!(
            "held {}  journal backlog {}  placements {} running, {} waiting",
            bytes(num(&sink["held_bytes"])),
            bytes(num(&sink["journal_backlog_bytes"])),
            num(&sink["placements_running"]),
            num(&sink["placements_waiting"]),
        )),
        Line::from(
            status["disk"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    format!(
                        "{}: {} free of {}",
                        d["dir"].as_str().unwrap_or("?"),
                        bytes(num(&d["free_bytes"])),
                        bytes(num(&d["size_bytes"]))
                    )
                })
                .collect::<Vec<_>>()
                .join("   "),
        ),
    ];
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::TOP).title(" sink ")),
        area,
    );
}

/// A sink's live-tail subscriptions and how far each is behind.
fn draw_subscriptions(frame: &mut ratatui::Frame, area: Rect, status: &Value) {
    let sink = &status["sink"];
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = sink["subscriptions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            Row::new(vec![
                s["peer"].as_str().unwrap_or("?").to_string(),
                s["source"].as_str().unwrap_or("?").to_string(),
                bytes(num(&s["sent_bytes"])),
                bytes(num(&s["behind_bytes"])),
                seconds(num(&s["behind_seconds"])),
            ])
        });
    let table = Table::new(
        rows,
        [
            Constraint::Min(22),
            Constraint::Length(12),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(8),
        ],
    )
    .header(Row::new(["subscriber", "source", "sent", "behind", "seconds"]).style(bold))
    .block(
        Block::default()
            .borders(Borders::TOP)
            .title(" subscriptions "),
    );
    frame.render_widget(table, area);
}

/// A sink's sources and what each made durable.
fn draw_sink_sources(frame: &mut ratatui::Frame, area: Rect, status: &Value) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = status["sources"].as_array().into_iter().flatten().map(|s| {
        Row::new(vec![
            s["source"].as_str().unwrap_or("?").to_string(),
            bytes(num(&s["committed_bytes"])),
        ])
    });
    let table = Table::new(rows, [Constraint::Min(20), Constraint::Length(20)])
        .header(Row::new(["source", "durable since start"]).style(bold))
        .block(Block::default().borders(Borders::TOP).title(" sources "));
    frame.render_widget(table, area);
}

/// Seconds behind and the durable rate over the last minutes.
fn draw_sparklines(
    frame: &mut ratatui::Frame,
    area: Rect,
    history: &[Value],
    rates: &[f64],
    rate_now: f64,
) {
    let [lag_area, rate_area] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let lag: Vec<u64> = history
        .iter()
        .map(|p| (num(&p["lag_seconds"]) * 1000.0) as u64)
        .collect();
    let rate_points: Vec<u64> = rates.iter().map(|r| *r as u64).collect();
    frame.render_widget(
        Sparkline::default()
            .block(Block::default().borders(Borders::TOP).title(format!(
                " seconds behind, last {} ",
                seconds(history.len() as f64 * 2.0)
            )))
            .data(&lag[lag.len().saturating_sub(lag_area.width as usize)..])
            .style(Style::default().fg(Color::Yellow)),
        lag_area,
    );
    frame.render_widget(
        Sparkline::default()
            .block(
                Block::default()
                    .borders(Borders::TOP)
                    .title(format!(" durable {}/s ", bytes(rate_now))),
            )
            .data(&rate_points[rate_points.len().saturating_sub(rate_area.width as usize)..])
            .style(Style::default().fg(Color::Cyan)),
        rate_area,
    );
}

/// The keys, or the filter being typed.
fn draw_footer(frame: &mut ratatui::Frame, area: Rect, view: &View) {
    let help = if view.editing_filter {
        format!("filter: {}▏ (Enter to apply, Esc to close)", view.filter)
    } else {
        format!(
            "q quit  s sort ({})  / filter{}  r refresh",
            view.sort.name(),
            if view.filter.is_empty() {
                String::new()
            } else {
                format!(" ({})", view.filter)
            }
        )
    };
    frame.render_widget(
        Paragraph::new(help).style(Style::default().fg(Color::DarkGray)),
        area,
    );
}

fn draw_files(frame: &mut ratatui::Frame, area: Rect, status: &Value, view: &View, narrow: bool) {
    let mut files: Vec<&Value> = status["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            view.filter.is_empty() || f["path"].as_str().is_some_and(|p| p.contains(&view.filter))
        })
        .collect();
    match view.sort {
        SortBy::LagBytes => {
            files.sort_by(|a, b| num(&b["lag_bytes"]).total_cmp(&num(&a["lag_bytes"])))
        }
        SortBy::LagSeconds => {
            files.sort_by(|a, b| num(&b["lag_seconds"]).total_cmp(&num(&a["lag_seconds"])))
        }
        SortBy::Path => files.sort_by_key(|f| f["path"].as_str().unwrap_or_default().to_string()),
    }
    let rows = files.iter().map(|f| {
        let state = f["state"].as_str().unwrap_or("?");
        let mut cells = vec![
            Cell::from(f["path"].as_str().unwrap_or("?").to_string()),
            Cell::from(state.to_string()).style(state_style(state)),
            Cell::from(bytes(num(&f["lag_bytes"]))),
            Cell::from(seconds(num(&f["lag_seconds"]))),
        ];
        if !narrow {
            cells.push(Cell::from(format!(
                "{} ({}/s)",
                bytes(num(&f["size"])),
                bytes(num(&f["append_rate"]))
            )));
            cells.push(Cell::from(format!("{}/s", bytes(num(&f["drain_rate"])))));
            cells.push(Cell::from(
                f["eta_seconds"].as_f64().map_or("–".to_string(), seconds),
            ));
        }
        Row::new(cells)
    });
    let mut widths = vec![
        Constraint::Min(20),
        Constraint::Length(15),
        Constraint::Length(11),
        Constraint::Length(8),
    ];
    let mut names = vec!["file", "state", "behind", "seconds"];
    if !narrow {
        widths.extend([
            Constraint::Length(24),
            Constraint::Length(13),
            Constraint::Length(13),
        ]);
        names.extend(["size (appended/s)", "durable/s", "caught up in"]);
    }
    let more = status["files_not_listed"].as_u64().unwrap_or(0);
    let title = if more > 0 {
        format!(" files furthest behind (and {more} more) ")
    } else {
        " files furthest behind ".to_string()
    };
    let table = Table::new(rows, widths)
        .header(Row::new(names).style(Style::default().add_modifier(Modifier::BOLD)))
        .block(Block::default().borders(Borders::TOP).title(title));
    frame.render_widget(table, area);
}
