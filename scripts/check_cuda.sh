#!/usr/bin/env bash
# The checks only a GPU can run: tests/test_cuda.py and the parity tests on CUDA, then
# scripts/bench_cuda.py. Writes reports/wallclock/cuda-parity.md (the pytest summary) and
# reports/wallclock/cuda-throughput.md. Usage: scripts/check_cuda.sh [bench_cuda.py options]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH=$PWD

if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "check_cuda.sh: torch sees no CUDA device; these checks need one (CI has none)" >&2
    exit 1
fi

# The parity tests on CUDA are in test_cuda.py; the CPU ones run again beside them, as the
# reference they repeat. pytest's status is kept so the summary is written even on failure.
summary=$(mktemp)
status=0
"$PYTHON" -m pytest tests/test_cuda.py tests/test_model_parity.py tests/test_engine_swap.py \
    -q -rs -p no:cacheprovider | tee "$summary" || status=$?
gpu=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')
{
    echo "# CUDA parity on $gpu"
    echo
    echo "\`pytest tests/test_cuda.py tests/test_model_parity.py tests/test_engine_swap.py\`,"
    echo "commit $(git rev-parse --short HEAD), torch $("$PYTHON" -c 'import torch; print(torch.__version__)'):"
    echo
    echo '```'
    tail -n 20 "$summary"
    echo '```'
} > reports/wallclock/cuda-parity.md
rm -f "$summary"
if [ "$status" -ne 0 ]; then
    echo "check_cuda.sh: the CUDA tests failed (see reports/wallclock/cuda-parity.md)" >&2
    exit "$status"
fi

env -u OMP_NUM_THREADS "$PYTHON" scripts/bench_cuda.py "$@"
