"""The FSDP2 path of `head_weights` (the policy's LM head, `LMHead.weights`), on CPU with 2 gloo processes.

accelerate 1.15 enables FSDP only for accelerator device types (with `use_cpu: true` it silently runs DDP), so no
test here runs a whole FSDP2 training. This one checks the piece the package owns: an LM head sharded as a DTensor
(as `fully_shard` leaves it) is handed to the chunked kernels as the full weight, and CaSP-style candidate
log-probs computed through it give the sharded parameter exactly the gradient of an unsharded head.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB, HIDDEN, ROWS = 40, 8, 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from exploration_trl.ops.lm_head import candidate_logps
    from exploration_trl.boundary.capture import head_weights

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same full weight, hidden states and candidates on both ranks
        full = torch.randn(VOCAB, HIDDEN)
        hidden = torch.randn(ROWS, HIDDEN)
        ids = torch.randint(0, VOCAB, (ROWS, 3))

        head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        mesh = init_device_mesh("cpu", (world,))
        head.weight = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
        assert isinstance(head.weight, DTensor) and head.weight.to_local().shape[0] == VOCAB // world
        with head_weights(head) as (weight, bias, regather):
            assert not isinstance(weight, DTensor) and weight.shape == (VOCAB, HIDDEN)
            assert torch.equal(weight.detach(), full) and bias is None
            logps = candidate_logps(hidden, weight, bias, ids, temperature=0.7, chunk_rows=4, regather=regather)
            logps.sum().backward()
        sharded_grad = head.weight.grad.full_tensor()

        reference = full.clone().requires_grad_(True)
        candidate_logps(hidden, reference, None, ids, temperature=0.7, chunk_rows=4).sum().backward()
        if rank == 0:
            torch.save({"sharded": sharded_grad, "reference": reference.grad, "logps": logps.detach()}, out)
    finally:
        dist.destroy_process_group()


def test_dtensor_head_is_projected_whole_and_its_shards_get_the_unsharded_gradient(tmp_path):
    out = str(tmp_path / "grads.pt")
    mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, join=True, start_method="spawn")
    result = torch.load(out)
    assert torch.isfinite(result["logps"]).all() and (result["logps"] < 0).all()
    assert result["reference"].abs().sum() > 0
    torch.testing.assert_close(result["sharded"], result["reference"], rtol=0, atol=1e-6)
