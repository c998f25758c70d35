//! Where values come from: the file, and the environment turned into the
//! same table (`TOOLGATE_A__B` is `a.b`), merged over it.

use std::path::Path;

use super::raw::RawConfig;
use super::{CLIENT_VARIABLES, ConfigError};

/// The environment as a TOML table: `TOOLGATE_A__B=v` is `a.b = v`.
pub(super) fn env_table(env: &[(String, String)]) -> toml::Table {
    let mut table = toml::Table::new();
    for (name, value) in env {
        if CLIENT_VARIABLES.contains(&name.as_str()) {
            continue;
        }
        let Some(key) = name.strip_prefix("TOOLGATE_") else {
            continue;
        };
        let path: Vec<String> = key.split("__").map(str::to_ascii_lowercase).collect();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        insert(&mut table, &path, value);
    }
    table
}

pub(super) fn insert(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = table
                .entry(first.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(t) = entry {
                insert(t, rest, value);
            }
        }
    }
}

/// Overlays `over` on `base`, table by table.
pub(super) fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

pub(super) fn read(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    // Refused here too, so the error names the file.
    toml::Value::Table(table.clone())
        .try_into::<RawConfig>()
        .map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(table)
}
