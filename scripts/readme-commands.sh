#!/usr/bin/env bash
# Runs every command shown in README.md, then in docs/*.md (docs/gateways.md
# first: it continues the README against the same sidecar; then the others
# in name order), as written, and exits non-zero if any fails; before that,
# checks that every link in README.md and docs/*.md stays inside the
# repository and resolves.
#
# The commands are read from the ```sh blocks, never kept here by hand, so a
# doc edit that breaks a command fails CI. A command is one complete shell
# statement (continuation lines, pipelines and here-documents included).
# Each runs in its own bash with pipefail, under a time limit; like a
# reader's, they share only the files they leave behind, and a block is one
# terminal: a block's first command starts at the root of the clone, each
# later one where the one before it ended (so `cd clients/node && npm ci`
# then `node examples/refund.js` runs as a reader runs it).
#
# A command that cannot run here as written (it names the reader's own
# database host, waits ten minutes on a fuzzer, measures timings that mean
# nothing on a shared CI machine) is listed in `not_run` below, by its file
# and first line, with the reason and the test that covers it instead. A
# command that is neither run nor listed fails the check, and so does a
# listed one that no document shows any more.
#
#   ./scripts/readme-commands.sh --list   prints every command and whether it
#                                         runs, and builds or runs nothing.
#
# Two commands are treated specially, both matched exactly:
# - `./scripts/test.sh` is skipped: .ci/run runs it just before this script.
# - `cargo run --release -- serve` is the README's first terminal: it is
#   started in the background on 127.0.0.1:50051 (refused if something
#   already listens there), waited for until the port answers, left running
#   for the commands after it, and stopped when this script exits.
#
# Where the README shows a command's output (a ```json or ```text block right
# after the command's block), the command must print those lines, in order;
# "…" in a shown line stands for what differs from run to run.
#
# What the commands need and the README tells the reader to install (buf,
# jq) is installed the README's way when it is missing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

readme=README.md
# The documents whose commands follow the README's, in this order.
guides=(docs/gateways.md)
for doc in docs/*.md; do
  [ "$doc" = docs/gateways.md ] || guides+=("$doc")
done
list_only=false
[ "${1:-}" = --list ] && list_only=true

# The commands that do not run here: "file: first line" → why, and what
# runs the same thing in CI instead.
declare -A not_run=(
  ["docs/approvals.md: cargo run --release -- dev keys          # writes toolgate-data/dev-jwks.json"]="a second terminal's walk-through with the approval id pasted by hand (<ID>); clients/python/test_refund_example.py (run by tests/it/python.rs) runs the same refund_example.py / approver_example.py flow against a real sidecar"
  ["docs/approvals.md: cargo run --release -- serve --jwks-file toolgate-data/dev-jwks.json \\"]="a second sidecar on the README's port, which is taken; tests/it/python.rs starts its own with a JWKS"
  ["docs/approvals.md: python clients/python/refund_example.py 25000        # \"waiting for a human: approval <ID>\""]="waits for the approval of the walk-through above; tests/it/python.rs"
  ["docs/approvals.md: TOOLGATE_IDENTITY_TOKEN=\$(cargo run -q --release -- dev token --subject dana \\"]="<ID> is the reader's approval id; tests/it/python.rs"
  ["docs/approvals.md: python clients/python/refund_example.py 25000 <ID>   # \"allowed: …\""]="<ID> is the reader's approval id; tests/it/python.rs"
  ["docs/contracts-from-mcp.md: toolgate tools import --policies policies --file tools-list.json"]="the reader's own tools/list file and an installed toolgate; tests/it/tools_import.rs imports from files, stdio and Streamable HTTP servers"
  ["docs/contracts-from-mcp.md: toolgate tools import --url http://127.0.0.1:8000/mcp --bearer-token-env MCP_TOKEN"]="the reader's MCP server; tests/it/tools_import.rs runs the official MCP SDK's server over Streamable HTTP"
  ["docs/contracts-from-mcp.md: toolgate tools import -- python my_server.py"]="the reader's MCP server; tests/it/tools_import.rs runs one over stdio"
  ["docs/contracts-from-mcp.md: toolgate tools import --file tools-list.json --dry-run"]="the reader's own tools/list file; tests/it/tools_import.rs covers --dry-run"
  ["docs/deployment.md: toolgate serve --store 'postgres://toolgate@db.internal:5432/toolgate'"]="names the reader's database host; tests/it/replicas.rs and postgres_tls.rs serve on the test PostgreSQL"
  ["docs/performance.md: cargo bench --bench perf                          # ~3.5 min once built"]="a benchmark: its timings mean nothing on a shared 2-core CI machine; .ci/run compiles every bench (clippy --all-targets)"
  ["docs/performance.md: cargo bench --bench perf -- --rounds 9 --seconds 3 --out perf.json"]="a benchmark (see above)"
  ["docs/performance.md: TOOLGATE_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test cargo bench --bench perf"]="a benchmark (see above)"
  ["docs/performance.md: valgrind --tool=callgrind target/release/deps/perf-* --in-process-only --rounds 1 --iterations 500"]="a profile of a bench binary built by the commands above"
  ["docs/performance.md: callgrind_annotate --inclusive=yes callgrind.out.*"]="reads the profile above"
  ["docs/performance.md: cargo bench --bench ledger_store             # or: -- --seconds 10 --postgres URL"]="a benchmark (see above)"
  ["docs/performance.md: cargo bench --bench decision"]="a benchmark (see above)"
  ["docs/performance.md: cargo bench --bench policy_scale            # or: -- 10000 for one size alone"]="a benchmark (see above)"
  ["docs/testing.md: RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none differential_envelope -- -max_total_time=600 -print_final_stats=1 -dict=dicts/envelope.dict"]="a ten-minute fuzz run (figures in docs/testing.md); CI's budget is for the suite"
  ["docs/testing.md: cargo install cargo-fuzz"]="installs the fuzzer for the runs above only"
  ["docs/testing.md: RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none decode_arguments -- -max_total_time=600 -print_final_stats=1"]="a ten-minute fuzz run (see above)"
)
addr_host=127.0.0.1
addr_port=50051
skipped_command='./scripts/test.sh'
serve_command='cargo run --release -- serve'
# The first release build takes 9 to 12 minutes on 2 cores (fat LTO); a
# busy machine takes longer. Other commands get five minutes.
build_limit_s=2700
command_limit_s=300

work=$(mktemp -d)
serve_pid=""

stop_serve() {
  [ -n "$serve_pid" ] || return 0
  # The whole process group: cargo and the sidecar it started.
  if kill -0 -- "-$serve_pid" 2>/dev/null; then
    kill -TERM -- "-$serve_pid" 2>/dev/null
    for _ in $(seq 1 30); do
      kill -0 -- "-$serve_pid" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$serve_pid" 2>/dev/null
  fi
  wait "$serve_pid" 2>/dev/null
  serve_pid=""
}
trap 'stop_serve; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

port_answers() {
  timeout 2 bash -c "exec 3<>/dev/tcp/$addr_host/$addr_port" 2>/dev/null
}

# ---- links ---------------------------------------------------------------
# Every inline link, reference definition and bare URL outside code, in
# README.md and docs/*.md: an address with a scheme points outside the
# repository and is refused; a path must stay inside the repository and name
# a tracked file or a folder holding one; a #fragment into a Markdown file
# must name one of its headings (GitHub's anchors).
echo "readme-commands: checking links in $readme and docs/*.md"
if ! python3 - "$readme" docs/*.md <<'PY'; then
import os, re, subprocess, sys

root = os.getcwd()
tracked = set(subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True,
                             text=True).stdout.split("\0")) - {""}
folders = {os.path.dirname(p) for p in tracked}
while True:
    more = {os.path.dirname(f) for f in folders} - folders
    if not more:
        break
    folders |= more


def prose(text):
    """The text with fenced code blocks and inline code spans blanked out."""
    text = re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", text, flags=re.M | re.S)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "``", text, flags=re.S)


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    seen, out = {}, set()
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", f.read(), flags=re.M | re.S)
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


checked, broken = 0, []
for doc in sys.argv[1:]:
    with open(doc, encoding="utf-8") as f:
        text = prose(f.read())
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", text, flags=re.M)
    bare = re.findall(r"(?<![(<])\b(?:https?|ftp)://\S+", text)
    for t in bare:
        checked += 1
        broken.append(f"{doc}: {t}: an address outside the repository")
    for t in targets:
        checked += 1
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", t) or t.startswith("//"):
            broken.append(f"{doc}: {t}: points outside the repository")
            continue
        path, _, fragment = t.partition("#")
        base = root if path.startswith("/") else os.path.dirname(os.path.join(root, doc))
        full = os.path.normpath(os.path.join(base, path.lstrip("/"))) if path else os.path.join(root, doc)
        rel = os.path.relpath(full, root)
        if rel == ".." or rel.startswith("../"):
            broken.append(f"{doc}: {t}: points outside the repository")
        elif rel not in tracked and rel not in folders:
            broken.append(f"{doc}: {t}: {rel} is not a file or folder of the repository")
        elif fragment and rel.endswith(".md") and fragment not in anchors(full):
            broken.append(f"{doc}: {t}: {rel} has no heading #{fragment}")
for b in broken:
    print("  broken link:", b)
print(f"readme-commands: links: {checked} checked, {len(broken)} broken")
sys.exit(1 if broken else 0)
PY
  links_ok=false
else
  links_ok=true
fi

# ---- the commands ----------------------------------------------------------
# The README's ```sh blocks, each block's lines followed by a line holding
# only \x1e. A ```json or ```text block that follows a sh block with nothing
# but blank lines between is the output the README shows for that block's
# last command: its lines come between two lines holding only \x1d.
blocks=$(awk '
  FNR == 1                                     { print "\037" FILENAME; after_sh = 0 }
  /^```(sh|bash|shell)[ \t]*$/                 { inside = "sh"; next }
  /^```(json|text)[ \t]*$/ && after_sh         { inside = "out"; print "\035"; next }
  inside && /^```[ \t]*$/ {
    print (inside == "sh" ? "\036" : "\035"); after_sh = (inside == "sh"); inside = ""; next
  }
  inside                                       { print; next }
  /[^ \t]/                                     { after_sh = 0 }
' "$readme" "${guides[@]}")

commands=()
origin=()   # each command's document
terminal=() # each command's block: a block is one terminal
declare -A shown=()
pending=""
in_output=false
doc=$readme
block=0
complete() { # complete TEXT: is TEXT one whole shell statement?
  local text=$1 err
  [[ $text == *\\ ]] && return 1
  err=$(bash -n -c "$text" 2>&1) || return 1
  [ -z "$err" ]
}
while IFS= read -r line; do
  if [[ $line == $'\037'* ]]; then
    doc=${line#$'\037'}
    continue
  fi
  if [ "$line" = $'\035' ]; then
    if $in_output; then in_output=false; else in_output=true; fi
    continue
  fi
  if $in_output; then
    last=$((${#commands[@]} - 1))
    shown[$last]+="$line"$'\n'
    continue
  fi
  if [ "$line" = $'\036' ]; then
    if [ -n "$pending" ]; then
      echo "readme-commands: a command in $doc does not end: $pending" >&2
      commands+=("$pending")
      origin+=("$doc")
      terminal+=("$block")
      pending=""
    fi
    block=$((block + 1))
    continue
  fi
  if [ -z "$pending" ] && [[ $line =~ ^[[:space:]]*(#.*)?$ ]]; then
    continue
  fi
  pending=${pending:+$pending$'\n'}$line
  if complete "$pending"; then
    commands+=("$pending")
    origin+=("$doc")
    terminal+=("$block")
    pending=""
  fi
done <<<"$blocks"

if [ "${#commands[@]}" -eq 0 ]; then
  echo "readme-commands: found no command in $readme" >&2
  exit 1
fi

# Every listed exception must still be shown somewhere: a stale entry would
# let a new command of the same first line go unrun.
declare -A seen=()
for i in "${!commands[@]}"; do
  seen["${origin[$i]}: ${commands[$i]%%$'\n'*}"]=1
done
stale=0
for key in "${!not_run[@]}"; do
  if [ -z "${seen[$key]:-}" ]; then
    echo "readme-commands: not_run lists a command no document shows: $key" >&2
    stale=$((stale + 1))
  fi
done
[ "$stale" -eq 0 ] || exit 1

if $list_only; then
  for i in "${!commands[@]}"; do
    key="${origin[$i]}: ${commands[$i]%%$'\n'*}"
    if [ -n "${not_run[$key]:-}" ]; then
      echo "not run  $key"
      echo "         why: ${not_run[$key]}"
    else
      echo "run      $key"
    fi
  done
  exit 0
fi

# ---- a fresh clone's state ------------------------------------------------
# The outputs the README shows are a fresh clone's: with the state of an
# earlier run, the ledger would answer the refund with its stored result.
state=toolgate-data/toolgate.db
if [ -e "$state" ]; then
  echo "readme-commands: $state holds the state of an earlier run, and the README shows" >&2
  echo "  a fresh clone's outputs; run this from a fresh clone, or move toolgate-data/ away" >&2
  exit 1
fi

# ---- what the README tells the reader to install --------------------------
need() { # need TOOL INSTALL-COMMAND...
  local tool=$1
  shift
  command -v "$tool" >/dev/null && return 0
  echo "readme-commands: $tool is missing; installing it as the README says: $*"
  "$@" || { echo "readme-commands: installing $tool failed" >&2; exit 1; }
  command -v "$tool" >/dev/null || { echo "readme-commands: $tool still not on PATH" >&2; exit 1; }
}
apt_install() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
need buf npm install --global --no-audit --no-fund @bufbuild/buf
need jq apt_install jq
echo "readme-commands: buf $(buf --version), $(jq --version)"


# matches SHOWN OUTPUT: does the command's standard output hold every line
# the README shows for it, in order? Leading and trailing blanks do not
# count, and "…" in a shown line stands for anything (what differs from run
# to run: ids, hashes, keys).
matches() {
  python3 - "$1" "$2" <<'PY'
import re, sys
shown = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
got = [l.strip() for l in open(sys.argv[2], encoding="utf-8", errors="replace")]
at = 0
for want in shown:
    pattern = re.compile(".*".join(map(re.escape, want.split("…"))) + r"\Z", re.S)
    while at < len(got) and not pattern.match(got[at]):
        at += 1
    if at == len(got):
        print(f"    the README shows a line the command did not print: {want}")
        sys.exit(1)
    at += 1
PY
}

passed=0
failed=0
skipped=0
show() { sed -e 's/^/    | /' "$1" | tail -n "$2"; }

root=$(pwd)
here=$root
last_terminal=-1
for i in "${!commands[@]}"; do
  cmd=${commands[$i]}
  n=$((i + 1))
  title="[$n] ${origin[$i]}: ${cmd%%$'\n'*}"
  log="$work/$n.log"
  out="$work/$n.out"
  # A new block is a new terminal, opened at the root of the clone.
  if [ "${terminal[$i]}" != "$last_terminal" ]; then
    here=$root
    last_terminal=${terminal[$i]}
  fi
  if [ -n "${not_run["${origin[$i]}: ${cmd%%$'\n'*}"]:-}" ]; then
    echo "skip  $title (not run here: ${not_run["${origin[$i]}: ${cmd%%$'\n'*}"]})"
    skipped=$((skipped + 1))
    continue
  fi
  if [ "$cmd" = "$skipped_command" ]; then
    echo "skip  $title (.ci/run has just run it)"
    skipped=$((skipped + 1))
    continue
  fi

  if [ "$cmd" = "$serve_command" ]; then
    if [ -n "$serve_pid" ]; then
      echo "FAIL  $title: a second sidecar on the same port"
      failed=$((failed + 1))
      continue
    fi
    if port_answers; then
      echo "FAIL  $title: something already listens on $addr_host:$addr_port; stop it first"
      failed=$((failed + 1))
      continue
    fi
    echo "start $title (in the background; building first, up to ${build_limit_s} s)"
    start=$SECONDS
    setsid bash -o pipefail -c "$cmd" </dev/null >"$log" 2>&1 &
    serve_pid=$!
    up=false
    for tick in $(seq 1 "$build_limit_s"); do
      if ! kill -0 "$serve_pid" 2>/dev/null; then break; fi
      if port_answers; then up=true; break; fi
      [ $((tick % 120)) -eq 0 ] && echo "      still waiting for $addr_host:$addr_port ($tick s)"
      sleep 1
    done
    if $up && kill -0 "$serve_pid" 2>/dev/null; then
      echo "ok    $title: $addr_host:$addr_port answers after $((SECONDS - start)) s"
      passed=$((passed + 1))
    else
      echo "FAIL  $title: $addr_host:$addr_port did not answer within ${build_limit_s} s, or the sidecar exited"
      show "$log" 40
      failed=$((failed + 1))
      stop_serve
    fi
    continue
  fi

  limit=$command_limit_s
  [[ $cmd == cargo\ * ]] && limit=$build_limit_s
  start=$SECONDS
  # Standard output alone is compared with what the README shows; the log
  # shown in CI's output holds both streams (standard error first).
  # The command runs where the one before it in its block ended, and tells
  # where it ended itself.
  timeout --kill-after=10 "$limit" bash -o pipefail -c \
    'cd "$1" || exit 1; eval "$2"; rc=$?; pwd >"$3"; exit "$rc"' \
    command "$here" "$cmd" "$work/$n.cwd" </dev/null >"$out" 2>"$work/$n.err"
  rc=$?
  [ -s "$work/$n.cwd" ] && here=$(cat "$work/$n.cwd")
  cat "$work/$n.err" "$out" >"$log"
  if [ "$rc" -ne 0 ]; then
    reason="exit $rc"
    [ "$rc" -eq 124 ] && reason="no answer within $limit s"
    echo "FAIL  $title: $reason"
    show "$log" 40
    failed=$((failed + 1))
    continue
  fi
  if [ -n "${shown[$i]:-}" ]; then
    printf '%s' "${shown[$i]}" >"$work/$n.shown"
    if ! why=$(matches "$work/$n.shown" "$out"); then
      echo "FAIL  $title: its output is not what $readme or its guide shows"
      echo "$why"
      show "$log" 40
      failed=$((failed + 1))
      continue
    fi
    echo "ok    $title ($((SECONDS - start)) s; output as shown)"
  else
    echo "ok    $title ($((SECONDS - start)) s)"
  fi
  show "$log" 25
  passed=$((passed + 1))
done

$links_ok || echo "readme-commands: some links are broken (listed above)"
echo "readme-commands: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] && $links_ok
