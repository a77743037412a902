#!/usr/bin/env bash
# GPU validation in one command, for a lent GPU machine without network: the offline smoke test
# (scripts/gpu_smoke.sh) and the per-step overhead against TRL (benchmarks/overhead.py --device cuda) for TRL and
# every registered method, within a time cap, after installing the carried wheels. Writes gpu_validate.json and
# gpu_validate.md (a row per method) to the output folder. Exit status: 0 all ran and passed (or stopped at the cap
# with nothing failed; the report lists what was not run), 1 a run failed, 2 the set-up failed (e.g. a missing wheel).
#
#   scripts/gpu_validate.sh                              # cap 8 min, wheels from shared/wheels, output to $OUT
#   scripts/gpu_validate.sh --cap 6 --wheels /data/wheels --out /tmp/validate
#   scripts/gpu_validate.sh --dry-run --out /tmp/v       # the same stages on CPU, tiny sizes (~2 min; a slow test
#                                                        # runs it, the main suite with --methods kl_cov,progrpo+casp)
#   scripts/gpu_validate.sh --methods casp,progrpo+casp  # only these methods (the first gets the smoke test)
#   scripts/gpu_validate.sh --large-only --cap 8         # its own call: 2,048 tokens at 151,936 vocabulary, TRL and
#                                                        # a few methods (docs/gpu_validation.md has the estimate)
#
# Arguments (all optional):
#   --cap MINUTES   time cap for everything (default 8; --dry-run 5): the stage in flight is stopped and what it
#                   measured is kept; what was not reached is listed as not run
#   --wheels DIR    carried wheels, installed with `pip install --no-index --find-links DIR -r scripts/gpu_wheels.txt`
#                   (default: $GPU_VALIDATE_WHEELS, else shared/wheels when it exists, else nothing is installed)
#   --out DIR       output folder (default: $OUT when set, else outputs/gpu_validate)
#   --dry-run       CPU, the toy model, tiny workloads: checks the script, not the numbers
#   --workdir DIR   models and checkpoints (default: a temporary folder, removed at the end)
#   --methods LIST  comma-separated registered methods or compositions (default: every registered method)
#   --large-only    only the large overhead workload (benchmarks/overhead_device.py LARGE), no smoke runs
# Environment: PYTHON (default python3). How to collect the wheels: docs/gpu_validation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
exec "$PYTHON" scripts/gpu_validate.py "$@"
