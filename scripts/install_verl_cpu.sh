#!/usr/bin/env bash
# Install exploration-trl with verl (the [verl] extra: verl 0.9.x) into a virtual environment of its own, on a CPU.
#
#   bash scripts/install_verl_cpu.sh [VENV]        (default VENV: .venv-verl, in the repository root)
#
# Why a second environment: verl 0.9.1 requires transformers >= 5.5.3, < 5.11 (and Ray, Hydra, tensordict, wandb),
# while the main environment resolves a newer transformers. verl asks for no torch of its own (only its GPU extras pin
# torch 2.11), so the torch installed first is kept: a constraint file holds it at TORCH_SPEC through every install.
# Besides the extra, the modules verl's trainer imports at module level but declares only in its `verl-core` extra
# (cachetools, fastapi, uvicorn; TransferQueue, pyzmq and msgspec for the v1 trainer), so that the tests can call
# verl's own `compute_advantage`; the rest of `verl-core` (torchcodec, nvtx, qwen_vl_utils, ...) is not needed.
#
# Environment (optional): PYTHON=python3 (the interpreter the environment is made from), TORCH_SPEC=torch==2.13.0
# (on this project's machines the CPU wheel of that version is the one pip finds; elsewhere point pip at PyTorch's CPU
# wheel index, e.g. with PIP_EXTRA_INDEX_URL, so that torch==2.13.0+cpu resolves), EXTRAS=verl (e.g. verl,test).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-verl}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${EXTRAS:-verl}"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "$TORCH_SPEC" > "$constraints"
"${PIP[@]}" install -q "$TORCH_SPEC"
"${PIP[@]}" install -q -c "$constraints" -e ".[$EXTRAS]" pytest cachetools fastapi uvicorn TransferQueue pyzmq msgspec
# Fails (and so does this script) when verl cannot be imported or does not load the plugin.
VERL_USE_EXTERNAL_PLUGINS=auto "$VENV/bin/python" - <<'PY' 2>&1 | grep -v -i "warn"
import importlib.metadata as metadata

import torch
import verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

names = sorted(n for n in ADV_ESTIMATOR_REGISTRY if n.startswith("etrl_"))
assert names, "import verl did not load exploration-trl's verl.plugins entry point"
print(f"verl {verl.__version__}, torch {torch.__version__}, transformers {metadata.version('transformers')}, "
      f"trl {metadata.version('trl')}; registered by import verl: {', '.join(names)}")
PY
echo "ready: . $VENV/bin/activate"
