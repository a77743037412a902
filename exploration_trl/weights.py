"""Did training change the model? Measured without copying it, on every engine (a ZeRO-3 shard, an FSDP2 DTensor
or a plain tensor), so `exploration-trl train` and the demo can say so when it did not."""

from __future__ import annotations

__all__ = ["weights_changed", "weights_fingerprint"]


def weights_fingerprint(model):
    """Per trainable parameter, the float64 sum and L1 norm of this process's part of it (under ZeRO-3, its shard):
    two numbers a tensor, enough to tell whether training changed any weight without copying the model."""
    import torch

    rows = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        t = getattr(p, "ds_tensor", None)
        t = (p.to_local() if hasattr(p, "to_local") else p) if t is None else t
        t = t.detach()
        rows.append(torch.stack([t.sum(dtype=torch.float64), torch.linalg.vector_norm(t, ord=1, dtype=torch.float64)])
                    if t.numel() else torch.zeros(2, dtype=torch.float64, device=t.device))
    return torch.stack(rows).cpu() if rows else torch.zeros(0, 2, dtype=torch.float64)


def weights_changed(trainer, before) -> bool | None:
    """Did training change any trainable weight on any process? (A collective: every process calls it.)"""
    import torch

    after = weights_fingerprint(trainer.model)
    local = 2.0 if after.shape != before.shape else float(not torch.equal(after, before))
    verdict = trainer.accelerator.reduce(torch.tensor([local], device=trainer.accelerator.device), reduction="max")
    value = verdict.item()
    return None if value >= 2.0 else bool(value)
