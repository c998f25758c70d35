#!/usr/bin/env bash
# Runs every command shown in README.md, then in the guides that continue it
# (docs/gateways.md, against the same sidecar), as written, from the root of
# the clone, and exits non-zero if any fails; before that, checks that every link
# in README.md and docs/*.md stays inside the repository and resolves.
#
# The commands are read from the README's ```sh blocks, never kept here by
# hand, so a README edit that breaks a command fails CI. A command is one
# complete shell statement (continuation lines, pipelines and here-documents
# included). Each runs in its own bash with pipefail, from the root, under a
# time limit; like a reader's, they share only the files they leave behind.
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
# The guides whose commands continue the README's, in this order.
guides=(docs/gateways.md)
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

# ---- the commands ----------------------------------------------------------
# The README's ```sh blocks, each block's lines followed by a line holding
# only \x1e. A ```json or ```text block that follows a sh block with nothing
# but blank lines between is the output the README shows for that block's
# last command: its lines come between two lines holding only \x1d.
blocks=$(awk '
  /^```(sh|bash|shell)[ \t]*$/                 { inside = "sh"; next }
  /^```(json|text)[ \t]*$/ && after_sh         { inside = "out"; print "\035"; next }
  inside && /^```[ \t]*$/ {
    print (inside == "sh" ? "\036" : "\035"); after_sh = (inside == "sh"); inside = ""; next
  }
  inside                                       { print; next }
  /[^ \t]/                                     { after_sh = 0 }
' "$readme" "${guides[@]}")

commands=()
declare -A shown=()
pending=""
in_output=false
complete() { # complete TEXT: is TEXT one whole shell statement?
  local text=$1 err
  [[ $text == *\\ ]] && return 1
  err=$(bash -n -c "$text" 2>&1) || return 1
  [ -z "$err" ]
}
while IFS= read -r line; do
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
      echo "readme-commands: a command in $readme does not end: $pending" >&2
      commands+=("$pending")
      pending=""
    fi
    continue
  fi
  if [ -z "$pending" ] && [[ $line =~ ^[[:space:]]*(#.*)?$ ]]; then
    continue
  fi
  pending=${pending:+$pending$'\n'}$line
  if complete "$pending"; then
    commands+=("$pending")
    pending=""
  fi
done <<<"$blocks"

if [ "${#commands[@]}" -eq 0 ]; then
  echo "readme-commands: found no command in $readme" >&2
  exit 1
fi

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

for i in "${!commands[@]}"; do
  cmd=${commands[$i]}
  n=$((i + 1))
  title="[$n] ${cmd%%$'\n'*}"
  log="$work/$n.log"
  out="$work/$n.out"
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
  timeout --kill-after=10 "$limit" bash -o pipefail -c "$cmd" </dev/null >"$out" 2>"$work/$n.err"
  rc=$?
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
