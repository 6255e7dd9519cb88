#!/usr/bin/env bash
# Lints moviedb-mcp's tool schemas with the MCP Inspector CLI (--strict).
# Fails when the inspector reports ANY finding (error or warning).
#
#   spec-compat/run-inspector-lint.sh                 # start target/debug/moviedb-mcp on a free port
#   spec-compat/run-inspector-lint.sh --url URL       # lint a running server instead
#   INSPECTOR_ERA=legacy spec-compat/run-inspector-lint.sh   # 2025-11-25 handshake instead of 2026-07-28
#
# Exit: 0 no findings; 1 findings (warnings, or errors = inspector exit 6); 2 setup error.
# The binary must be built beforehand (cargo build); this script never builds.
set -euo pipefail

readonly INSPECTOR_PKG="@modelcontextprotocol/inspector"
readonly INSPECTOR_VERSION="2.12.0"
readonly STARTUP_TIMEOUT_SECS=30
ERA="${INSPECTOR_ERA:-modern}"   # legacy | auto | modern (modern pins 2026-07-28)

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd)"
TOOLS_DIR="$REPO_ROOT/spec-compat/.tools/inspector"
# The launcher (bin "inspector"), not clients/cli/build/index.js: the latter only runs when
# argv[1] equals its real path, so it silently does nothing when started through a symlink.
CLI_JS="$TOOLS_DIR/node_modules/$INSPECTOR_PKG/clients/launcher/build/index.js"
SERVER_BIN="${MOVIEDB_BIN:-$REPO_ROOT/target/debug/moviedb-mcp}"

log() { printf '[inspector-lint] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

URL=""
while [ $# -gt 0 ]; do
    case "$1" in
        --url) URL="${2:?--url needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) die "unknown option: $1" ;;
    esac
done

# --- install the pinned inspector (skipped when already there) ----------------
installed=""
if [ -f "$TOOLS_DIR/node_modules/$INSPECTOR_PKG/package.json" ]; then
    installed="$(node -p "require('$TOOLS_DIR/node_modules/$INSPECTOR_PKG/package.json').version")"
fi
if [ "$installed" != "$INSPECTOR_VERSION" ]; then
    log "installing $INSPECTOR_PKG@$INSPECTOR_VERSION into $TOOLS_DIR"
    mkdir -p "$TOOLS_DIR"
    # Under Node 20 npm prints EBADENGINE warnings (the package asks for >=22.19);
    # the CLI's tools/list path runs fine on Node 20 all the same.
    npm install --no-audit --no-fund --save-exact --prefix "$TOOLS_DIR" \
        "$INSPECTOR_PKG@$INSPECTOR_VERSION" >&2 || die "npm install failed"
fi
[ -f "$CLI_JS" ] || die "inspector CLI not found at $CLI_JS"

# --- start the server unless --url was given ----------------------------------
SERVER_PID=""
DATA_DIR=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$SERVER_PID" 2>/dev/null || true
    fi
    [ -n "$DATA_DIR" ] && rm -rf "$DATA_DIR"
    return 0
}
trap cleanup EXIT

if [ -z "$URL" ]; then
    [ -x "$SERVER_BIN" ] || die "server binary not found: $SERVER_BIN (run cargo build first)"
    PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    DATA_DIR="$(mktemp -d)"
    LOG_FILE="$DATA_DIR/server.log"
    # On its embedded defaults: a DATABASE_URL or REDIS_URL of the caller's is not touched.
    env -u DATABASE_URL -u REDIS_URL "$SERVER_BIN" --data-dir "$DATA_DIR" --bind "127.0.0.1:$PORT" \
        >"$LOG_FILE" 2>&1 &
    SERVER_PID=$!
    deadline=$((SECONDS + STARTUP_TIMEOUT_SECS))
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then tail -20 "$LOG_FILE" >&2; die "server exited"; fi
        [ "$SECONDS" -lt "$deadline" ] || { tail -20 "$LOG_FILE" >&2; die "server did not start"; }
        sleep 0.2
    done
    URL="http://127.0.0.1:$PORT/mcp"
fi

# --- lint ---------------------------------------------------------------------
# --format json: stdout is one object; "schemaFindings" is present only when
# --strict found something. The human-readable report goes to stderr in text mode.
log "linting $URL (protocol era: $ERA)"
set +e
OUT="$(node "$CLI_JS" --cli "$URL" --method tools/list --strict --protocol-era "$ERA" --format json)"
RC=$?
set -e
if [ "$RC" -ne 0 ] && [ "$RC" -ne 6 ]; then
    die "inspector failed (exit $RC)"
fi
printf '%s\n' "$OUT" | node -e '
let s = ""; process.stdin.on("data", d => s += d).on("end", () => {
  const env = JSON.parse(s);
  const tools = (env.result && env.result.tools) || [];
  const findings = env.schemaFindings || [];
  let n = 0;
  for (const { toolName, findings: fs } of findings) for (const f of fs) {
    n++;
    const where = f.path ? `${f.schema}.${f.path}` : f.schema;
    console.log(`${f.severity.toUpperCase()} ${toolName} ${where} [${f.rule}]: ${f.issue}`);
  }
  console.log(`${tools.length} tools listed, ${n} findings`);
  process.exit(n === 0 && tools.length > 0 ? 0 : 1);
});'
