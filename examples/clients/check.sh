#!/usr/bin/env bash
# Runs the README's client recipes against a real moviedb-mcp, so the README cannot drift from
# what works: the official Python SDK on 2026-07-28 and forced to 2025-11-25, and the official
# TypeScript SDK v2 client on 2026-07-28. Each signs in, adds a movie without a status, answers
# the server's question in its elicitation callback, and must print the item saved as WATCHED.
#
#   bash examples/clients/check.sh          # needs target/debug/moviedb-mcp (cargo build)
#
# The pinned SDKs (python/requirements.txt, typescript/package.json) are installed on first use
# into examples/clients/.tools/ and typescript/node_modules/, both git-ignored.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
server_bin="${MOVIEDB_BIN:-$root/target/debug/moviedb-mcp}"
tools="$here/.tools"

log() { printf '[client-recipes] %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[ -x "$server_bin" ] || die "$server_bin is not built (cargo build)"

if [ ! -x "$tools/py/bin/python" ] || ! "$tools/py/bin/pip" freeze | grep -qxF -f "$here/python/requirements.txt"; then
    log "installing the Python SDK ($(cat "$here/python/requirements.txt")) into $tools/py"
    python3 -m venv "$tools/py"
    "$tools/py/bin/pip" install --quiet --disable-pip-version-check -r "$here/python/requirements.txt"
fi
if [ ! -d "$here/typescript/node_modules/@modelcontextprotocol/client" ]; then
    log "installing the TypeScript SDK into $here/typescript/node_modules"
    npm install --no-audit --no-fund --no-package-lock --prefix "$here/typescript" >&2
fi

data_dir="$(mktemp -d)"
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$data_dir"
    return 0
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
env -u DATABASE_URL -u REDIS_URL RUST_LOG=info "$server_bin" --data-dir "$data_dir" --bind "127.0.0.1:$port" \
    >"$data_dir/server.log" 2>&1 &
server_pid=$!
listening=
for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { listening=yes; break; }
    kill -0 "$server_pid" 2>/dev/null || die "the server exited: $(tail -5 "$data_dir/server.log")"
    sleep 0.1
done
[ -n "$listening" ] || die "the server did not listen within 30 s: $(tail -5 "$data_dir/server.log")"
url="http://127.0.0.1:$port/mcp"
token="$(env -u DATABASE_URL "$server_bin" --data-dir "$data_dir" token --user recipe-reader 2>"$data_dir/token.err")" \
    || die "moviedb-mcp token failed: $(cat "$data_dir/token.err")"

# recipe NAME MOVIE_ID COMMAND…: runs one recipe and checks what it printed.
recipe() {
    local name=$1 movie=$2; shift 2
    local out="$data_dir/$name.out" err="$data_dir/$name.err"
    log "$name: movie $movie"
    if ! MCP_URL="$url" MCP_TOKEN="$token" MOVIE_ID="$movie" "$@" >"$out" 2>"$err"; then
        die "$name exited with an error: $(cat "$out" "$err")"
    fi
    grep -q "the server asks: Have you already watched this title" "$err" \
        || die "$name did not get the status question: $(cat "$err")"
    python3 - "$out" "$name" <<'PY' || die "$name printed: $(cat "$out")"
import json, sys
item = json.load(open(sys.argv[1]))
assert item["status"] == "WATCHED", item
assert item["id"].isdigit() and item["content"]["title"], item
print(f"[client-recipes] {sys.argv[2]}: saved {item['content']['title']!r} as {item['status']}", file=sys.stderr)
PY
}

recipe python 6 "$tools/py/bin/python" "$here/python/add_to_watchlist.py"
grep -q "legacy session opened" "$data_dir/server.log" && die "the Python recipe opened a 2025-11-25 session"
recipe typescript 7 node "$here/typescript/add_to_watchlist.mjs"
grep -q "legacy session opened" "$data_dir/server.log" && die "the TypeScript recipe opened a 2025-11-25 session"
MCP_ERA=legacy recipe python-2025-11-25 8 "$tools/py/bin/python" "$here/python/add_to_watchlist.py"
grep -q 'legacy session opened.*version="2025-11-25"' "$data_dir/server.log" \
    || die "the legacy recipe did not open a 2025-11-25 session"
log "all three client recipes got the question and saved the movie as WATCHED"
