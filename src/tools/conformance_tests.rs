//! JSON-Schema-Test-Suite (Draft 2020-12) through [`compile_schema`], the same construction
//! every contract schema goes through.
//!
//! The suite is read in place from `../shared/conformance/JSON-Schema-Test-Suite` (see its
//! `PROVENANCE.md`). Test schemas `$ref` `http://localhost:1234/<path>`; those are served from
//! `remotes/<path>` through a [`Registry`] handed to `compile_schema`, which is the only way
//! jsonschema 0.61 honours the custom meta-schemas some tests use. Production passes no
//! registry and fetches nothing.
//!
//! Each run asserts how many tests it ran, so a wrong path cannot pass vacuously, and the
//! exact list of tests whose outcome differs from the suite's expectation.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use jsonschema::{Registry, Retrieve, Uri};
use serde_json::Value;

use super::schema::{Formats, compile_schema};
use crate::prerequisites::suite_dir;

const REMOTE_BASE: &str = "http://localhost:1234/";

/// Serves `http://localhost:1234/<path>` from `remotes/<path>`; everything else is refused.
struct Remotes(PathBuf);

impl Retrieve for Remotes {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let path = uri
            .as_str()
            .strip_prefix(REMOTE_BASE)
            .ok_or_else(|| format!("not a test remote: {uri}"))?;
        Ok(serde_json::from_str(&fs::read_to_string(
            self.0.join(path),
        )?)?)
    }
}

fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
}

fn remote_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            remote_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "json") {
            out.push(path);
        }
    }
}

/// Every remote except `remotes/v1/`, whose meta-schema (`https://json-schema.org/v1`, the
/// draft after 2020-12) jsonschema 0.61 does not know; no 2020-12 test refers to it.
fn remotes_registry(suite: &Path) -> Registry<'static> {
    let root = suite.join("remotes");
    let mut files = Vec::new();
    remote_files(&root, &mut files);
    files.retain(|file| !file.starts_with(root.join("v1")));
    files.sort();
    assert_eq!(files.len(), 62, "remotes found: {files:?}");
    let resources = files.iter().map(|file| {
        let relative = file.strip_prefix(&root).unwrap().to_str().unwrap();
        let contents: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
        (format!("{REMOTE_BASE}{relative}"), contents)
    });
    Registry::new()
        .retriever(Remotes(root.clone()))
        .extend(resources)
        .unwrap()
        .prepare()
        .unwrap()
}

/// One test whose outcome differs from the suite's expectation: (file, group, test).
type Deviation = (String, String, String);

struct Run {
    tests: usize,
    deviations: Vec<Deviation>,
}

/// Runs every test in `dir/*.json`. A group whose schema does not compile counts each of its
/// tests as a deviation (reason on stderr).
fn run(suite: &Path, dir: &str, formats: Formats) -> Run {
    let registry = remotes_registry(suite);
    let mut run = Run {
        tests: 0,
        deviations: Vec::new(),
    };
    for file in json_files(&suite.join(dir)) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let groups: Value = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
        for group in groups.as_array().unwrap() {
            let description = group["description"].as_str().unwrap();
            let tests = group["tests"].as_array().unwrap();
            run.tests += tests.len();
            let validator = compile_schema(&group["schema"], formats, Some(&registry));
            for test in tests {
                let test_description = test["description"].as_str().unwrap();
                let outcome = match &validator {
                    Ok(validator) => {
                        let valid = validator.is_valid(&test["data"]);
                        (valid == test["valid"].as_bool().unwrap())
                            .then_some(())
                            .ok_or_else(|| format!("is_valid = {valid}"))
                    }
                    Err(error) => Err(format!("schema does not compile: {error}")),
                };
                if let Err(reason) = outcome {
                    eprintln!("{dir}/{name} | {description} | {test_description}: {reason}");
                    run.deviations.push((
                        name.clone(),
                        description.to_owned(),
                        test_description.to_owned(),
                    ));
                }
            }
        }
    }
    run
}

fn assert_deviations(run: &Run, expected: &[Deviation]) {
    let found: BTreeSet<&Deviation> = run.deviations.iter().collect();
    let expected: BTreeSet<&Deviation> = expected.iter().collect();
    let unexpected: Vec<_> = found.difference(&expected).collect();
    let missing: Vec<_> = expected.difference(&found).collect();
    assert!(
        unexpected.is_empty() && missing.is_empty(),
        "unexpected deviations: {unexpected:#?}\nexpected deviations that passed: {missing:#?}"
    );
}

fn deviation(file: &str, group: &str, test: &str) -> Deviation {
    (file.to_owned(), group.to_owned(), test.to_owned())
}

/// The 19 tests of `format.json` that check `format` is an annotation by default: under the
/// production setting every format is asserted, so these invalid strings are rejected.
fn annotation_by_default_tests() -> Vec<Deviation> {
    [
        "email",
        "idn-email",
        "regex",
        "ipv4",
        "ipv6",
        "idn-hostname",
        "hostname",
        "date",
        "date-time",
        "time",
        "json-pointer",
        "relative-json-pointer",
        "iri",
        "iri-reference",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
        "duration",
    ]
    .iter()
    .map(|format| {
        deviation(
            "format.json",
            &format!("{format} format"),
            &format!("invalid {format} string is only an annotation by default"),
        )
    })
    .collect()
}

/// The one group of `optional/format/unknown.json` (7 tests): production refuses an unknown
/// format when the schema is compiled instead of ignoring it, so the group never runs.
fn unknown_format_tests() -> Vec<Deviation> {
    [
        "integers", "floats", "objects", "arrays", "booleans", "nulls", "strings",
    ]
    .iter()
    .map(|kind| {
        deviation(
            "unknown.json",
            "unknown format",
            &format!("unknown formats ignore {kind}"),
        )
    })
    .collect()
}

#[test]
fn required_with_specification_defaults() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(&suite, "tests/draft2020-12", Formats::Annotated);
    assert_eq!(run.tests, 1299);
    assert_deviations(&run, &[]);
}

#[test]
fn required_with_production_settings() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(&suite, "tests/draft2020-12", Formats::Asserted);
    assert_eq!(run.tests, 1299);
    assert_deviations(&run, &annotation_by_default_tests());
}

#[test]
fn optional_format_with_production_settings() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(
        &suite,
        "tests/draft2020-12/optional/format",
        Formats::Asserted,
    );
    assert_eq!(run.tests, 764);
    assert_deviations(&run, &unknown_format_tests());
}

#[test]
fn optional_format_with_format_assertion_on() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(
        &suite,
        "tests/draft2020-12/optional/format",
        Formats::AssertedIgnoringUnknown,
    );
    assert_eq!(run.tests, 764);
    assert_deviations(&run, &[]);
}

#[test]
fn optional_with_specification_defaults() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(&suite, "tests/draft2020-12/optional", Formats::Annotated);
    assert_eq!(run.tests, 162);
    assert_deviations(&run, &[]);
}

#[test]
fn optional_with_production_settings() {
    let Some(suite) = suite_dir("JSON-Schema-Test-Suite") else {
        return;
    };
    let run = run(&suite, "tests/draft2020-12/optional", Formats::Asserted);
    assert_eq!(run.tests, 162);
    assert_deviations(&run, &[]);
}
