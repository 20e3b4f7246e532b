"""powersgd: a rank-r approximation in one round, with error feedback.

torch's PowerSGD hook all-reduces P, then Q: two rounds, each a screen-and-
camera latency. Here each rank factors its own tensor and sends both factors
at once: the values, zero-padded to an m x c matrix (m = ceil(sqrt(n))), are
approximated as P Q^T by `iters` steps of subspace iteration from a fixed
start (no warm start, so the codec stays pure), P orthonormal. P and Q travel
in bfloat16: 2r(m + c) bytes, about 4r / sqrt(n) bytes a value. Readers
rebuild P Q^T in float64 (products of bfloat16 values are exact), so every
rank decodes the same bits whatever its BLAS. What the rank-r view drops is
fed back (ErrorFeedback)."""

from __future__ import annotations

import math

import numpy as np
from wccl.compression import Codec, CodecError, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class PowerSGD(Codec):
    name = "powersgd"
    error_feedback = True
    params = ("rank", "iters")

    def __init__(self, rank: int = 4, iters: int = 2) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 256:
            raise CodecError(f"powersgd: rank must be an integer in 1..256, got {rank!r}")
        if isinstance(iters, bool) or not isinstance(iters, int) or not 1 <= iters <= 8:
            raise CodecError(f"powersgd: iters must be an integer in 1..8, got {iters!r}")
        self.rank, self.iters = rank, iters

    @staticmethod
    def _shape(numel: int) -> tuple[int, int]:
        m = max(1, math.isqrt(max(numel - 1, 0)) + 1)
        return m, max(1, math.ceil(numel / m))

    def _r(self, numel: int) -> int:
        m, c = self._shape(numel)
        return min(self.rank, m, c)

    def encoded_size(self, numel: int) -> int:
        if numel == 0:
            return 0
        m, c = self._shape(numel)
        return 2 * self._r(numel) * (m + c)

    def encode(self, x: torch.Tensor) -> bytes:
        x = self._flat(x)
        n = x.numel()
        if n == 0:
            return b""
        m, c = self._shape(n)
        r = self._r(n)
        mat = torch.zeros(m * c, dtype=torch.float32)
        mat[:n] = x
        mat = mat.view(m, c)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(c, r, generator=gen)
        p = torch.zeros(m, r)
        for _ in range(self.iters):
            p = torch.linalg.qr(mat @ q).Q
            q = mat.T @ p
        to = lambda t: t.contiguous().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()  # noqa: E731
        return to(p) + to(q)

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        if numel == 0:
            return torch.zeros(0)
        m, c = self._shape(numel)
        r = self._r(numel)
        raw = np.frombuffer(data, dtype="<i2").astype(np.int16)
        f = torch.from_numpy(raw).view(torch.bfloat16).to(torch.float64)
        p, q = f[:m * r].view(m, r), f[m * r:].view(c, r)
        # exact products, summed in float64 in a fixed order: the same bits on every machine
        out = torch.zeros(m, c, dtype=torch.float64)
        for j in range(r):
            out += torch.outer(p[:, j], q[:, j])
        return out.reshape(-1)[:numel].to(torch.float32)
