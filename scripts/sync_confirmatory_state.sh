#!/usr/bin/env bash
# Copy the second protocol's FINISHED records (JSON with "finished": true) from a run folder into
# confirmatory_state/countdown3_v2/, so a session can commit them; runs in flight are left where they are (they
# resume from their checkpoints). Amendment 2: with each finished record its platform log, and the platforms'
# descriptions, same-platform checks and platform controls (records and configs). Usage: scripts/sync_confirmatory_state.sh [RUN_DIR [STATE_DIR]]
# (default /work/confirmatory_runs/countdown3_v2). Prints how many records are kept per arm.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/confirmatory_runs/countdown3_v2}
dst=${2:-confirmatory_state/countdown3_v2}
[ -d "$src/runs" ] || { echo "sync: $src/runs does not exist; pass the run folder as the first argument" >&2; exit 2; }
python3 - "$src" "$dst" <<'PY'
import json, shutil, sys
from collections import Counter
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
copied, kept = 0, Counter()
def copy(path):
    global copied
    out = dst / path.relative_to(src)
    if not out.exists() or out.read_bytes() != path.read_bytes():
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out)
        copied += 1
records = sorted(src.glob("runs/**/*.json")) + sorted(src.glob("platform_control/*/runs/*.json")) \
    + sorted(src.glob("platforms/checks/*/runs/*.json"))
for rec in records:
    try:
        data = json.loads(rec.read_text())
    except (OSError, ValueError):
        continue
    if not isinstance(data, dict) or data.get("finished") is not True:
        continue
    copy(rec)
    # amendment 2: the run's platform log (runs/<x>.json -> platforms/confirm/<x>.jsonl in the same run folder)
    folder = rec.parent.parent.parent if rec.parent.name == "selection" else rec.parent.parent
    phase = "selection" if rec.parent.name == "selection" else "confirm"
    log = folder / "platforms" / phase / (rec.stem + ".jsonl")
    if log.exists():
        copy(log)
    where = "control " + rec.parent.parent.name if "platform_control" in rec.parts else \
        "check " + rec.parent.parent.name if "checks" in rec.parts else None
    kept[where or ("selection" if "selection" in rec.parts else rec.name.split("__")[0])] += 1
for extra in sorted(src.glob("platforms/hosts/*.json")) + sorted(src.glob("platforms/checks/*.json")) \
        + sorted(src.glob("platform_control/*/config.yaml")) + sorted(src.glob("platforms/checks/*/config.yaml")):
    copy(extra)
for name in ("selection.json", "result.json"):
    if (src / name).exists():
        shutil.copyfile(src / name, dst / name)
print(f"sync: {copied} record(s) copied; finished per arm: " + ", ".join(f"{k} {v}" for k, v in sorted(kept.items())))
PY
