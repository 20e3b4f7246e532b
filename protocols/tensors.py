"""torch tensors <-> the bytes that travel (bf16 on the wire, little endian)."""

from __future__ import annotations

import numpy as np
import torch


def bf16_to_bytes(t: torch.Tensor) -> bytes:
    """A 1-D bf16 tensor as 2 bytes per element."""
    if t.dtype != torch.bfloat16:
        raise TypeError(f"expected a bfloat16 tensor, got {t.dtype}")
    return t.detach().contiguous().reshape(-1).view(torch.int16).numpy().astype("<i2").tobytes()


def bytes_to_bf16(data: bytes, numel: int | None = None) -> torch.Tensor:
    """Inverse of `bf16_to_bytes`; checks the element count when `numel` is given."""
    if len(data) % 2:
        raise ValueError(f"{len(data)} bytes is not a whole number of bf16 values")
    if numel is not None and len(data) != 2 * numel:
        raise ValueError(f"expected {numel} bf16 values ({2 * numel} bytes), got {len(data)} bytes")
    raw = np.frombuffer(data, dtype="<i2").astype(np.int16)
    return torch.from_numpy(raw.copy()).view(torch.bfloat16)
