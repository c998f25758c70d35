//! Loading a `policies/` folder into a [`PolicyEngine`], with diagnostics
//! that name the file and line of every problem.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cedar_policy::{
    Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet,
    RestrictedExpression, Schema, SchemaFragment, ValidationMode, Validator,
};
use miette::Diagnostic;
use sha2::{Digest, Sha256};

use super::callable::CallableIndex;
use super::diagnostic::codes;
use super::principals::PrincipalBases;
use super::reach::RequestBases;
use super::schema::{GENERATED_ENTITY_TYPES, core_fragment, tool_actions_fragment};
use super::slice::PolicySlices;
use super::{PolicyEngine, SourceDiagnostic};
use crate::budgets::{self, BudgetError, Budgets};
use crate::tools::{ToolContractError, ToolRegistry};

/// One reason a policy folder could not be loaded.
#[derive(Debug, thiserror::Error, Diagnostic)]
pub enum PolicyLoadError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Tools(#[from] ToolContractError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Source(Box<SourceDiagnostic>),
}

impl PolicyLoadError {
    /// This problem as one located, coded diagnostic: the form machines read
    /// (`toolgate check --format json`, the reload status, logs).
    #[must_use]
    pub fn to_diagnostic(&self) -> SourceDiagnostic {
        match self {
            Self::Io { path, .. } => {
                SourceDiagnostic::whole_file(path, self.to_string()).with_code(codes::IO)
            }
            Self::Tools(e) => {
                let at = e.location();
                let mut d = SourceDiagnostic::at_line_column(
                    &at.path,
                    at.line.unwrap_or(1),
                    at.column.unwrap_or(1),
                    e.kind().to_string(),
                );
                if let Some(code) = e.code() {
                    d.code = code.to_string();
                }
                d.help = e.help().map(|h| h.to_string());
                d
            }
            Self::Source(d) => (**d).clone(),
        }
    }
}

impl LoadErrors {
    /// Every problem as a located, coded diagnostic, in load order.
    #[must_use]
    pub fn diagnostics(&self) -> Vec<SourceDiagnostic> {
        self.errors
            .iter()
            .map(PolicyLoadError::to_diagnostic)
            .collect()
    }
}

impl From<SourceDiagnostic> for PolicyLoadError {
    fn from(d: SourceDiagnostic) -> Self {
        Self::Source(Box::new(d))
    }
}

/// Every problem found in one load, in file order. Loading reports all of
/// them at once so a team fixes a broken set in one pass.
#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("the policy set in `{}` is invalid ({} problem(s))", dir.display(), errors.len())]
pub struct LoadErrors {
    pub dir: PathBuf,
    #[related]
    pub errors: Vec<PolicyLoadError>,
    /// Warnings found before loading stopped (validator warnings, when
    /// validation was reached).
    pub warnings: Vec<SourceDiagnostic>,
}

impl LoadErrors {
    fn one(dir: &Path, e: impl Into<PolicyLoadError>) -> Self {
        Self {
            dir: dir.to_path_buf(),
            errors: vec![e.into()],
            warnings: Vec::new(),
        }
    }
}

struct SourceFile {
    path: PathBuf,
    text: String,
}

fn read(path: &Path) -> Result<String, PolicyLoadError> {
    std::fs::read_to_string(path).map_err(|source| PolicyLoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The `*.ext` files directly inside `dir`, sorted by name.
fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, PolicyLoadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| PolicyLoadError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| PolicyLoadError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.is_file() && path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

impl PolicyEngine {
    /// Loads and validates a whole policy folder (DESIGN §3): the tool
    /// contracts, the schema (the core, the team's, the generated tool
    /// actions), the policies (strictly validated against it) and the
    /// static entities, each step stopping the load at its first errors.
    ///
    /// # Errors
    /// Every problem found: unreadable files, invalid tool contracts, Cedar
    /// schema or policy syntax errors, strict-validation errors, resource
    /// types the schema lacks, invalid static entities.
    pub fn load(dir: &Path) -> Result<Self, LoadErrors> {
        let tools =
            ToolRegistry::load_dir(&dir.join("tools")).map_err(|e| LoadErrors::one(dir, e))?;
        let budgets = budgets::load_dir(&dir.join("budgets"), &tools)
            .map_err(|e| LoadErrors::one(dir, budget_diagnostic(&e)))?;
        let mut hashed: Vec<SourceFile> = budgets
            .iter()
            .map(|b| SourceFile {
                path: b.source_path.clone(),
                text: b.source_text.clone(),
            })
            .collect();
        let budgets = Budgets::new(budgets, &tools);
        let fragments = Fragments::read(dir)?;
        let mut warnings = fragments.warnings.clone();
        let errors = unknown_resource_types(&tools, &fragments);
        hashed.extend(tools.iter().map(|tool| SourceFile {
            path: tool.source_path.clone(),
            text: tool.source_text.clone(),
        }));
        stop_on(dir, errors, &mut warnings)?;

        let (schema, schema_text) = fragments.combined(dir, &tools, &budgets)?;
        hashed.push(SourceFile {
            path: fragments.team_path.clone(),
            text: fragments.team_text,
        });

        let read = read_policies(dir)?;
        stop_on(dir, read.errors, &mut warnings)?;
        let (policies, origin, sources) = (read.policies, read.origin, read.sources);
        let invalid =
            validation_diagnostics(dir, &schema, &policies, &origin, &sources, &mut warnings)?;
        stop_on(
            dir,
            invalid.into_iter().map(PolicyLoadError::from).collect(),
            &mut warnings,
        )?;

        let (static_entities, action_entities) =
            static_entities(dir, &schema, &tools, &fragments.team_path, &mut hashed)?;
        let policies = PolicySlices::build(policies, &action_entities)
            .map_err(|e| LoadErrors::one(dir, SourceDiagnostic::whole_file(dir, e.to_string())))?;
        let static_entities = RequestBases::build(static_entities, &action_entities, &policies)
            .map_err(|e| LoadErrors::one(dir, SourceDiagnostic::whole_file(dir, e.to_string())))?;

        let callable = CallableIndex::build(&tools, &budgets, &policies, &static_entities)
            .map_err(|e| LoadErrors::one(dir, SourceDiagnostic::whole_file(dir, e.to_string())))?;

        let sessions = super::sessions::build(&tools, &policies);
        hashed.extend(sources);
        let version = version_of(dir, &hashed);
        Ok(Self {
            tools,
            budgets,
            sessions,
            schema,
            policies,
            static_entities,
            principal_bases: PrincipalBases::new(),
            callable,
            schema_text,
            version,
            warnings,
        })
    }
}

/// A budget file's problem as `check` shows it: at its line and column
/// when known.
fn budget_diagnostic(e: &BudgetError) -> SourceDiagnostic {
    match e.at {
        Some((line, column)) => {
            SourceDiagnostic::at_line_column(&e.path, line, column, e.message.clone())
        }
        None => SourceDiagnostic::whole_file(&e.path, e.message.clone()),
    }
    .with_code(codes::BUDGET)
}

/// Ends the load when a step found errors, with the warnings found so far.
fn stop_on(
    dir: &Path,
    errors: Vec<PolicyLoadError>,
    warnings: &mut Vec<SourceDiagnostic>,
) -> Result<(), LoadErrors> {
    if errors.is_empty() {
        return Ok(());
    }
    Err(LoadErrors {
        dir: dir.to_path_buf(),
        errors,
        warnings: std::mem::take(warnings),
    })
}

/// The core declarations and the team's schema, each parsed on its own,
/// and the two combined (the domain every contract's resource type must
/// be declared in).
struct Fragments {
    team_path: PathBuf,
    team_text: String,
    core_text: String,
    core: SchemaFragment,
    team: SchemaFragment,
    domain: Schema,
    warnings: Vec<SourceDiagnostic>,
}

impl Fragments {
    fn read(dir: &Path) -> Result<Self, LoadErrors> {
        // The team's schema, combined with the core declarations.
        let team_path = dir.join("schema.cedarschema");
        let team_text = if team_path.exists() {
            read(&team_path).map_err(|e| LoadErrors::one(dir, e))?
        } else {
            String::new()
        };
        let core_text = core_fragment();
        let mut warnings = Vec::new();
        let core = parse_fragment(Path::new("<generated>"), &core_text, &mut Vec::new())
            .map_err(|e| LoadErrors::one(dir, e))?;
        let team = parse_fragment(&team_path, &team_text, &mut warnings)
            .map_err(|e| LoadErrors::one(dir, e))?;
        check_no_redeclaration(&team_path, &team_text).map_err(|e| LoadErrors::one(dir, e))?;
        let domain = Schema::from_schema_fragments([core.clone(), team.clone()]).map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::from_diagnostic(&team_path, &team_text, &e, codes::SCHEMA),
            )
        })?;
        Ok(Self {
            team_path,
            team_text,
            core_text,
            core,
            team,
            domain,
            warnings,
        })
    }

    /// The schema policies are validated against: the core, the team's
    /// and the generated tool actions; and its text as `toolgate schema`
    /// shows it.
    fn combined(
        &self,
        dir: &Path,
        tools: &ToolRegistry,
        budgets: &Budgets,
    ) -> Result<(Schema, String), LoadErrors> {
        let (core_text, team_path, team_text) = (&self.core_text, &self.team_path, &self.team_text);
        let (core, team) = (self.core.clone(), self.team.clone());
        let actions_text = tool_actions_fragment(tools.iter(), budgets);
        let actions = parse_fragment(
            Path::new("<generated actions>"),
            &actions_text,
            &mut Vec::new(),
        )
        .map_err(|e| LoadErrors::one(dir, e))?;
        let schema = Schema::from_schema_fragments([core, team, actions]).map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::whole_file(team_path, format!("combined schema is invalid: {e}"))
                    .with_code(codes::SCHEMA),
            )
        })?;
        let schema_text = format!(
            "{core_text}\n{actions_text}\n// ---- {} ----\n{team_text}",
            team_path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        );
        Ok((schema, schema_text))
    }
}

/// Every contract's resource type must be a declared entity type, and not
/// one toolgate generates.
fn unknown_resource_types(tools: &ToolRegistry, fragments: &Fragments) -> Vec<PolicyLoadError> {
    let (domain, team_path) = (&fragments.domain, &fragments.team_path);
    let declared: HashSet<String> = domain.entity_types().map(ToString::to_string).collect();
    let mut errors = Vec::new();
    for tool in tools.iter() {
        if let Some(r) = &tool.resource
            && (!declared.contains(&r.entity_type)
                || GENERATED_ENTITY_TYPES.contains(&r.entity_type.as_str()))
        {
            errors.push(
                SourceDiagnostic::at_offset(
                    &tool.source_path,
                    &tool.source_text,
                    tool.offset_of("/resource/type"),
                    format!(
                        "tool `{}`: resource type `{}` is not declared in `{}`",
                        tool.name,
                        r.entity_type,
                        team_path.display()
                    ),
                )
                .with_code(codes::UNKNOWN_RESOURCE_TYPE)
                .into(),
            );
        }
    }
    errors
}

/// The policy files, read one at a time so every span maps to its file.
struct ReadPolicies {
    policies: PolicySet,
    /// Each policy id's file, an index into `sources`.
    origin: BTreeMap<String, usize>,
    sources: Vec<SourceFile>,
    errors: Vec<PolicyLoadError>,
}

fn read_policies(dir: &Path) -> Result<ReadPolicies, LoadErrors> {
    let mut errors: Vec<PolicyLoadError> = Vec::new();
    let mut policies = PolicySet::new();
    let mut origin: BTreeMap<String, usize> = BTreeMap::new();
    let mut sources: Vec<SourceFile> = Vec::new();
    let cedar_files = files_with_ext(dir, "cedar").map_err(|e| LoadErrors::one(dir, e))?;
    for path in cedar_files {
        let text = read(&path).map_err(|e| LoadErrors::one(dir, e))?;
        let file_index = sources.len();
        match load_policy_file(&path, &text) {
            Ok(list) => {
                for policy in list {
                    let id = policy.id().to_string();
                    if origin.contains_key(&id) {
                        errors.push(
                            SourceDiagnostic::at_offset(
                                &path,
                                &text,
                                text.find(&format!("\"{id}\"")),
                                format!("duplicate policy id `{id}`"),
                            )
                            .with_code(codes::DUPLICATE_ID)
                            .into(),
                        );
                        continue;
                    }
                    origin.insert(id, file_index);
                    if let Err(e) = policies.add(policy) {
                        errors.push(
                            SourceDiagnostic::whole_file(&path, e.to_string())
                                .with_code(codes::PARSE)
                                .into(),
                        );
                    }
                }
            }
            Err(mut es) => errors.append(&mut es),
        }
        sources.push(SourceFile { path, text });
    }
    Ok(ReadPolicies {
        policies,
        origin,
        sources,
        errors,
    })
}

/// Strict validation against the combined schema: the errors, and the
/// warnings added to `warnings`, each in file order whatever order the
/// validator found them in.
fn validation_diagnostics(
    dir: &Path,
    schema: &Schema,
    policies: &PolicySet,
    origin: &BTreeMap<String, usize>,
    sources: &[SourceFile],
    warnings: &mut Vec<SourceDiagnostic>,
) -> Result<Vec<SourceDiagnostic>, LoadErrors> {
    let results = validate_strict(schema, policies).map_err(|e| {
        LoadErrors::one(
            dir,
            SourceDiagnostic::whole_file(dir, e).with_code(codes::VALIDATION),
        )
    })?;
    let locate = |id: &PolicyId| origin.get(&id.to_string()).and_then(|i| sources.get(*i));
    let mut invalid = Vec::new();
    for result in &results {
        for e in result.validation_errors() {
            if let Some(src) = locate(e.policy_id()) {
                invalid.push(SourceDiagnostic::from_diagnostic(
                    &src.path,
                    &src.text,
                    e,
                    codes::VALIDATION,
                ));
            }
        }
        for w in result.validation_warnings() {
            if let Some(src) = locate(w.policy_id()) {
                warnings.push(
                    SourceDiagnostic::from_diagnostic(
                        &src.path,
                        &src.text,
                        w,
                        codes::VALIDATION_WARNING,
                    )
                    .warning(),
                );
            }
        }
    }
    // In file order, whatever order the validator found them in.
    let by_place = |d: &SourceDiagnostic| (d.path.clone(), d.line, d.column);
    invalid.sort_by_key(by_place);
    warnings.sort_by_key(by_place);
    Ok(invalid)
}

/// The static entities: the deployment's file, one `Tool` per
/// resource-less tool, and the schema's action entities (which make
/// `action in Action::"risk:…"` hold); with the action entities alone.
fn static_entities(
    dir: &Path,
    schema: &Schema,
    tools: &ToolRegistry,
    team_path: &Path,
    hashed: &mut Vec<SourceFile>,
) -> Result<(Entities, Entities), LoadErrors> {
    let entities_path = dir.join("entities.json");
    let mut static_entities = if entities_path.exists() {
        let text = read(&entities_path).map_err(|e| LoadErrors::one(dir, e))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::at_offset(
                    &entities_path,
                    &text,
                    offset_of(&text, e.line(), e.column()),
                    e.to_string(),
                )
                .with_code(codes::ENTITIES),
            )
        })?;
        let entities = Entities::from_json_value(value, Some(schema)).map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::from_diagnostic(&entities_path, &text, &e, codes::ENTITIES),
            )
        })?;
        hashed.push(SourceFile {
            path: entities_path.clone(),
            text,
        });
        entities
    } else {
        Entities::empty()
    };
    let tool_entities = tools
        .iter()
        .filter(|t| t.resource.is_none())
        .map(|t| tool_entity(&t.name, t.risk.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LoadErrors::one(dir, SourceDiagnostic::whole_file(&dir.join("tools"), e)))?;
    static_entities = static_entities
        .add_entities(tool_entities, Some(schema))
        .map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::whole_file(&entities_path, e.to_string()),
            )
        })?;
    // Action entities make `action in Action::"risk:…"` hold.
    let action_entities = schema.action_entities().map_err(|e| {
        LoadErrors::one(dir, SourceDiagnostic::whole_file(team_path, e.to_string()))
    })?;
    static_entities = static_entities
        .add_entities(action_entities.iter().cloned(), None)
        .map_err(|e| {
            LoadErrors::one(
                dir,
                SourceDiagnostic::whole_file(&entities_path, e.to_string()),
            )
        })?;
    Ok((static_entities, action_entities))
}

/// Validates every policy in strict mode, the set split over the available
/// cores: Cedar's validator is single-threaded and its cost grows with
/// policies × actions, while each static policy validates on its own.
fn validate_strict(
    schema: &Schema,
    policies: &PolicySet,
) -> Result<Vec<cedar_policy::ValidationResult>, String> {
    let workers = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let all: Vec<&cedar_policy::Policy> = policies.policies().collect();
    let chunk = all.len().div_ceil(workers.clamp(1, 16)).max(1);
    let sets = all
        .chunks(chunk)
        .map(|c| {
            PolicySet::from_policies(c.iter().map(|p| (*p).clone())).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::scope(|scope| {
        let running: Vec<_> = sets
            .iter()
            .map(|set| {
                scope.spawn(move || {
                    Validator::new(schema.clone()).validate(set, ValidationMode::Strict)
                })
            })
            .collect();
        running
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| "the policy validator failed unexpectedly".to_owned())
            })
            .collect()
    })
}

/// Parses a schema fragment; its warnings (e.g. a type shadowing a Cedar
/// builtin) go to `warnings`.
fn parse_fragment(
    path: &Path,
    text: &str,
    warnings: &mut Vec<SourceDiagnostic>,
) -> Result<SchemaFragment, PolicyLoadError> {
    let (fragment, found) = SchemaFragment::from_cedarschema_str(text)
        .map_err(|e| SourceDiagnostic::from_diagnostic(path, text, &e, codes::SCHEMA))?;
    for w in found {
        warnings.push(
            SourceDiagnostic::from_diagnostic(path, text, &w, codes::SCHEMA_WARNING).warning(),
        );
    }
    Ok(fragment)
}

/// A team schema may not declare the names toolgate generates.
fn check_no_redeclaration(path: &Path, text: &str) -> Result<(), PolicyLoadError> {
    for name in GENERATED_ENTITY_TYPES {
        for (offset, _) in text.match_indices("entity") {
            let rest = text.get(offset + "entity".len()..).unwrap_or("");
            let declared = rest
                .split(|c: char| c.is_whitespace() || c == ',' || c == ';' || c == '{')
                .find(|w| !w.is_empty());
            if declared == Some(name) {
                return Err(SourceDiagnostic::at_offset(
                    path,
                    text,
                    Some(offset),
                    format!("entity type `{name}` is generated by toolgate and must not be declared here"),
                )
                .with_code(codes::REDECLARED_TYPE)
                .into());
            }
        }
    }
    Ok(())
}

/// Parses one `.cedar` file and gives each policy its stable id: its `@id`
/// annotation, else `<file name>#<index in file>`.
fn load_policy_file(
    path: &Path,
    text: &str,
) -> Result<Vec<cedar_policy::Policy>, Vec<PolicyLoadError>> {
    let set = PolicySet::from_str(text).map_err(|e| {
        vec![SourceDiagnostic::from_diagnostic(path, text, &e, codes::PARSE).into()]
    })?;
    if set.templates().next().is_some() {
        return Err(vec![
            SourceDiagnostic::at_offset(
                path,
                text,
                text.find("?principal").or_else(|| text.find("?resource")),
                "templates are not supported; write static policies".into(),
            )
            .with_code(codes::TEMPLATE)
            .into(),
        ]);
    }
    let file_name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut list: Vec<(usize, cedar_policy::Policy)> = set
        .policies()
        .map(|p| {
            // Cedar numbers the policies of one parse in source order: `policy<N>`.
            let n = p
                .id()
                .to_string()
                .trim_start_matches("policy")
                .parse::<usize>()
                .unwrap_or(usize::MAX);
            (n, p.clone())
        })
        .collect();
    list.sort_by_key(|(n, _)| *n);
    Ok(list
        .into_iter()
        .map(|(n, p)| {
            let id = p
                .annotation("id")
                .map_or_else(|| format!("{file_name}#{n}"), ToOwned::to_owned);
            p.new_id(PolicyId::new(id))
        })
        .collect())
}

/// Byte offset of a 1-based line and column (serde_json's error position).
fn offset_of(text: &str, line: usize, column: usize) -> Option<usize> {
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            return Some(offset + column.saturating_sub(1).min(l.len()));
        }
        offset += l.len();
    }
    None
}

fn tool_entity(name: &str, risk: &str) -> Result<Entity, String> {
    let ty = EntityTypeName::from_str("Tool").map_err(|e| e.to_string())?;
    let uid = EntityUid::from_type_name_and_id(ty, EntityId::new(name));
    let attrs = std::collections::HashMap::from([(
        "risk".to_owned(),
        RestrictedExpression::new_string(risk.to_owned()),
    )]);
    Entity::new(uid, attrs, HashSet::new()).map_err(|e| e.to_string())
}

/// `policy_version`: SHA-256 over every loaded file's path (relative to the
/// folder) and content, in a fixed order.
fn version_of(dir: &Path, files: &[SourceFile]) -> String {
    let mut sorted: Vec<(String, &str)> = files
        .iter()
        .map(|f| {
            (
                f.path
                    .strip_prefix(dir)
                    .unwrap_or(&f.path)
                    .to_string_lossy()
                    .into_owned(),
                f.text.as_str(),
            )
        })
        .collect();
    sorted.sort();
    let mut h = Sha256::new();
    for (path, text) in sorted {
        h.update((path.len() as u64).to_be_bytes());
        h.update(path.as_bytes());
        h.update((text.len() as u64).to_be_bytes());
        h.update(text.as_bytes());
    }
    hex::encode(h.finalize())
}
