#!/usr/bin/env bash
# Copy the second protocol's FINISHED records (JSON with "finished": true) from a run folder into
# confirmatory_state/countdown3_v2/, so a session can commit them; runs in flight are left where they are (they
# resume from their checkpoints). Usage: scripts/sync_confirmatory_state.sh [RUN_DIR]
# (default /work/confirmatory_runs/countdown3_v2). Prints how many records are kept per arm.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/confirmatory_runs/countdown3_v2}
dst=confirmatory_state/countdown3_v2
[ -d "$src/runs" ] || { echo "sync: $src/runs does not exist; pass the run folder as the first argument" >&2; exit 2; }
python3 - "$src" "$dst" <<'PY'
import json, shutil, sys
from collections import Counter
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
copied, kept = 0, Counter()
for rec in sorted(src.glob("runs/**/*.json")):
    try:
        data = json.loads(rec.read_text())
    except (OSError, ValueError):
        continue
    if not isinstance(data, dict) or data.get("finished") is not True:
        continue
    out = dst / rec.relative_to(src)
    if not out.exists() or out.read_bytes() != rec.read_bytes():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(rec, out)
        copied += 1
    kept["selection" if "selection" in rec.parts else rec.name.split("__")[0]] += 1
for name in ("selection.json", "result.json"):
    if (src / name).exists():
        shutil.copyfile(src / name, dst / name)
print(f"sync: {copied} record(s) copied; finished per arm: " + ", ".join(f"{k} {v}" for k, v in sorted(kept.items())))
PY
