//! The set of loaded tool contracts, by name.
//!
//! Owns reading a contracts directory and the rule that tool names are unique across files.
//! Must not watch or reload (the policy layer swaps whole registries) and knows nothing of
//! Cedar or gRPC.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::contract::ToolContract;
use super::contract_error::ToolContractError;

/// Tool contracts by name; iteration is in name order. Contracts are shared (`Arc`) so a
/// decision in flight keeps its contract while a reload swaps the registry.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<ToolContract>>,
}

impl ToolRegistry {
    /// Loads every `*.json` file directly in `dir` (not `.`-prefixed ones, which editors
    /// leave behind), one contract per file, in file-name order. The file name need not be
    /// the tool name.
    ///
    /// # Errors
    /// The first problem in file-name order: `dir` missing or unreadable, a file unreadable
    /// ([`ToolContractErrorKind::Io`](super::ToolContractErrorKind::Io)), a contract invalid,
    /// or a name defined twice
    /// ([`ToolContractErrorKind::DuplicateName`](super::ToolContractErrorKind::DuplicateName),
    /// located at the second file's `name`).
    pub fn load_dir(dir: &Path) -> Result<ToolRegistry, ToolContractError> {
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in fs::read_dir(dir).map_err(|error| ToolContractError::io(dir, error))? {
            let path = entry
                .map_err(|error| ToolContractError::io(dir, error))?
                .path();
            let is_contract = path.extension().is_some_and(|ext| ext == "json")
                && path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| !name.starts_with('.'));
            if is_contract {
                files.push(path);
            }
        }
        files.sort();
        let mut contracts = Vec::with_capacity(files.len());
        for path in files {
            let text =
                fs::read_to_string(&path).map_err(|error| ToolContractError::io(&path, error))?;
            contracts.push(ToolContract::parse(&path, &text)?);
        }
        ToolRegistry::from_contracts(contracts)
    }

    /// A registry of `contracts`.
    ///
    /// # Errors
    /// [`ToolContractErrorKind::DuplicateName`](super::ToolContractErrorKind::DuplicateName)
    /// for the first contract whose name an earlier one already has.
    pub fn from_contracts(
        contracts: impl IntoIterator<Item = ToolContract>,
    ) -> Result<ToolRegistry, ToolContractError> {
        let mut tools = BTreeMap::new();
        for contract in contracts {
            match tools.entry(contract.name.clone()) {
                Entry::Vacant(slot) => {
                    slot.insert(Arc::new(contract));
                }
                Entry::Occupied(first) => return Err(contract.duplicate_of(first.get())),
            }
        }
        Ok(ToolRegistry { tools })
    }

    /// The contract named `name` (exact, case-sensitive match).
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<ToolContract>> {
        self.tools.get(name)
    }

    /// Every contract, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &ToolContract> {
        self.tools.values().map(Arc::as_ref)
    }

    /// How many tools there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolContractErrorKind;

    fn contract(name: &str) -> String {
        format!(
            "{{\n  \"name\": \"{name}\",\n  \"version\": \"1\",\n  \"risk\": \"read\",\n  \"timeoutMs\": 100,\n  \"inputSchema\": {{\"type\": \"object\"}}\n}}\n"
        )
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn loads_json_files_in_name_order() {
        let dir = dir_with(&[
            ("z.json", &contract("alpha")),
            ("a.json", &contract("beta")),
            (".#a.json", "not json"),
            ("README.md", "not json"),
            ("c.json.bak", "not json"),
        ]);
        let registry = ToolRegistry::load_dir(dir.path()).unwrap();
        assert_eq!(registry.len(), 2);
        assert!(!registry.is_empty());
        let names: Vec<&str> = registry.iter().map(|tool| tool.name.as_str()).collect();
        assert_eq!(names, ["alpha", "beta"]);
        let alpha = registry.get("alpha").unwrap();
        assert_eq!(alpha.source_path, dir.path().join("z.json"));
        assert!(registry.get("Alpha").is_none());
    }

    #[test]
    fn empty_directory_is_an_empty_registry() {
        let dir = dir_with(&[]);
        let registry = ToolRegistry::load_dir(dir.path()).unwrap();
        assert!(registry.is_empty());
        assert_eq!(registry.iter().count(), 0);
    }

    #[test]
    fn missing_directory_is_an_error() {
        let dir = dir_with(&[]);
        let missing = dir.path().join("tools");
        let error = ToolRegistry::load_dir(&missing).unwrap_err();
        assert!(matches!(
            error.kind(),
            ToolContractErrorKind::Io(io) if io.kind() == std::io::ErrorKind::NotFound
        ));
        assert_eq!(error.location().path, missing);
        assert_eq!(error.location().line, None);
        assert!(
            error
                .to_string()
                .starts_with(&format!("{}: cannot read: ", missing.display()))
        );
    }

    #[test]
    fn duplicate_names_across_files() {
        let dir = dir_with(&[
            ("one.json", &contract("refund")),
            ("two.json", &contract("refund")),
        ]);
        let error = ToolRegistry::load_dir(dir.path()).unwrap_err();
        let first = dir.path().join("one.json");
        let second = dir.path().join("two.json");
        assert!(matches!(
            error.kind(),
            ToolContractErrorKind::DuplicateName { name, first: f } if name == "refund" && *f == first
        ));
        assert_eq!(
            error.to_string(),
            format!(
                "{}:2:3: duplicate tool name `refund`, first defined in `{}`",
                second.display(),
                first.display()
            )
        );
    }

    #[test]
    fn the_first_invalid_file_is_reported() {
        let dir = dir_with(&[
            ("a.json", &contract("ok")),
            ("b.json", &contract("not ok")),
            ("c.json", "{"),
        ]);
        let error = ToolRegistry::load_dir(dir.path()).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{}:2:3: invalid tool name `not ok`",
                dir.path().join("b.json").display()
            )
        );
    }

    #[test]
    fn unreadable_file_is_an_error() {
        let dir = dir_with(&[]);
        fs::write(dir.path().join("bad.json"), [0xff, 0xfe]).unwrap();
        let error = ToolRegistry::load_dir(dir.path()).unwrap_err();
        assert!(matches!(
            error.kind(),
            ToolContractErrorKind::Io(io) if io.kind() == std::io::ErrorKind::InvalidData
        ));
        assert_eq!(error.location().path, dir.path().join("bad.json"));
    }
}
