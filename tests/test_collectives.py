"""`gather_rows` across 2 real gloo processes: different widths, both padding sides, mixed dtypes; and the global
Clip-Cov selection's k-th key across them.

The bug it guards against: accelerate's `pad_across_processes` adds a float pad value to an int mask, which turns
the mask into float32 on the one process that pads; gloo then aborts ("Received data size doesn't match expected
size"). That crashed ProGRPO from its second step whenever the processes' prompt widths differed.
"""

import os
import socket

import torch
import torch.multiprocessing as mp

from types import SimpleNamespace

from exploration_trl.ops.hashing import stream, unique_keys
from exploration_trl.trainers.components.collectives import gather_rows, pad_to
from exploration_trl.trainers.context import MethodContext
from exploration_trl.trainers.methods import cov_global as GlobalCovSelectionMixin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    from accelerate import PartialState

    state = PartialState(cpu=True)
    assert state.num_processes == 2
    width = 3 if rank == 0 else 5
    mask = torch.ones(2, width, dtype=torch.long)  # int mask, padded with a float pad value below
    logps = torch.full((2, width), -1.0 - rank, dtype=torch.bfloat16 if rank else torch.float32)
    prompt = torch.arange(width).repeat(2, 1) + 10 * rank
    flags = torch.tensor([True, rank == 1])
    # cov_selection: global's k-th smallest Clip-Cov key: each process holds half of the rows' keys.
    keys = unique_keys(torch.arange(64).view(8, 8)[rank * 4:(rank + 1) * 4], stream(7, 1))
    never = torch.iinfo(torch.int64).max
    candidates = (torch.arange(32).view(4, 8) + 32 * rank) % 3 != 0
    fake = MethodContext(SimpleNamespace(accelerator=SimpleNamespace(num_processes=2)))
    kth = {k: GlobalCovSelectionMixin._global_kth(fake, torch.where(candidates, keys, never).reshape(-1), k, False)
           for k in (1, 5, 21)}
    results = {
        "cut": torch.stack([(candidates & (keys <= t)).sum() for t in kth.values()]),
        "kth": torch.stack(list(kth.values())),
        "mask": gather_rows(mask, 2, pad_dim=1, pad_value=0.0),
        "logps": gather_rows(logps, 2, pad_dim=1),
        "prompt_left": gather_rows(prompt, 2, pad_dim=1, pad_value=-1, pad_side="left"),
        "flags": gather_rows(flags, 2),
        "rows": gather_rows(torch.tensor([float(rank)]), 2),
    }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_gather_rows_two_processes(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for key in r0:
        if key != "cut":
            assert torch.equal(r0[key], r1[key]), key  # every process sees the same global tensor
    # The k-th smallest key over both processes is the one process's k-th smallest (int64 keys travel exactly), and
    # the two processes together cut exactly k candidates (the float32 wire lost one; issue 38 item 8).
    keys = unique_keys(torch.arange(64).view(8, 8), stream(7, 1))
    candidates = torch.arange(64).view(8, 8) % 3 != 0
    alone = keys[candidates].sort().values
    assert r0["kth"].tolist() == [alone[k - 1].item() for k in (1, 5, 21)]
    assert (r0["cut"] + r1["cut"]).tolist() == [1, 5, 21]
    assert r0["mask"].dtype == torch.long
    assert r0["mask"].tolist() == [[1, 1, 1, 0, 0]] * 2 + [[1] * 5] * 2
    assert r0["logps"].dtype == torch.float32  # bf16 on one process, float32 on the other: float32 on the wire
    assert r0["logps"].tolist() == [[-1.0, -1.0, -1.0, 0.0, 0.0]] * 2 + [[-2.0] * 5] * 2
    # Prompts are left-padded: the last prompt token stays in the last column.
    assert r0["prompt_left"].tolist() == [[-1, -1, 0, 1, 2]] * 2 + [[10, 11, 12, 13, 14]] * 2
    assert r0["flags"].dtype == torch.bool and r0["flags"].tolist() == [True, False, True, True]
    assert r0["rows"].tolist() == [0.0, 1.0]


def test_single_process_gather_keeps_values_and_normalises_dtype():
    x = torch.tensor([[1.5, 2.5]], dtype=torch.bfloat16)
    out = gather_rows(x, 1, pad_dim=1)
    assert out.dtype == torch.float32 and out.tolist() == [[1.5, 2.5]]
    mask = torch.tensor([[1, 0]])
    assert gather_rows(mask, 1, pad_dim=1, pad_value=0.0).dtype == torch.long


def test_pad_to_sides_and_dtype():
    x = torch.tensor([[1, 2]], dtype=torch.long)
    assert pad_to(x, 4, 1, 0.0, "right").tolist() == [[1, 2, 0, 0]]
    assert pad_to(x, 4, 1, 9, "left").tolist() == [[9, 9, 1, 2]]
    assert pad_to(x, 4, 1, 0.0, "right").dtype == torch.long
    assert pad_to(x, 2, 1, 0, "left") is x
    try:
        pad_to(x, 4, 1, 0, "middle")
    except ValueError as e:
        assert "pad side must be one of right, left; got 'middle'" in str(e)
    else:
        raise AssertionError("no error for a bad pad side")
