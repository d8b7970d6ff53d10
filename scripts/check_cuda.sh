#!/usr/bin/env bash
# The checks only a GPU can run: tests/test_cuda.py and the parity tests on CUDA, then
# scripts/bench_cuda.py. Writes reports/wallclock/cuda-parity.md (the pytest summary) and
# reports/wallclock/cuda-throughput.md. Usage: scripts/check_cuda.sh [bench_cuda.py options]
#
# Time budget: one device command may run 10 minutes, and a lease is 15 minutes with the
# machine's start, so the whole script stays under 600 s on an H200:
#   wheels into a site folder      ~15 s
#   the CUDA tests                 at most 180 s (cut off after)
#   the benchmark                  starts no run after 270 s (--budget-s), cut off at 360 s;
#                                  its report is rewritten after every run, so a cut keeps
#                                  the rows already measured
# Worst case 15 + 180 + 360 = 555 s.
# The benchmark runs even when a test fails, and the script then exits with the tests' status:
# one lease yields both reports.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-180}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-270}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-360}
export PYTHONPATH=$PWD

if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "check_cuda.sh: torch sees no CUDA device; these checks need one (CI has none)" >&2
    exit 1
fi

# A GPU image without the server's packages (and no network) gets them from the wheels that
# `make wheels-for-device` downloads into .whl/; a python that has them installs nothing.
if ! "$PYTHON" -c 'import fastapi, llguidance, openai' 2>/dev/null; then
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "check_cuda.sh: $PYTHON lacks fastapi, llguidance or openai and .whl/ holds no" \
            "wheels (run \`make wheels-for-device\` where there is a network)" >&2
        exit 1
    fi
    site=${TMPDIR:-/tmp}/llmengine-site
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl
    export PYTHONPATH=$site:$PWD
fi

# The parity tests on CUDA are in test_cuda.py; the CPU ones run again beside them, as the
# reference they repeat. pytest's status is kept so the summary is written even on failure.
summary=$(mktemp)
status=0
timeout "$TESTS_TIMEOUT_S" "$PYTHON" -m pytest tests/test_cuda.py tests/test_model_parity.py \
    tests/test_engine_swap.py -q -rs -p no:cacheprovider | tee "$summary" || status=$?
gpu=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')
{
    echo "# CUDA parity on $gpu"
    echo
    echo "\`pytest tests/test_cuda.py tests/test_model_parity.py tests/test_engine_swap.py\`,"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "torch $("$PYTHON" -c 'import torch; print(torch.__version__)'):"
    echo
    echo '```'
    tail -n 20 "$summary"
    if [ "$status" -eq 124 ]; then echo "(cut off after $TESTS_TIMEOUT_S s)"; fi
    echo '```'
} > reports/wallclock/cuda-parity.md
rm -f "$summary"

bench_status=0
env -u OMP_NUM_THREADS timeout "$BENCH_TIMEOUT_S" "$PYTHON" scripts/bench_cuda.py \
    --budget-s "$BENCH_BUDGET_S" "$@" || bench_status=$?
if [ "$status" -ne 0 ]; then
    echo "check_cuda.sh: the CUDA tests failed (see reports/wallclock/cuda-parity.md)" >&2
    exit "$status"
fi
exit "$bench_status"
