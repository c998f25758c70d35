//! The `toolgate` command line: parses arguments and calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use toolgate::access::TenantScope;
use toolgate::clock::SystemClock;
use toolgate::config::{Config, Overrides};
use toolgate::decision::{AuthorizeInput, Door};
use toolgate::identity::Caller;
use toolgate::policy::PolicyEngine;
use toolgate::server;

#[derive(Parser)]
#[command(
    name = "toolgate",
    version,
    about = "Authorization sidecar for AI-agent tool executors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the sidecar.
    Serve(ServeArgs),
    /// Load and validate the configuration (file, TOOLGATE_* environment,
    /// flags) without serving; exit non-zero on the first problem.
    CheckConfig(ServeArgs),
    /// Load and validate the policy folder; exit non-zero with file:line diagnostics.
    Check {
        #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// `human` (file:line:column: message, with the source) or `json`
        /// (one object with every diagnostic, for CI pipelines).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Fail (exit 1) on Cedar validator warnings too.
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Run the policy test cases (`DIR/tests/*.json`) through the decision
    /// pipeline; list each failing case with a diff, end with `N passed, M
    /// failed`, and exit 1 on any failure or invalid case file.
    Test {
        /// The policy folder (overrides `--policies`).
        dir: Option<PathBuf>,
        #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
        policies: PathBuf,
        /// Also fail unless every policy determined at least one passing case.
        #[arg(long)]
        require_coverage: bool,
    },
    /// Print the combined Cedar schema.
    Schema {
        #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
        policies: PathBuf,
    },
    /// One decision from the command line, without a server. Prints the
    /// answer as JSON; exit 0 for allow, 2 for deny, 3 for approval required.
    Authorize(AuthorizeArgs),
    /// DEVELOPMENT ONLY: a local key set and identity tokens, to try the
    /// approval flow without an identity provider. Production verifies the
    /// provider's tokens against its published key set.
    #[command(subcommand)]
    Dev(DevCommand),
    /// Tool contracts and MCP: import them from an MCP server, print one as
    /// an MCP server publishes it.
    #[command(subcommand)]
    Tools(ToolsCommand),
}

#[derive(Subcommand)]
enum ToolsCommand {
    /// Write contract skeletons (`POLICIES/tools/<name>.json`) from an MCP
    /// server's `tools/list`: from a file (`--file`), a Streamable HTTP
    /// endpoint (`--url`) or a server started over stdio (the command line
    /// after `--`). A contract that exists and differs is shown as a diff and
    /// written only with `--force`. Exit 0 when every contract is written or
    /// unchanged, 3 when a changed one was not written, 1 on an error (2 is
    /// a usage error).
    Import(ImportArgs),
    /// Print a tool's MCP `inputSchema` with its COAZ-MCP declared mapping
    /// (`x-authzen-mapping`), as the configuration's `[authzen]` pointers
    /// and identity claim names make it: what an MCP server publishes in
    /// `tools/list` so that a gateway enforcing through toolgate's AuthZEN
    /// door sends exactly what toolgate reads.
    McpSchema {
        /// The tool's name.
        tool: String,
        /// The configuration file (default `./toolgate.toml` if present).
        #[arg(long, env = "TOOLGATE_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        policies: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["file", "url", "command"])))]
struct ImportArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// A `tools/list` result (`{"tools": [...]}`) or a whole JSON-RPC response.
    #[arg(long)]
    file: Option<PathBuf>,
    /// The MCP server's Streamable HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`.
    #[arg(long)]
    url: Option<String>,
    /// The environment variable holding a bearer token for `--url` (never
    /// the token itself on the command line).
    #[arg(long, requires = "url", conflicts_with_all = ["file", "command"])]
    bearer_token_env: Option<String>,
    /// Bounds each step of a live session (start, each page, shutdown).
    #[arg(long, default_value_t = 30)]
    timeout_seconds: u64,
    /// Replace existing contracts that differ.
    #[arg(long)]
    force: bool,
    /// Write nothing; print what would be written and the diffs.
    #[arg(long)]
    dry_run: bool,
    /// The MCP server's command line, run over stdio.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Human,
    Json,
}

#[derive(Subcommand)]
enum DevCommand {
    /// Write a new development key set (one random HS256 secret) to a file
    /// readable only by its owner. Refuses to overwrite an existing file.
    Keys {
        #[arg(long, default_value = "toolgate-data/dev-jwks.json")]
        out: PathBuf,
    },
    /// Print an identity token signed with the development key set.
    Token(DevTokenArgs),
}

#[derive(clap::Args)]
struct DevTokenArgs {
    #[arg(long, default_value = "toolgate-data/dev-jwks.json")]
    jwks: PathBuf,
    #[arg(long)]
    subject: String,
    #[arg(long)]
    tenant: String,
    #[arg(long = "role")]
    roles: Vec<String>,
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long, env = "TOOLGATE_ISSUER")]
    issuer: Option<String>,
    #[arg(long, env = "TOOLGATE_AUDIENCE")]
    audience: Option<String>,
    /// How long the token is valid.
    #[arg(long, default_value_t = 3600)]
    ttl_seconds: i64,
}

/// Flags of `serve`. Their environment variables (`TOOLGATE_LISTEN`, …) are
/// read by the configuration loader with every other key, so that an
/// unknown `TOOLGATE_*` variable is refused like an unknown key.
#[derive(clap::Args)]
struct ServeArgs {
    /// The configuration file (default `./toolgate.toml` if present).
    #[arg(long, env = "TOOLGATE_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long)]
    policies: Option<PathBuf>,
    /// `host:port` or `unix:/path`.
    #[arg(long)]
    listen: Option<String>,
    /// `sqlite:///path/file.db` (default `sqlite://toolgate-data/toolgate.db`)
    /// or `postgres://user@host/db` (several replicas on one database).
    #[arg(long)]
    store: Option<String>,
    #[arg(long)]
    jwks_file: Option<PathBuf>,
    #[arg(long)]
    issuer: Option<String>,
    #[arg(long)]
    audience: Option<String>,
    /// Serve Prometheus metrics on this `host:port` (a separate listener).
    #[arg(long)]
    metrics_listen: Option<String>,
}

impl ServeArgs {
    fn load(self) -> anyhow::Result<Config> {
        let overrides = Overrides {
            policies: self.policies,
            listen: self.listen,
            store: self.store,
            jwks_file: self.jwks_file,
            issuer: self.issuer,
            audience: self.audience,
            metrics_listen: self.metrics_listen,
        };
        Ok(Config::load(self.config.as_deref(), overrides)?)
    }
}

#[derive(clap::Args)]
struct AuthorizeArgs {
    #[arg(long, env = "TOOLGATE_POLICIES", default_value = "policies")]
    policies: PathBuf,
    /// Where approvals are recorded (default: in memory, discarded).
    #[arg(long, default_value = ":memory:")]
    store: String,
    #[arg(long)]
    tool: String,
    /// The arguments exactly as the model produced them.
    #[arg(long)]
    args: String,
    #[arg(long)]
    subject: String,
    #[arg(long)]
    tenant: String,
    #[arg(long = "scope")]
    scopes: Vec<String>,
    #[arg(long = "role")]
    roles: Vec<String>,
    #[arg(long, default_value = "")]
    agent: String,
    #[arg(long, default_value = "")]
    session: String,
    #[arg(long, default_value = "")]
    request_id: String,
    #[arg(long, default_value = "")]
    approval_id: String,
    /// A file holding the trusted entities (a Cedar entity JSON array).
    #[arg(long)]
    entities: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("toolgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check {
            policies,
            format,
            deny_warnings,
        } => Ok(check(&policies, format, deny_warnings)),
        Command::Tools(ToolsCommand::McpSchema {
            tool,
            config,
            policies,
        }) => mcp_schema(&tool, config.as_deref(), policies),
        Command::Schema { policies } => {
            let engine = load_or_report(&policies)?;
            print!("{}", engine.schema_text());
            Ok(ExitCode::SUCCESS)
        }
        Command::Test {
            dir,
            policies,
            require_coverage,
        } => policy_test(&dir.unwrap_or(policies), require_coverage),
        Command::Serve(args) => serve(args),
        Command::CheckConfig(args) => {
            let config = args.load()?;
            println!(
                "ok: listen {:?}, {} access grant(s), dns-rebinding guard {}, audit {:?}, metrics {}",
                config.listen,
                match &config.access {
                    toolgate::access::AccessPolicy::Open => 0,
                    toolgate::access::AccessPolicy::Grants(g) => g.len(),
                },
                if config.rebinding_guard() {
                    "on"
                } else {
                    "off"
                },
                config.audit.sink,
                config
                    .metrics_listen
                    .map_or_else(|| "off".to_owned(), |a| a.to_string())
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Authorize(args) => authorize(args),
        Command::Dev(DevCommand::Keys { out }) => dev_keys(&out),
        Command::Dev(DevCommand::Token(args)) => dev_token(&args),
        Command::Tools(ToolsCommand::Import(args)) => tools_import(args),
    }
}

fn tools_import(args: ImportArgs) -> anyhow::Result<ExitCode> {
    use toolgate::mcp::{self, Options, Source};
    let source = match (args.file, args.url) {
        (Some(file), _) => Source::File(file),
        (None, Some(url)) => Source::Http {
            bearer_token: args
                .bearer_token_env
                .map(|name| {
                    std::env::var(&name)
                        .with_context(|| format!("--bearer-token-env: `{name}` is not set"))
                })
                .transpose()?,
            url,
        },
        (None, None) => Source::Stdio(args.command),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let timeout = std::time::Duration::from_secs(args.timeout_seconds.max(1));
    let options = Options {
        force: args.force,
        dry_run: args.dry_run,
    };
    let imported = runtime
        .block_on(mcp::list_tools(&source, timeout))
        .and_then(|listing| mcp::import_into(&args.policies, &listing, options));
    match imported {
        Ok(report) => {
            print!("{}", report.render());
            Ok(if report.withheld() {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            })
        }
        Err(error) => {
            eprintln!("toolgate: error[{}]: {error}", error.code());
            Ok(ExitCode::FAILURE)
        }
    }
}

fn dev_keys(out: &std::path::Path) -> anyhow::Result<ExitCode> {
    let (jwks, _signer) = toolgate::identity::generate_dev_keyset()?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(out).with_context(|| {
        format!(
            "creating {} (an existing key set is never overwritten)",
            out.display()
        )
    })?;
    std::io::Write::write_all(&mut file, jwks.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote a DEVELOPMENT key set to {}; it holds a signing secret: never use it in production\n\
         serve with:  toolgate serve --jwks-file {}",
        out.display(),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn dev_token(args: &DevTokenArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.jwks).with_context(|| {
        format!(
            "reading {} (create it with `toolgate dev keys`)",
            args.jwks.display()
        )
    })?;
    let signer = toolgate::identity::DevSigner::from_jwks_json(&text)?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let token = signer.mint(
        &args.subject,
        &args.tenant,
        &args.roles,
        &args.scopes,
        args.issuer.as_deref(),
        args.audience.as_deref(),
        now,
        args.ttl_seconds,
    )?;
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

fn check(policies: &std::path::Path, format: Format, deny_warnings: bool) -> ExitCode {
    let loaded = PolicyEngine::load(policies);
    let failed = match &loaded {
        Ok(engine) => deny_warnings && !engine.warnings().is_empty(),
        Err(_) => true,
    };
    match (format, &loaded) {
        (Format::Json, _) => {
            let (engine, diagnostics) = match &loaded {
                Ok(engine) => (Some(engine), engine.warnings().to_vec()),
                Err(errors) => {
                    let mut all = errors.diagnostics();
                    all.extend(errors.warnings.iter().cloned());
                    (None, all)
                }
            };
            let count = |severity: &str| {
                diagnostics
                    .iter()
                    .filter(|d| d.severity.as_str() == severity)
                    .count()
            };
            let json = serde_json::json!({
                "ok": !failed,
                "policy_version": engine.map(PolicyEngine::version),
                "tools": engine.map(|e| e.tools().len()),
                "policies": engine.map(PolicyEngine::policy_count),
                "errors": count("error"),
                "warnings": count("warning"),
                "diagnostics": diagnostics.iter().map(|d| serde_json::json!({
                    "file": d.path.display().to_string(),
                    "line": d.line,
                    "column": d.column,
                    "severity": d.severity.as_str(),
                    "code": d.code,
                    "message": d.message,
                    "help": d.help,
                })).collect::<Vec<_>>(),
            });
            println!("{json:#}");
        }
        (Format::Human, Ok(engine)) => {
            for w in engine.warnings() {
                println!("warning: {w}");
            }
            println!(
                "{}: {} tools, {} policies, {} warning(s), policy_version {}",
                if failed { "failed" } else { "ok" },
                engine.tools().len(),
                engine.policy_count(),
                engine.warnings().len(),
                engine.version()
            );
        }
        (Format::Human, Err(errors)) => report(errors),
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints every load problem as `file:line:col: message` (the form editors
/// and CI logs recognise), then each with its source snippet.
fn report(errors: &toolgate::policy::LoadErrors) {
    for e in &errors.errors {
        eprintln!("error: {e}");
    }
    for w in &errors.warnings {
        eprintln!("warning: {w}");
    }
    let handler = miette::GraphicalReportHandler::new();
    for e in &errors.errors {
        let mut out = String::new();
        if handler.render_report(&mut out, e).is_ok() {
            eprintln!("{out}");
        }
    }
}

fn load_or_report(policies: &std::path::Path) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::load(policies).map_err(|errors| {
        report(&errors);
        anyhow::anyhow!("the policy set in `{}` is invalid", policies.display())
    })
}

fn policy_test(dir: &std::path::Path, require_coverage: bool) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match runtime.block_on(toolgate::policy_cases::run(dir)) {
        Ok(outcome) => {
            print!("{}", outcome.render());
            Ok(if outcome.success(require_coverage) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Err(errors) => {
            report(&errors);
            Ok(ExitCode::FAILURE)
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    toolgate::telemetry::init();
    let config = args.load()?;
    // The blocking pool runs the SQLite store's calls (one connection behind
    // a mutex) and policy reloads: threads beyond a few would only wait on
    // that mutex, each holding a stack and allocator pages (tokio's default
    // allows 512).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(8)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let services = built(server::build(&config, Arc::new(SystemClock)).await)?;
        let listeners = server::Listeners::bind(&config).await?;
        server::serve(services, listeners, &config, shutdown_signal()).await?;
        tracing::info!("toolgate stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The built sidecar, or its error with every policy diagnostic printed
/// (file:line and the source) when the policy set is what failed.
fn built(
    result: Result<server::Services, server::ServerError>,
) -> anyhow::Result<server::Services> {
    result.map_err(|e| {
        if let server::ServerError::Policies { errors, .. } = &e {
            report(errors);
        }
        anyhow::Error::new(e)
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn authorize(args: AuthorizeArgs) -> anyhow::Result<ExitCode> {
    let mut config = Config::with_defaults(Overrides {
        policies: Some(args.policies),
        store: Some(args.store),
        ..Overrides::default()
    })?;
    // The answer is printed; no audit log is kept for a one-off decision.
    config.audit.sink = toolgate::audit::AuditSink::Discard;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let services = built(runtime.block_on(server::build(&config, Arc::new(SystemClock))))?;
    let entities_json = match &args.entities {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => String::new(),
    };
    let input = AuthorizeInput {
        tool: args.tool,
        arguments: args.args.into_bytes(),
        caller: Some(Caller {
            subject_id: args.subject,
            tenant_id: args.tenant,
            scopes: args.scopes,
            roles: args.roles,
            agent_id: args.agent,
            session_id: args.session,
        }),
        call_id: String::new(),
        request_id: args.request_id,
        approval_id: args.approval_id,
        deadline: None,
        entities_json,
        tool_version: String::new(),
        identity_token: String::new(),
        peer: String::new(),
        // The operator's own question, on the command line: any tenant.
        tenants: TenantScope::Any,
        door: Door::Executor,
        action: String::new(),
    };
    let outcome = runtime.block_on(services.authorizer.authorize(&input))?;
    let json = serde_json::json!({
        "decision": outcome.decision.as_str(),
        "code": outcome.error.as_ref().map(|e| e.code.as_str()),
        "message": outcome.error.as_ref().map(|e| e.message.clone()),
        "details": outcome.error.as_ref().map(|e| serde_json::Value::Object(e.details.clone())),
        "policies": outcome.policies,
        "normalized_arguments": outcome.normalized_arguments,
        "arguments_sha256": outcome.arguments_sha256,
        "idempotency_key": outcome.idempotency_key,
        "conflict_key": outcome.conflict_key,
        "timeout_ms": outcome.timeout_ms,
        "approval_id": outcome.approval.as_ref().map(|a| a.0.clone()),
        "policy_version": outcome.policy_version,
    });
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(match outcome.decision {
        toolgate::decision::Decision::Allow => ExitCode::SUCCESS,
        toolgate::decision::Decision::Deny => ExitCode::from(2),
        toolgate::decision::Decision::ApprovalRequired => ExitCode::from(3),
    })
}

/// `toolgate tools mcp-schema`: exit 1 naming an unknown tool.
fn mcp_schema(
    tool: &str,
    config: Option<&std::path::Path>,
    policies: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let config = Config::load(
        config,
        Overrides {
            policies,
            ..Overrides::default()
        },
    )?;
    let engine = load_or_report(&config.policies)?;
    let Some(contract) = engine.tools().get(tool) else {
        eprintln!("error: no tool `{tool}` in {}", config.policies.display());
        return Ok(ExitCode::FAILURE);
    };
    let mapping = toolgate::authzen::declared_mapping(&config.authzen, &config.verifier.claims);
    let schema = toolgate::authzen::mcp_input_schema(&contract.input_schema_json, &mapping);
    println!("{}", serde_json::to_string_pretty(&schema)?);
    Ok(ExitCode::SUCCESS)
}
