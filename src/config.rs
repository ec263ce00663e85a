//! `--config FILE`: a TOML file equivalent to the flags.
//!
//! Each key becomes the flag of the same name (`batch_bytes = "8MiB"` is
//! `--batch-bytes=8MiB`), placed before the flags given on the command line so
//! those win. Keys may sit at the top level or in a table named after the
//! subcommand (`[sink]`, `[watch]`), so one file can configure several.
//! A table inside that prefixes its keys: `[sink.kafka]` `brokers = "..."` is
//! `--kafka-brokers=...`, and a table in it gives a repeated KEY=VALUE flag:
//! `[sink.kafka.property]` `"compression.type" = "zstd"` is
//! `--kafka-property=compression.type=zstd`.

use std::ffi::OsString;

use anyhow::{Context, bail};

const SUBCOMMANDS: [&str; 8] = [
    "sink", "watch", "sim", "verify", "certs", "status", "audit", "demo",
];

pub fn expand_config_args(mut args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let mut config_path = None;
    let mut i = 1;
    while i < args.len() {
        let arg = args[i].to_string_lossy().into_owned();
        if arg == "--config" {
            let Some(path) = args.get(i + 1).cloned() else {
                bail!("--config needs a file")
            };
            config_path = Some(path);
            args.drain(i..i + 2);
            continue;
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            config_path = Some(OsString::from(path));
            args.remove(i);
            continue;
        }
        i += 1;
    }
    let Some(path) = config_path else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read config {}", path.to_string_lossy()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("config {} is not valid TOML", path.to_string_lossy()))?;
    let Some(position) = args
        .iter()
        .position(|a| SUBCOMMANDS.contains(&a.to_string_lossy().as_ref()))
    else {
        bail!("--config needs a subcommand ({})", SUBCOMMANDS.join(", "));
    };
    let subcommand = args[position].to_string_lossy().into_owned();
    let section = match table.get(&subcommand) {
        Some(toml::Value::Table(section)) => section.clone(),
        _ => table
            .into_iter()
            .filter(|(k, _)| !SUBCOMMANDS.contains(&k.as_str()))
            .collect(),
    };
    let mut flags = Vec::new();
    for (key, value) in section {
        let flag = format!("--{}", key.replace('_', "-"));
        let context = || format!("config {}: key {key}", path.to_string_lossy());
        match value {
            toml::Value::Table(table) => {
                for (inner, value) in table {
                    let flag = format!("{flag}-{}", inner.replace('_', "-"));
                    match value {
                        toml::Value::Table(pairs) => {
                            for (name, value) in pairs {
                                let value = match value {
                                    toml::Value::String(s) => s,
                                    other => other.to_string(),
                                };
                                flags.push(format!("{flag}={name}={value}"));
                            }
                        }
                        value => push_flag(&mut flags, &flag, &value).with_context(context)?,
                    }
                }
            }
            value => push_flag(&mut flags, &flag, &value).with_context(context)?,
        }
    }
    args.splice(
        position + 1..position + 1,
        flags.into_iter().map(OsString::from),
    );
    Ok(args)
}

fn push_flag(flags: &mut Vec<String>, flag: &str, value: &toml::Value) -> anyhow::Result<()> {
    match value {
        toml::Value::Boolean(true) => flags.push(flag.to_owned()),
        toml::Value::Boolean(false) => {}
        toml::Value::String(s) => flags.push(format!("{flag}={s}")),
        toml::Value::Integer(n) => flags.push(format!("{flag}={n}")),
        toml::Value::Float(x) => flags.push(format!("{flag}={x}")),
        toml::Value::Array(items) => {
            for item in items {
                push_flag(flags, flag, item)?;
            }
        }
        other => bail!("unsupported value {other}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments `extra` after `tailflight <subcommand> --config F`
    /// become, with `toml` in F.
    fn expand(name: &str, toml: &str, subcommand: &str, extra: &[&str]) -> Vec<String> {
        let dir = std::env::temp_dir().join(format!("tailflight-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, toml).unwrap();
        let mut args: Vec<OsString> = ["tailflight", subcommand, "--config"]
            .iter()
            .map(OsString::from)
            .collect();
        args.push(file.into_os_string());
        args.extend(extra.iter().map(OsString::from));
        expand_config_args(args)
            .unwrap()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn config_keys_become_flags_before_the_command_line_ones() {
        let out = expand(
            "config",
            "[watch]\nto = [\"http://a:1\", \"http://b:2\"]\npoll = true\nbatch_bytes = \"8MiB\"\n",
            "watch",
            &["--batch-bytes=1MiB"],
        );
        assert_eq!(out[0..2], ["tailflight", "watch"]);
        assert!(
            out.contains(&"--to=http://a:1".to_string())
                && out.contains(&"--to=http://b:2".to_string())
        );
        assert!(out.contains(&"--poll".to_string()));
        assert_eq!(out.last().unwrap(), "--batch-bytes=1MiB");
    }

    #[test]
    fn the_events_key_picks_how_the_watcher_hears_of_changes() {
        let out = expand(
            "config-events",
            "[watch]\nevents = \"fanotify\"\n",
            "watch",
            &[],
        );
        assert!(out.contains(&"--events=fanotify".to_string()), "{out:?}");
    }

    #[test]
    fn a_table_in_a_section_prefixes_its_keys() {
        let out = expand(
            "config-t",
            "[sink.kafka]\nbrokers = \"k:9092\"\n[sink.kafka.property]\n\"compression.type\" = \"zstd\"\n",
            "sink",
            &[],
        );
        assert!(
            out.contains(&"--kafka-brokers=k:9092".to_string()),
            "{out:?}"
        );
        assert!(
            out.contains(&"--kafka-property=compression.type=zstd".to_string()),
            "{out:?}"
        );
    }

    #[test]
    fn the_example_configs_parse_as_flags() {
        use clap::Parser;
        for (subcommand, file) in [
            ("sink", "ops/config/sink.example.toml"),
            ("watch", "ops/config/watch.example.toml"),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let args = expand_config_args(vec![
                "tailflight".into(),
                subcommand.into(),
                "--config".into(),
                path.into_os_string(),
            ])
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
            if let Err(e) = crate::Cli::try_parse_from(&args) {
                panic!("{file} does not parse: {e}");
            }
        }
    }
}
