//! The one integration-test binary: real gRPC on loopback against a real
//! SQLite file or PostgreSQL schema, plus the command line, real sidecar
//! processes (one, or several replicas on one database) and the Python
//! executor.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed unwrap is a failed test, with its message"
)]

mod approval_views;
mod approvals;
mod approver_audience;
mod architecture;
mod audit;
mod authorize;
mod authzen;
mod budgets;
mod callable_tools;
mod cli;
mod console;
mod decoding_path;
mod entities;
mod envoy_gateway;
mod ext_authz;
mod gateway_approvals;
mod gateway_attacks;
mod gateway_hardening;
mod key_rotation;
mod ledger;
mod ledger_crash;
mod ledger_tickets;
mod limits;
mod listener_limits;
mod listeners;
mod log_secrets;
mod mcp_gateway;
mod node;
mod postgres_tls;
mod prerequisites;
mod python;
mod rebinding;
mod reload;
mod replicas;
mod restart;
mod shutdown;
mod sidecar;
mod strict_entities;
mod support;
mod tenants;
mod tools_import;
