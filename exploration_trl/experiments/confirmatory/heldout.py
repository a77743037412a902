"""The confirmatory held-out split: whole multisets of numbers are held out, so no held-out problem's numbers appear
in training under any target.

A multiset belongs to the held-out side when `sha256("<salt>:<sorted numbers>")`, read as a fraction of 2**256, is
below `share`: fixed by the salt alone (not by a seed or by any result), and the same on every machine. Every
`(multiset, reachable target)` of a held-out multiset is a held-out problem; the evaluation set is the first
`num_problems` of them in a salted-hash order. The training problems are drawn, as `task.make_problems` draws them,
from the problems of the other multisets only.

The second protocol also sets a *selection* split aside (`selection`: its own salt and share): multisets that are
neither held out nor used for training (SFT included), on which the tuned settings are chosen, so that the data
that chooses a setting is never the data that gives its verdict.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

from ..countdown_tiny import task


def multiset_key(nums) -> str:
    return ",".join(str(n) for n in sorted(int(x) for x in nums))


def _fraction(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) / 2**256


def is_heldout(nums, salt: str, share: float) -> bool:
    return _fraction(f"{salt}:{multiset_key(nums)}") < share


def make_split(data, seed: int, salt: str, share: float, num_problems: int,
               selection: dict | None = None) -> tuple[list[dict], list[dict], dict]:
    """`(train, heldout, info)`: `data` is a `task.DataSettings` (its `num_train` training problems, with SFT texts,
    drawn with `seed`), `heldout` the first `num_problems` problems of the held-out multisets. With `selection`
    (`{salt, share, num_problems}`), the multisets it draws are left out of training too, and `info["selection"]`
    holds its first `num_problems` problems (`selection_problems`)."""
    rng = random.Random(seed)
    tables, train_keys, held_keys, select_keys = {}, [], [], []
    n_held_sets = n_sets = n_select_sets = 0
    for nums in itertools.combinations_with_replacement(range(1, data.max_num + 1), data.numbers_per_problem):
        table = task._table(nums)
        reachable = sorted({int(v) for v, _, _ in table if v.denominator == 1 and 1 <= v <= data.max_target})
        held = is_heldout(nums, salt, share)
        chosen = (not held and selection is not None
                  and is_heldout(nums, selection["salt"], float(selection["share"])))
        n_sets += 1
        n_held_sets += held
        n_select_sets += chosen
        if held:
            held_keys += [(nums, t) for t in reachable]
        elif chosen:
            select_keys += [(nums, t) for t in reachable]
        else:
            tables[nums] = table
            train_keys += [(nums, t) for t in reachable]
    if len(held_keys) < num_problems:
        raise ValueError(f"heldout: only {len(held_keys)} held-out problems with share {share}; raise share or lower "
                         f"num_problems ({num_problems})")
    if len(train_keys) < data.num_train:
        raise ValueError(f"data.num_train is {data.num_train} but only {len(train_keys)} training problems remain")
    held_keys.sort(key=lambda k: _fraction(f"{salt}:order:{multiset_key(k[0])}:{k[1]}"))
    rng.shuffle(train_keys)
    train_keys = train_keys[:data.num_train]

    def build_train(key) -> dict:
        nums, target = key
        shown = list(nums)
        rng.shuffle(shown)
        hits = [(m, f) for v, m, f in tables[nums] if v == target]
        forms = sorted({m for m, _ in hits} | {f for _, f in hits})
        rng.shuffle(forms)
        return {"nums": shown, "target": target, "solutions": sorted({m for m, _ in hits}),
                "sft_texts": forms[:data.solutions_per_problem]}

    order = random.Random(f"{salt}:shown")
    heldout = []
    for nums, target in held_keys[:num_problems]:
        shown = list(nums)
        order.shuffle(shown)
        heldout.append({"nums": shown, "target": target})
    train = [build_train(k) for k in train_keys]
    train_sets = {multiset_key(p["nums"]) for p in train}
    held_sets = {multiset_key(p["nums"]) for p in heldout}
    info = {"salt": salt, "share": share, "multisets": n_sets, "heldout_multisets": n_held_sets,
            "heldout_problems_available": len(held_keys), "n_problems": len(heldout),
            "heldout_multisets_evaluated": len(held_sets), "num_train": len(train),
            "disjoint_from_training": not (train_sets & held_sets),
            "checksum": _checksum(heldout)}
    assert info["disjoint_from_training"]
    if selection is not None:
        wanted = int(selection["num_problems"])
        if len(select_keys) < wanted:
            raise ValueError(f"selection: only {len(select_keys)} selection problems with share {selection['share']}; "
                             f"raise share or lower num_problems ({wanted})")
        select_keys.sort(key=lambda k: _fraction(f"{selection['salt']}:order:{multiset_key(k[0])}:{k[1]}"))
        shown = random.Random(f"{selection['salt']}:shown")
        chosen_problems = []
        for nums, target in select_keys[:wanted]:
            order = list(nums)
            shown.shuffle(order)
            chosen_problems.append({"nums": order, "target": target})
        select_sets = {multiset_key(p["nums"]) for p in chosen_problems}
        info["selection"] = {"salt": selection["salt"], "share": float(selection["share"]),
                             "multisets": n_select_sets, "n_problems": len(chosen_problems),
                             "multisets_evaluated": len(select_sets),
                             "disjoint_from_training": not (select_sets & train_sets),
                             "disjoint_from_heldout": not (select_sets & held_sets),
                             "checksum": _checksum(chosen_problems), "problems": chosen_problems}
        assert info["selection"]["disjoint_from_training"] and info["selection"]["disjoint_from_heldout"]
    return train, heldout, info


def _checksum(problems: list[dict]) -> str:
    return hashlib.sha256(repr([(p["nums"], p["target"]) for p in problems]).encode()).hexdigest()


def selection_problems(info: dict) -> list[dict]:
    """The selection split's problems (from `make_split`'s `info`), or a one-line error when there is none."""
    if "selection" not in info:
        raise ValueError("this set-up has no selection split: add `selection: {salt, share, num_problems}` to it")
    return info["selection"]["problems"]


def benchmark(heldout: list[dict], name: str) -> Any:
    """The held-out problems as the trainer's `Benchmark` (`countdown` reward)."""
    bench = task.heldout_benchmark(heldout, len(heldout))
    bench.name = name
    return bench
