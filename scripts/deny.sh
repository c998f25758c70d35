#!/usr/bin/env bash
# What may be in toolgate's dependency tree (deny.toml), checked by
# cargo-deny:
#
#   ./scripts/deny.sh [--advisories]
#
# Always: licences (permissive ones only), bans (no wildcard version, no
# second TLS stack; duplicate versions listed) and sources (crates.io only).
# With --advisories, also the RustSec advisory database, which cargo-deny
# fetches from GitHub: it needs the network, so it is asked for, never
# skipped silently (CI runs here without one; see docs/testing.md).
#
# cargo-deny is TOOLGATE_CARGO_DENY, else `cargo-deny` on PATH, else the
# pinned version below installed once under target/tools (a few minutes
# the first time, from crates.io).
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
checks=(licenses bans sources)
for arg in "$@"; do
  case "$arg" in
    --advisories) checks+=(advisories) ;;
    *) echo "deny.sh: unknown argument $arg (only --advisories)" >&2; exit 2 ;;
  esac
done

deny="${TOOLGATE_CARGO_DENY:-}"
if [ -z "$deny" ]; then
  if command -v cargo-deny >/dev/null 2>&1; then
    deny=cargo-deny
  else
    root="${CARGO_TARGET_DIR:-target}/tools"
    deny="$root/bin/cargo-deny"
    if ! "$deny" --version 2>/dev/null | grep -q " $version\$"; then
      echo "deny.sh: installing cargo-deny $version under $root" >&2
      cargo install cargo-deny --version "$version" --locked --root "$root" --quiet
    fi
  fi
fi
"$deny" --version >&2
"$deny" --locked check "${checks[@]}"
