"""Strength sweeps: each method's accuracy-diversity frontier, shared by `tree --sweep` and `countdown-tiny --sweep`.

A *point* is `(method, setting)`: an experiment method name and the config fields that set its strength. A sweep
trains every point over the given seeds; `aggregate` turns the runs into frontier rows

    {"method": ..., "setting": {...}, "seeds": [...], "<metric>": {"mean": ..., "std": ...}, ...}

which `write_frontier` stores as `{"rows": [...]}` (a fixed shape that outside scripts read) and `plot_frontier`
draws: accuracy (y) against diversity (x), one line per method through its settings, GRPO and the initial policy
as single points.

`best_setting` and `compare_to_entropy_bonus` apply the selection rules stated in docs/what_it_shows.md, fixed
before any sweep was run: the best setting of a method is the most diverse one whose accuracy is within a
tolerance of GRPO's, and a method beats the entropy bonus when it is more diverse than every entropy-bonus setting
(GRPO included, coefficient 0) that is at least as accurate.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import _common

Point = tuple[str, dict[str, Any]]

#: Method names given special roles in the frontier (plots, comparisons).
BASELINE = "grpo"
ENTROPY_BONUS = "grpo_entropy"
INITIAL = "initial_policy"

#: The entropy bonus has no paper value; 0.01 is the usual LLM coefficient (ours: `ours` names it).
ENTROPY_BONUS_PUBLISHED = {"entropy_coef": 0.01}
#: Where a sweep's published point differs from the record's: DS-GRPO's keeps 0.2.0's `token` form, the one the
#: documented sweeps and curves ran (the default `sequence_sum` is its own grid point). Ours, not the paper's.
SWEEP_FORM: dict[str, dict[str, Any]] = {"dsgrpo": {"ds_logp_granularity": "token"}}


class _Published(Mapping):
    """`{method: its published setting}`: each registered method's record, the values a source gives
    (`MethodInfo.published`: CaSP App. E, ProGRPO Sec. 4, DS-GRPO's Qwen2.5-Math tables, the KL-Cov / Clip-Cov
    recipes, ...) completed by ours where no source gives one (`MethodInfo.chosen`, e.g. outcome exploration's
    batch-penalty coefficient), with `SWEEP_FORM`, and the entropy bonus's. `ours(method)` names the keys of a point
    that no source gives, and the findings table marks them. Every grid contains these points. Always current (a
    method registered later is in it)."""

    def _all(self) -> dict[str, dict[str, Any]]:
        from ...methods import method_info
        from ...trainers import METHODS  # importing the trainers registers the built-in methods

        out = {ENTROPY_BONUS: dict(ENTROPY_BONUS_PUBLISHED)}
        for name in METHODS:
            setting = method_info(name).setting()
            if setting:
                out[name] = {**setting, **SWEEP_FORM.get(name, {})}
        return out

    def __getitem__(self, method: str) -> dict[str, Any]:
        return self._all()[method]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PUBLISHED: Mapping[str, dict[str, Any]] = _Published()


def ours(method: str) -> dict[str, Any]:
    """The keys of `PUBLISHED[method]` that no source gives, with their values: the method's `MethodInfo.chosen` and
    `SWEEP_FORM`, or the whole of the entropy bonus's; {} for a method not in `PUBLISHED`."""
    if method == ENTROPY_BONUS:
        return dict(ENTROPY_BONUS_PUBLISHED)
    if method not in PUBLISHED:
        return {}
    from ...methods import method_info

    return {**method_info(method).chosen, **SWEEP_FORM.get(method, {})}


def setting_prefixes() -> tuple[str, ...]:
    """The config prefixes of every registered method (`MethodInfo.config_prefixes`), which setting labels drop."""
    from ...methods import method_info
    from ...trainers import METHODS

    return tuple(p for name in METHODS for p in method_info(name).config_prefixes)

#: KL-Cov and Clip-Cov also change the rollout schedule (8 optimizer updates per rollout) and the ratio clipping;
#: these settings keep that and switch the token selection's effect off (no penalty; a covariance window no token
#: reaches), so a grid can tell the mechanism from the schedule.
MECHANISM_OFF: list[Point] = [
    ("kl_cov", {"kl_cov_ratio": 0.002, "kl_cov_coef": 0.0}),
    ("clip_cov", {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1e8, "clip_cov_ub": 1e9}),
]


def grid(method: str, **axes: Sequence[Any]) -> list[Point]:
    """Every combination of the `axes` values for `method`: `grid("casp", casp_alpha=[0.01, 0.1])`."""
    names = list(axes)
    return [(method, dict(zip(names, values))) for values in itertools.product(*(axes[n] for n in names))]


def point_key(method: str, setting: Mapping[str, Any]) -> str:
    return f"{method} {json.dumps(dict(setting), sort_keys=True)}"


def unique(points: Iterable[Point]) -> list[Point]:
    """`points` without repeats (the first occurrence kept), so overlapping grids train each point once."""
    seen, out = set(), []
    for method, setting in points:
        key = point_key(method, setting)
        if key not in seen:
            seen.add(key)
            out.append((method, dict(setting)))
    return out


def select_methods(points: Sequence[Point], methods: Sequence[str]) -> list[Point]:
    """The grid points of `methods`, in grid order; a method with no point in the grid gets its defaults."""
    out = [p for p in points if p[0] in methods]
    out += [(m, {}) for m in methods if not any(p[0] == m for p in points)]
    return out


def load_grid(path: str | Path, validate: Callable[[str], str]) -> list[Point]:
    """Read a grid file: YAML (or JSON) `method -> list of settings` (`{}` for the method's defaults)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--grid: file '{path}' not found")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"--grid: '{path}' must map method -> list of settings, e.g. casp: [{{casp_alpha: 0.1}}]")
    points: list[Point] = []
    for method, settings in data.items():
        validate(str(method))
        if not isinstance(settings, list) or not all(isinstance(s, dict) or s is None for s in settings):
            raise ValueError(f"--grid: entry '{method}' must be a list of settings (mappings of config field: value)")
        points += [(str(method), dict(s or {})) for s in settings]
    if not points:
        raise ValueError(f"--grid: '{path}' lists no settings")
    return unique(points)


def add_sweep_arguments(parser, what: str) -> None:
    """`--sweep` and `--grid`, shared by the experiments' parsers; `what` says what the frontier plots."""
    parser.add_argument("--sweep", action="store_true",
                        help="Train every method over a grid of its strength settings and write frontier.json, "
                             f"frontier.png and sweep.json ({what}).")
    parser.add_argument("--grid", default=None,
                        help="With --sweep: YAML mapping method -> list of settings to sweep instead of the built-in "
                             "grid (`tree --sweep` writes its best settings in this format as best_settings.yaml).")


def sweep_points(args, default: Sequence[Point], quick: Sequence[Point]) -> tuple[list[Point], list[str]]:
    """The points a sweep trains (`--grid` file, else the quick or the default grid, restricted to `--methods`)
    and their methods."""
    points = load_grid(args.grid, _common.validate_method) if args.grid else list(quick if args.quick else default)
    if args.methods:
        points = select_methods(points, [_common.validate_method(m) for m in _common.parse_list(args.methods, "--methods")])
    return points, list(dict.fromkeys(m for m, _ in points))


def setting_label(setting: Mapping[str, Any], prefixes: Sequence[str] | None = None) -> str:
    """`"alpha=0.1, tau=0.4"` (config field names without the method prefixes in `prefixes`, by default every
    registered method's); `"defaults"` if empty."""
    prefixes = setting_prefixes() if prefixes is None else prefixes
    parts = []
    for name, value in setting.items():
        for prefix in prefixes:
            name = name.removeprefix(prefix)
        parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
    return ", ".join(parts) or "defaults"


# ------------------------------------------------------------------------------------------ rows
def aggregate(runs: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Frontier rows, one per `(method, setting)` in first-seen order: the seeds and each metric's mean and std.

    Each run is `{"method", "setting", "seed", <metric>: value, ...}`."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault(point_key(r["method"], r["setting"]), []).append(r)
    rows = []
    for rs in groups.values():
        row: dict[str, Any] = {"method": rs[0]["method"], "setting": dict(rs[0]["setting"]),
                               "seeds": [r["seed"] for r in rs]}
        for key in metrics:
            mean, std = _common.mean_std([r[key] for r in rs])
            row[key] = {"mean": mean, "std": std}
        rows.append(row)
    return rows


def write_frontier(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """`{"rows": [...]}`, nothing else: the documented shape outside scripts read."""
    return _common.write_json(path, {"rows": list(rows)})


def mean(row: Mapping[str, Any], key: str) -> float:
    return float(row[key]["mean"])


def pareto(rows: Sequence[Mapping[str, Any]], x: str, y: str) -> list[Mapping[str, Any]]:
    """The rows no other row beats on both `x` and `y` (higher is better), sorted by `x`."""
    keep = [r for r in rows if not any(
        mean(o, x) >= mean(r, x) and mean(o, y) >= mean(r, y) and (mean(o, x) > mean(r, x) or mean(o, y) > mean(r, y))
        for o in rows)]
    return sorted(keep, key=lambda r: (mean(r, x), mean(r, y)))


# ------------------------------------------------------------------------------------------ selection rules
def best_setting(rows: Sequence[Mapping[str, Any]], method: str, accuracy: str, diversity: Sequence[str],
                 floor: float) -> Mapping[str, Any] | None:
    """`method`'s most diverse row with mean `accuracy >= floor`; ties on `diversity[0]` go to the next keys, then
    to accuracy. None when no setting of the method reaches the floor."""
    eligible = [r for r in rows if r["method"] == method and mean(r, accuracy) >= floor]
    if not eligible:
        return None
    return max(eligible, key=lambda r: (*(mean(r, k) for k in diversity), mean(r, accuracy)))


def compare_to_entropy_bonus(row: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], accuracy: str,
                             diversity: str, margin: float) -> dict[str, Any]:
    """Does `row` beat the entropy bonus at equal accuracy? The comparison row is the most diverse entropy-bonus
    setting, GRPO (coefficient 0) included, whose mean accuracy is at least `row`'s (if none is, the family's most
    accurate); `row` beats it when its mean diversity is higher by more than `margin`."""
    family = [r for r in rows if r["method"] in (ENTROPY_BONUS, BASELINE)]
    if not family:
        return {"beats": None, "against": None, "difference": None}
    as_accurate = [r for r in family if mean(r, accuracy) >= mean(row, accuracy)]
    # More accurate than the whole family: compare with its most accurate point (then `row` is better on both axes).
    pool = as_accurate or [max(family, key=lambda r: mean(r, accuracy))]
    other = max(pool, key=lambda r: (mean(r, diversity), mean(r, accuracy)))
    diff = mean(row, diversity) - mean(other, diversity)
    return {"beats": bool(diff > margin), "against": {"method": other["method"], "setting": other["setting"]},
            "difference": diff}


def findings(rows: Sequence[Mapping[str, Any]], accuracy: str, diversity: Sequence[str], tolerance: float,
             margin: float) -> dict[str, Any]:
    """Per method: its best setting (the rule of `best_setting`, floor = GRPO's mean accuracy - `tolerance`) and
    how it compares to the entropy bonus (`compare_to_entropy_bonus` on `diversity[0]`)."""
    base = next((r for r in rows if r["method"] == BASELINE), None)
    if base is None:
        return {}
    floor = mean(base, accuracy) - tolerance
    out: dict[str, Any] = {"rule": {"accuracy": accuracy, "diversity": list(diversity), "floor": floor,
                                    "tolerance": tolerance, "margin": margin}, "methods": {}}
    for method in dict.fromkeys(r["method"] for r in rows if r["method"] not in (BASELINE, INITIAL)):
        best = best_setting(rows, method, accuracy, diversity, floor)
        published = next((r for r in rows if r["method"] == method and r["setting"] == PUBLISHED.get(method)), None)
        entry: dict[str, Any] = {"best": best, "published": published,
                                 "num_settings": sum(r["method"] == method for r in rows)}
        if best is not None and method != ENTROPY_BONUS:
            entry["vs_entropy_bonus"] = compare_to_entropy_bonus(best, rows, accuracy, diversity[0], margin)
        out["methods"][method] = entry
    return out


def best_points(found: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """`method -> [published setting, best setting]` (each when known, without repeats) for a grid file (`--grid`),
    GRPO first."""
    out: dict[str, list[dict[str, Any]]] = {BASELINE: [{}]}
    for method, entry in found.get("methods", {}).items():
        settings = [dict(entry[k]["setting"]) for k in ("published", "best") if entry.get(k) is not None]
        out[method] = [s for i, s in enumerate(settings) if s not in settings[:i]]
    return {m: v for m, v in out.items() if v}


# ------------------------------------------------------------------------------------------ tables and plots
def print_summary(headline: str, result: Mapping[str, Any], rule: str, footer: str) -> None:
    """The end-of-sweep console report: the frontier table, the selection rule and each method's best setting."""
    print(f"\n{headline}\n{result['table']}")
    if result["findings"].get("rule"):
        print(f"\nBest setting per method: {rule}\n{result['findings_table']}")
    print(f"\n{footer}")


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, int, float]],
                 prefixes: Sequence[str] | None = None) -> str:
    """Markdown table, one line per row; `columns` are `(metric key, header, digits, scale)`."""
    header = ["method", "setting", "seeds", *(c[1] for c in columns)]
    lines = []
    for r in rows:
        cells = [r["method"], setting_label(r["setting"], prefixes), str(len(r["seeds"]))]
        for key, _, digits, scale in columns:
            m, s = r[key]["mean"], r[key]["std"]
            cells.append(f"{scale * m:.{digits}f} ± {scale * s:.{digits}f}" if len(r["seeds"]) > 1
                         else f"{scale * m:.{digits}f}")
        lines.append(cells)
    return _common.markdown_table(header, lines)


def plot_frontier(rows: Sequence[Mapping[str, Any]], x: str, y: str, out_png: str | Path, *, xlabel: str,
                  ylabel: str, title: str, scale: float = 1.0, floor: float | None = None,
                  zoom_margin: float = 0.0) -> Path:
    """Every setting of a method as a marker, a line through the method's Pareto-optimal settings (its frontier),
    GRPO and the initial policy as large single markers; error bars are the std over seeds. Left: every row;
    right: the same, zoomed on `y >= floor - zoom_margin` (the settings near GRPO's accuracy), with the selection
    `floor` dashed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.4))
    try:
        for ax in axes:
            _draw_frontier(ax, rows, x, y, scale)
            ax.set_xlabel(xlabel)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel(ylabel)
        shown = [r for r in rows if r["method"] != INITIAL and (floor is None or mean(r, y) >= floor - zoom_margin)]
        if shown:
            lo = min(mean(r, y) for r in shown) * scale
            hi = max(mean(r, y) for r in shown) * scale
            pad = max(hi - lo, 1e-3 * max(abs(hi), 1.0)) * 0.08
            axes[1].set_ylim(lo - pad, hi + pad)
            xs = [mean(r, x) * scale for r in shown]
            xpad = max(max(xs) - min(xs), 1e-3) * 0.08
            axes[1].set_xlim(min(xs) - xpad, max(xs) + xpad)
        if floor is not None:
            axes[1].axhline(floor * scale, color="grey", linestyle="--", linewidth=0.8, label="selection floor")
        axes[0].set_title("all settings", fontsize=9)
        axes[1].set_title("zoom: the settings near GRPO's accuracy", fontsize=9)
        axes[1].legend(fontsize="small", loc="best")
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        return _common.save_figure(fig, out_png, dpi=110)
    finally:
        plt.close(fig)


def _draw_frontier(ax, rows, x, y, scale):
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m not in (BASELINE, INITIAL)]
    for i, method in enumerate(methods):
        mine = [r for r in rows if r["method"] == method]
        color = cmap(i % 10)
        _errorbar(ax, mine, x, y, scale, color=color, fmt="o", markersize=4, alpha=0.55)
        front = pareto(mine, x, y)
        ax.plot([mean(r, x) * scale for r in front], [mean(r, y) * scale for r in front], "-", color=color,
                linewidth=1.6, label=f"{method} ({len(mine)} settings)")
    for name, marker, color in ((BASELINE, "*", "black"), (INITIAL, "s", "grey")):
        ref = [r for r in rows if r["method"] == name]
        if ref:
            _errorbar(ax, ref, x, y, scale, color=color, fmt=marker, markersize=13 if marker == "*" else 8,
                      label=name.replace("_", " "))


def _errorbar(ax, rows, x, y, scale, **kwargs):
    ax.errorbar([mean(r, x) * scale for r in rows], [mean(r, y) * scale for r in rows],
                xerr=[r[x]["std"] * scale for r in rows], yerr=[r[y]["std"] * scale for r in rows],
                elinewidth=0.5, capsize=0, linestyle="none", **kwargs)


def format_findings(found: Mapping[str, Any], columns: Sequence[tuple[str, str, int, float]],
                    prefixes: Sequence[str] | None = None) -> str:
    """Markdown table of `findings`: each method's best setting, its metrics and the entropy-bonus comparison."""
    header = ["method", "best setting", *(c[1] for c in columns), "beats the entropy bonus at equal accuracy?",
              f"published setting (ours: keys no source gives): {columns[0][1]} / {columns[1][1]}"]
    lines = []
    diversity = found.get("rule", {}).get("diversity", [None])[0]
    dscale = next((c[3] for c in columns if c[0] == diversity), 1.0)
    for method, entry in found.get("methods", {}).items():
        best, published = entry["best"], entry.get("published")
        pub = "-" if published is None else " / ".join(
            f"{scale * published[key]['mean']:.{digits}f}" for key, _, digits, scale in columns[:2])
        if published is not None and ours(method):
            pub += f" (ours: {setting_label(ours(method), prefixes)})"
        if best is None:
            lines.append([method, f"none of {entry['num_settings']} reaches the accuracy floor",
                          *(["-"] * len(columns)), "-", pub])
            continue
        cells = [method, setting_label(best["setting"], prefixes)]
        cells += [f"{scale * best[key]['mean']:.{digits}f}" for key, _, digits, scale in columns]
        vs = entry.get("vs_entropy_bonus")
        if vs is None:
            cells.append("(is the entropy bonus)")
        elif vs["beats"] is None:
            cells.append("no comparison point")
        else:
            against = f"{vs['against']['method']} {setting_label(vs['against']['setting'], prefixes)}"
            cells.append(f"{'yes' if vs['beats'] else 'no'} ({dscale * vs['difference']:+.2f} vs {against})")
        lines.append([*cells, pub])
    return _common.markdown_table(header, lines)
