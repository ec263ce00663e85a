//! ListFlights: the files a criteria names, each described for its
//! consumer and given a ticket that reads it; and the paths consumers see.

use flight_server::subscription::{Globs, Start, Ticket};
use serde::Serialize;

use crate::config::Layout;
use crate::error::SinkError;
use crate::feed::DurableFile;

/// A destination path relative to its source, as consumers see it.
pub(super) fn relative<'a>(layout: Layout, source: &str, dest_path: &'a str) -> &'a str {
    match layout {
        Layout::PerSource => dest_path
            .strip_prefix(source)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(dest_path),
        Layout::Flat => dest_path,
    }
}

/// What a listed file says of itself, as its FlightInfo's `app_metadata`.
#[derive(Serialize)]
struct ListedFile<'a> {
    source: &'a str,
    path: &'a str,
    file_key: &'a str,
    generation: u64,
    durable_bytes: u64,
    sealed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<&'a str>,
    /// When the sink last recorded a change to it (ms since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_commit_unix_ms: Option<u64>,
}

/// Which files a ListFlights criteria names: a glob over
/// `<source>/<path>` (empty: every file).
pub(crate) struct Criteria(Option<(String, Globs)>);

impl Criteria {
    /// Checked before anything is read: a bad criteria is the peer's fault,
    /// whatever state the sink is in.
    pub(crate) fn parse(criteria: &str) -> Result<Self, SinkError> {
        Ok(Self(match criteria {
            "" => None,
            glob => {
                let source = glob.split('/').next().unwrap_or_default();
                if source.contains(['*', '?', '[', '{']) {
                    return Err(SinkError::Peer(format!(
                        "criteria {glob:?} must start with a source name (<source>/<glob>)"
                    )));
                }
                let globs = Globs::new(source, &[glob.to_owned()]).map_err(SinkError::Peer)?;
                Some((source.to_owned(), globs))
            }
        }))
    }
}

/// The files `criteria` names among `files` (what the manifest holds),
/// superseded generations left out. Each comes with a ticket that reads it
/// from its start (and follows it while it is not sealed).
pub(crate) fn list_files(
    files: &[DurableFile],
    layout: Layout,
    criteria: &Criteria,
) -> Result<Vec<arrow_flight::FlightInfo>, SinkError> {
    use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo};
    let filter = &criteria.0;
    let mut infos = Vec::new();
    for file in files {
        let source = file.id.source.as_str();
        let path = relative(layout, source, &file.path);
        if file.superseded {
            continue;
        }
        if let Some((wanted, globs)) = filter
            && (wanted != source || !globs.matches(&format!("{source}/{path}")))
        {
            continue;
        }
        let ticket = Ticket {
            source: source.to_owned(),
            globs: Vec::new(),
            file_key: Some(file.id.key.clone()),
            start: Start::Beginning,
            cursor: None,
            follow: file.sealed.is_none(),
            max_batch_bytes: None,
        };
        let listed = ListedFile {
            source,
            path,
            file_key: &file.id.key,
            generation: file.id.generation,
            durable_bytes: file.contiguous_end,
            sealed: file.sealed.is_some(),
            size: file.sealed.as_ref().map(|s| s.size),
            digest: file.sealed.as_ref().map(|s| s.digest.as_str()),
            last_commit_unix_ms: file.committed_unix_ms,
        };
        let info = FlightInfo::new()
            .try_with_schema(&flight_server::subscription::consumer_schema())
            .map_err(|e| SinkError::Internal(format!("encoding the consumer schema: {e}")))?
            .with_descriptor(FlightDescriptor::new_path(vec![
                source.to_owned(),
                path.to_owned(),
            ]))
            .with_endpoint(
                FlightEndpoint::new().with_ticket(arrow_flight::Ticket::new(ticket.encode())),
            )
            .with_total_bytes(file.contiguous_end as i64)
            .with_app_metadata(serde_json::to_vec(&listed).unwrap_or_default());
        infos.push(info);
    }
    Ok(infos)
}

#[cfg(test)]
mod tests {
    use manifest_db::FileId;

    use super::*;

    fn file(source: &str, path: &str, key: &str, generation: u64, superseded: bool) -> DurableFile {
        DurableFile {
            id: FileId {
                source: source.into(),
                key: key.into(),
                generation,
            },
            path: format!("{source}/{path}"),
            ranges: vec![(0, 10)],
            contiguous_end: 10,
            sealed: None,
            superseded,
            committed_unix_ms: None,
        }
    }

    fn listed(infos: &[arrow_flight::FlightInfo]) -> Vec<(Vec<String>, Ticket)> {
        infos
            .iter()
            .map(|info| {
                let endpoint = &info.endpoint[0];
                let ticket = endpoint.ticket.as_ref().expect("a ticket");
                (
                    info.flight_descriptor
                        .as_ref()
                        .expect("a descriptor")
                        .path
                        .clone(),
                    Ticket::decode(&ticket.ticket).expect("a ticket of ours"),
                )
            })
            .collect()
    }

    #[test]
    fn a_glob_lists_the_live_generations_it_matches_with_tickets_by_key() {
        let files = [
            file("a", "run1/x.xtc2", "k1", 1, false),
            file("a", "run1/y.xtc2", "k2", 1, true),
            file("a", "run2/x.xtc2", "k3", 1, false),
            file("b", "run1/x.xtc2", "k4", 1, false),
        ];
        let list = |criteria: &str| {
            let criteria = Criteria::parse(criteria).expect("a good criteria");
            list_files(&files, Layout::PerSource, &criteria).expect("listed")
        };
        let infos = list("a/run1/*");
        let got = listed(&infos);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, vec!["a".to_string(), "run1/x.xtc2".to_string()]);
        assert_eq!(got[0].1.file_key.as_deref(), Some("k1"));
        assert!(got[0].1.follow, "an unsealed file is followed");
        // Everything, superseded generations left out.
        assert_eq!(list("").len(), 3);
    }

    #[test]
    fn a_criteria_must_start_with_a_source_name() {
        let Err(error) = Criteria::parse("*/run1/*") else {
            panic!("a criteria without a source was taken");
        };
        assert!(matches!(error, SinkError::Peer(_)), "{error:?}");
    }

    #[test]
    fn paths_are_relative_to_their_source_in_the_per_source_layout() {
        assert_eq!(relative(Layout::PerSource, "a", "a/run1/x"), "run1/x");
        assert_eq!(relative(Layout::Flat, "a", "run1/x"), "run1/x");
    }
}
