#!/usr/bin/env bash
# The Python packages cbbench needs that the GPU machine's image lacks, as cp312 manylinux
# wheels in .whl/ (.gitignore has it; the device run carries it). The image (docs/gpu-checks.md,
# the device tool's KINDS.md) has torch, triton, numpy, pandas, httpx, rich, nvidia-ml-py,
# prometheus-client, safetensors, tokenizers, pyyaml, jinja2, click, h11, anyio,
# typing-extensions and annotated-doc; of pyproject's dependencies it lacks fastapi and
# uvicorn (the OpenAI server) and locust (not needed by any GPU check: left out, with its
# gevent/flask/zmq tree). --no-deps: each missing requirement is named here, one version each.
#   bash tests/benchmarks/gpu/fetch_wheels.sh        # once, here, with network (~5 MiB)
set -euo pipefail
cd "$(dirname "$0")/../../.."
WHEELS=(
  fastapi==0.165.0
  starlette==1.10.0
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  uvicorn==0.55.0
  opentelemetry-api==1.45.3  # fastapi imports it
  typing-extensions==4.16.0  # pydantic needs >= 4.16; the image's may be older
)
PY=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -la .whl
du -sh .whl
