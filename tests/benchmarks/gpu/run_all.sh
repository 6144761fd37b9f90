#!/usr/bin/env bash
# Every GPU check in one call on the lent GPU machine (docs/gpu-checks.md has the exact
# `run` call): installs the carried wheels (.whl/, from fetch_wheels.sh) without network,
# puts cbbench on the path without installing it (its `cbbench.*` namespace mapped onto this
# checkout, as pyproject's package-dir does), then runs tests/benchmarks/gpu/run_all.py.
# Results: $OUT/{gpu-checks.tar.gz,summary.json,summary.txt} (OUT defaults to
# results/gpu-checks). Extra arguments go to run_all.py (--only, --budget, --dry-run).
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/gpu-checks}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  # on failure go on: only the server's checks need them (env.json lists what imports)
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/cbbench-site .whl/*.whl; then
    export PYTHONPATH=/tmp/cbbench-site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "run_all.sh: installing .whl/ failed (not Python 3.12 x86-64?); going on without"
  fi
fi
ns=/tmp/cbbench-ns/cbbench
mkdir -p "$ns"
for d in harness reference_engine kernels workloads; do ln -sfn "$PWD/$d" "$ns/$d"; done
export PYTHONPATH=/tmp/cbbench-ns:$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "run_all.sh: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1)"
exec "$PY" -m tests.benchmarks.gpu.run_all --out "$OUT" "$@"
