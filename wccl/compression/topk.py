"""topk_ef: the k largest values by magnitude, with error feedback.

k = ceil(ratio x numel). Sent: one float32 scale, the k indices (ascending;
uint16 when numel <= 65,536, else uint32) and k int8 values (value / scale,
scale = max |kept| / 127). At ratio 0.01 and more than 65,536 values that is
0.05 bytes a value, 40x fewer than bf16. Everything not sent, and the
rounding of what is, stays in the residual (ErrorFeedback)."""

from __future__ import annotations

import math

import numpy as np
from wccl.compression import Codec, CodecError, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class TopKEF(Codec):
    name = "topk_ef"
    error_feedback = True
    params = ("ratio",)

    def __init__(self, ratio: float = 0.01) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise CodecError(f"topk_ef: ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    def k(self, numel: int) -> int:
        return min(numel, max(1, math.ceil(self.ratio * numel))) if numel else 0

    @staticmethod
    def _index_dtype(numel: int) -> str:
        return "<u2" if numel <= 1 << 16 else "<u4"

    def encoded_size(self, numel: int) -> int:
        k = self.k(numel)
        return 4 + k * (np.dtype(self._index_dtype(numel)).itemsize + 1) if numel else 0

    def encode(self, x: torch.Tensor) -> bytes:
        x = self._flat(x)
        n = x.numel()
        if n == 0:
            return b""
        k = self.k(n)
        # stable: among equal magnitudes the lower index wins, the same on every machine
        order = torch.sort(x.abs(), descending=True, stable=True).indices[:k]
        idx = torch.sort(order).values
        vals = x[idx]
        scale = vals.abs().max() / 127.0
        safe = scale if scale > 0 else torch.tensor(1.0)
        q = torch.round(vals / safe).clamp_(-127, 127).to(torch.int8)
        return (np.array([scale.item()], dtype="<f4").tobytes()
                + idx.numpy().astype(self._index_dtype(n)).tobytes() + q.numpy().tobytes())

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        out = torch.zeros(numel, dtype=torch.float32)
        if numel == 0:
            return out
        k, dt = self.k(numel), self._index_dtype(numel)
        scale = float(np.frombuffer(data, dtype="<f4", count=1)[0])
        idx = np.frombuffer(data, dtype=dt, count=k, offset=4).astype(np.int64)
        if idx.size and (idx.max() >= numel or (np.diff(idx) <= 0).any()):
            raise CodecError(f"topk_ef: indices out of order or beyond {numel} values")
        q = np.frombuffer(data, dtype=np.int8, count=k, offset=4 + k * np.dtype(dt).itemsize)
        out[torch.from_numpy(idx)] = torch.from_numpy(q.astype(np.float32)) * scale
        return out
