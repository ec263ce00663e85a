//! The README's architecture map names every module of every crate: a
//! module added without its line in the map fails here, so the map a
//! newcomer reads cannot drift from the tree again.

use std::collections::BTreeSet;
use std::path::Path;

/// The source folders of the binary and of every workspace member, read
/// from the workspace's `members`, so a new crate is walked too.
fn sources(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("members = ["))
        .expect("the workspace lists its members on one line");
    let mut sources = vec!["src".to_owned()];
    sources.extend(
        members
            .trim_end_matches(']')
            .split(',')
            .map(|member| member.trim().trim_matches('"'))
            .filter(|member| !member.is_empty())
            .map(|member| format!("{member}/src")),
    );
    sources
}

/// The words written in backticks in the README's architecture section
/// (`place/{data, seal}` names both `data` and `seal`).
fn named_in_map(readme: &str) -> BTreeSet<String> {
    let start = readme
        .find("## Architecture")
        .expect("the README has an Architecture section");
    let section = &readme[start..];
    let end = section[3..]
        .find("\n## ")
        .map_or(section.len(), |at| at + 3);
    section[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|quoted| {
            quoted
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| !word.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every module file under `dir`: its name, and its path for the message.
/// Crate roots, `mod.rs` files (named by their folder), tests and binaries'
/// entry points are not modules of their own.
fn modules(dir: &Path, found: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" && name != "bin" {
                modules(&path, found);
            }
            continue;
        }
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let not_a_module = ["mod", "lib", "main", "testkit"].contains(&stem)
            || stem == "tests"
            || stem.ends_with("_tests");
        if !not_a_module {
            found.push((stem.to_owned(), path.display().to_string()));
        }
    }
}

#[test]
fn the_readme_map_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let named = named_in_map(&readme);
    let mut found = Vec::new();
    let sources = sources(root);
    assert!(
        sources.iter().any(|s| s == "sink/src"),
        "the workspace's members were read: {sources:?}"
    );
    for source in &sources {
        modules(&root.join(source), &mut found);
    }
    assert!(
        found.len() > 50,
        "the walk found the crates' modules: {found:?}"
    );
    let missing: Vec<&str> = found
        .iter()
        .filter(|(stem, _)| !named.contains(stem))
        .map(|(_, path)| path.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "modules the README's architecture map does not name (add each with its one-line job): {missing:#?}"
    );
}
