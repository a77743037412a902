"""Counter-based hashing on int64 tensors: random-looking numbers computed on the device from their coordinates.

A key drawn this way depends only on what it is a key of (a seed, a step, a token's place), never on a generator's
state or on how the batch is split over processes and micro-batches, and it needs no host round trip. Integer
arithmetic wraps (two's complement) identically on every device, so CPU and CUDA agree bit for bit.
"""

from __future__ import annotations

import torch

#: SplitMix64's constants as signed 64-bit integers (torch has no uint64 arithmetic).
_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15
_MUL1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_MUL2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 `x` (torch's `>>` is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser, elementwise on int64: a bijection whose every output bit depends on every input bit."""
    x = x ^ shr(x, 30)
    x = x * _MUL1
    x = x ^ shr(x, 27)
    x = x * _MUL2
    return x ^ shr(x, 31)


def mix64_int(x: int) -> int:
    """`mix64` of one Python integer (taken modulo 2^64), as a signed 64-bit integer: for host-side coordinates."""
    x &= _MASK64
    x ^= x >> 30
    x = (x * (_MUL1 & _MASK64)) & _MASK64
    x ^= x >> 27
    x = (x * (_MUL2 & _MASK64)) & _MASK64
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def stream(*coordinates: int) -> int:
    """One signed 64-bit value from host-side coordinates (e.g. seed and step), to offset a tensor's keys."""
    h = 0
    for c in coordinates:
        h = mix64_int((h + _GOLDEN + int(c)) & _MASK64)
    return h


#: `unique_keys` keeps the token's own id in the low bits, so the keys of distinct tokens never tie.
ID_BITS = 31


def unique_keys(ids: torch.Tensor, offset: int) -> torch.Tensor:
    """Non-negative int64 keys, uniformly ordered at random, one per id in `ids` (int64, each in [0, 2^ID_BITS)).

    The high bits hash `(offset, id)`; the low `ID_BITS` are the id itself, so distinct ids give distinct keys and
    the smallest n keys of a set are always exactly n tokens (no ties, no rounding: integers travel exactly).
    """
    random = shr(mix64(ids * _GOLDEN + offset), 64 - (62 - ID_BITS))  # the top 62 - ID_BITS bits
    return (random << ID_BITS) | ids
