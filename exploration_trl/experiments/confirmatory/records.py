"""What a finished run's record holds, as arrays: its held-out pass@1 and pass@n, and its per-problem correct counts
(the second protocol's records), at given steps. The lowest module of the confirmatory package's readers: the
protocol's selection rule, the analysis and the integrity checks read records through it."""

from __future__ import annotations


def points_at(rec: dict, steps: list[int]):
    """`(len(steps), 2)` held-out pass@1 and pass@n of a run's record at `steps`."""
    import numpy as np

    by = {r["step"]: (r["pass@1"], r["pass@n"]) for r in rec["rows"]}
    return np.array([by[s] for s in steps], float)


def counts_at(rec: dict, steps: list[int]):
    """`(len(steps), problems)` correct samples per held-out problem of a run at `steps` (second protocol's records)."""
    import numpy as np

    by = rec.get("correct_counts") or {}
    return np.array([by[str(s)] for s in steps], float)
