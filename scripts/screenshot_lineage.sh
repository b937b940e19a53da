#!/usr/bin/env bash
# Takes a headless Chromium screenshot of the asset lineage page for the README (not run in CI).
# Needs Debian's chromium (apt-get install chromium). Usage: scripts/screenshot_lineage.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/lineage.png}"
home="$(mktemp -d)/home"
port=3457
make setup >/dev/null
.venv/bin/python -m dunning.demo --out "$home/../snapshot.csv" >/dev/null
.venv/bin/dunning --home "$home" run --snapshot "$home/../snapshot.csv" >/dev/null
DAGSTER_HOME="$home/dagster" DUNNING_HOME="$home" .venv/bin/dagster-webserver -w workspace.yaml -h 127.0.0.1 -p "$port" \
  >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/server_info" >/dev/null && break; sleep 0.5; done
mkdir -p "$(dirname "$out")"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$(mktemp -d)" --window-size=1600,1000 \
  --virtual-time-budget=15000 --screenshot="$out" "http://127.0.0.1:$port/asset-groups/dunning"
echo "screenshot: $out"
