#!/usr/bin/env bash
# Regenerate the committed CI baselines; run from anywhere with cbbench on PATH (the venv).
# The configuration here must match tests/test_gate_baselines.py, which reruns it and gates.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=results/baselines
rm -rf "$B/sim-ci-small" "$B/cpu-tiny-continuous"
cbbench sim --schedulers continuous --workload "$B/ci-workload.toml" --rate 20 --out "$B/sim-ci-small"
log=$(mktemp)
cbbench serve --model tiny --scheduler continuous --host 127.0.0.1 --port 0 >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
url=""
for _ in $(seq 240); do
  url=$(grep -o 'ready at http://[0-9.:]*' "$log" | cut -d' ' -f3 || true)
  [ -n "$url" ] && break
  sleep 0.5
done
[ -n "$url" ] || { echo "cbbench serve did not start:"; cat "$log"; exit 1; }
cbbench bench --base-url "$url" --workload "$B/ci-workload.toml" --concurrency 8 --warmup 8 \
  --no-live --no-gpu-metrics --out "$B/cpu-tiny-continuous"
