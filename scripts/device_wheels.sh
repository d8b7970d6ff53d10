#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, for `make cuda-check` there (it has no network).
# The image (torch 2.11.0+cu130, Python 3.12, transformers 5.17) has torch, transformers,
# httpx, anyio, h11 and click, but not the server's stack, the grammar library or the OpenAI
# client the tests use. Each is downloaded at the version this checkout's venv runs (so
# pydantic and pydantic-core, say, agree), for CPython 3.12 on x86-64 Linux, without its
# dependencies (each one the image lacks is named here). Writes .whl/ (git-ignored).
# Usage: scripts/device_wheels.sh [PYTHON]   (PYTHON: the venv's, whose versions are copied)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
# typing-extensions too: the image has one, perhaps older than pydantic-core needs.
PACKAGES="fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection
typing-extensions llguidance openai httpx2 httpcore2 truststore jiter distro sniffio
opentelemetry-api"
# pip matches a manylinux_2_N tag only for an N named, so each N a wheel here is built for is.
PLATFORMS="manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64
manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
manylinux2014_x86_64 manylinux1_x86_64"

pins=$("$PYTHON" - $PACKAGES <<'PY'
import sys
from importlib.metadata import version

print(" ".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
PY
)
rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2046  # one --platform per word
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $(printf -- '--platform %s ' $PLATFORMS) -d .whl $pins
echo "device_wheels.sh: $(ls .whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1))"
