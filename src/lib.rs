//! toolgate: an authorization sidecar for AI-agent tool executors.
//!
//! A model proposes a tool call (a name and some JSON); before anything real
//! happens the executor asks toolgate, over gRPC, whether the call may run
//! and how. The map of the crate, in pipeline order:
//!
//! - [`decode`]: strict JSON decoding, limits, RFC 8785 canonical form, hashes.
//! - [`tools`]: tool contracts, JSON Schema validation, input types for Cedar.
//! - [`policy`]: the Cedar schema, policies, entities, slicing, evaluation
//!   and reload (the only importer of `cedar_policy`).
//! - [`identity`]: the caller, the one rule of who a request runs as
//!   ([`identity::Principals`]), identity tokens and development keys.
//! - [`decision`]: [`decision::ToolCallAuthorizer`], the one home of the
//!   order of the checks; the outcome; the wave schedule of a batch.
//! - [`approvals`]: what an approval is bound to, how it is shown, the
//!   events hub; [`approvals::desk`] serves approval UIs.
//! - [`ledger`]: the execution state machine (DESIGN §5), rules only;
//!   [`ledger::desk`] checks executors' requests and runs it on the store.
//! - [`entities`]: the entity store's rules (DESIGN §11.6): stored Cedar
//!   entities per tenant, their bounds and refusals; [`entities::desk`]
//!   serves `EntityService`.
//! - [`envelope`]: the error table: every code, the envelope of every
//!   non-allow answer, and the executor's own mistakes.
//! - [`store`]: persistence (SQLite, PostgreSQL) behind one trait.
//! - [`audit`], [`metrics`]: the audit log and Prometheus metrics.
//! - [`access`]: which transport identity may call which service.
//! - [`ratelimit`]: token buckets per tenant and per tool.
//! - [`budgets`]: the budget files of DESIGN §13.1 and their load-time
//!   rules (not yet charged by the pipeline: issue 30, under way).
//! - [`server`]: the one wiring: a [`config::Config`] becomes the running
//!   services and their background jobs.
//! - [`grpc`]: the gRPC services, wire types ⇄ domain types.
//! - [`listener`]: the listener stack every door is served on (sockets,
//!   TLS, limits, admission, gRPC-Web, graceful shutdown); with [`grpc`]
//!   the only importer of tonic and prost.
//! - [`authzen`]: the OpenID AuthZEN door for MCP gateways (DESIGN §11.1),
//!   served over HTTP on the same listener.
//! - [`console`]: the approval console (DESIGN §12), a web page for
//!   approvers and its JSON API, served on the same listener in front of
//!   [`approvals::desk`].
//! - [`cli`]: the command line, one file per subcommand; `toolgate test`
//!   ([`cli::policy_cases`]) and `toolgate tools import` ([`cli::mcp`]).
//! - [`config`], [`telemetry`], [`clock`]: the edges.
//!
//! See `ARCHITECTURE.md` for the invariants each module keeps.

pub mod access;
pub mod approvals;
pub mod audit;
pub mod authzen;
pub mod budgets;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod decision;
pub mod decode;
pub mod entities;
pub mod envelope;
pub mod ext_authz;
pub mod grpc;
pub mod identity;
pub mod ledger;
pub mod listener;
pub mod metrics;
pub mod policy;
pub mod ratelimit;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tools;

#[cfg(any(test, feature = "test-support"))]
pub mod prerequisites;

// The allocator of every binary that links toolgate: the sidecar, its tests
// and benches (so in-process figures are the sidecar's). Under load glibc's
// malloc spent its time in consolidation and chunk unlinking of a large,
// fragmented heap (10,000 policies); see docs/performance.md. Transparent
// huge pages stay off (`no_thp`): with them mimalloc's arenas held ~10 MB
// more resident memory for nothing.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
