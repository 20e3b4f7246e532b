"""int8: blockwise absmax quantisation. Each block of `block` values carries one
float32 scale (max |x| / 127) and one signed byte per value: about 1 byte a
value. Deterministic: round half to even."""

from __future__ import annotations

import math

import numpy as np
from wccl.compression import Codec, CodecError, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class Int8(Codec):
    name = "int8"
    params = ("block",)

    def __init__(self, block: int = 256) -> None:
        if not isinstance(block, int) or not 1 <= block <= 1 << 20:
            raise CodecError(f"int8: block must be an integer in 1..{1 << 20}, got {block!r}")
        self.block = block

    def _blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block)

    def encoded_size(self, numel: int) -> int:
        return 4 * self._blocks(numel) + numel

    def encode(self, x: torch.Tensor) -> bytes:
        x = self._flat(x)
        n, nb = x.numel(), self._blocks(x.numel())
        padded = torch.zeros(nb * self.block, dtype=torch.float32)
        padded[:n] = x
        blocks = padded.view(nb, self.block)
        scale = blocks.abs().amax(dim=1) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8).reshape(-1)[:n]
        return scale.numpy().astype("<f4").tobytes() + q.numpy().tobytes()

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        nb = self._blocks(numel)
        scale = torch.from_numpy(np.frombuffer(data, dtype="<f4", count=nb).astype(np.float32))
        q = torch.from_numpy(np.frombuffer(data, dtype=np.int8, offset=4 * nb).astype(np.float32))
        per = scale.repeat_interleave(self.block)[:numel]
        return q * per
