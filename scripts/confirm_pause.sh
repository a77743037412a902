#!/usr/bin/env bash
# Pause every second-protocol run on this machine and wait until none is left (confirmatory_state/README.md).
# Stopping a driver alone is not enough: its jobs run in their own process groups and, started from a background
# shell, ignore SIGINT. So this stops the launchers (which pause their jobs themselves) and the frozen drivers, then
# sends SIGINT to the process group of every job left, SIGTERM after GRACE seconds (default 120), and waits.
# A paused job resumes from its last complete checkpoint when the launcher runs again.
# Usage: scripts/confirm_pause.sh [GRACE]
set -uo pipefail
grace=${1:-120}
# (The patterns can be changed for the script's own test, which must not pause real runs.)
jobs_pattern=${CONFIRM_JOBS_PATTERN:-exploration_trl.experiments.confirmatory.command}
launcher_pattern=${CONFIRM_LAUNCHER_PATTERN:-exploration_trl.experiments.confirmatory.launcher}
driver_pattern=${CONFIRM_DRIVER_PATTERN:-exploration_trl.cli confirm}
pkill -TERM -f "$launcher_pattern" && echo "pause: launchers told to pause their jobs"
pkill -TERM -f "$driver_pattern" && echo "pause: frozen drivers stopped"
groups() { for p in $(pgrep -f "$jobs_pattern"); do ps -o pgid= -p "$p" 2>/dev/null; done | tr -d ' ' | sort -u; }
for g in $(groups); do kill -INT -- "-$g" 2>/dev/null && echo "pause: SIGINT to job group $g"; done
waited=0
while pgrep -f "$jobs_pattern" >/dev/null; do
  if [ "$waited" -ge "$grace" ]; then
    for g in $(groups); do kill -TERM -- "-$g" 2>/dev/null && echo "pause: SIGTERM to job group $g (SIGINT ignored)"; done
    grace=$((grace + 60))
  fi
  if [ "$waited" -ge $((grace + 600)) ]; then echo "pause: jobs still running after $waited s:" >&2; pgrep -af "$jobs_pattern" >&2; exit 1; fi
  sleep 2; waited=$((waited + 2))
done
while pgrep -f "$launcher_pattern" >/dev/null; do sleep 1; done
echo "pause: no protocol job is running (waited ${waited} s)"
