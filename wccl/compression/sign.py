"""sign_ef: scaled sign with error feedback. One bit a value (its sign) and,
per block of `block` values, one float32 scale (the block's mean |x|): about
1.1 bits a value. What the sign drops is fed back into the next input
(ErrorFeedback), as in EF-SignSGD."""

from __future__ import annotations

import math

import numpy as np
from wccl.compression import Codec, CodecError, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class SignEF(Codec):
    name = "sign_ef"
    error_feedback = True
    params = ("block",)

    def __init__(self, block: int = 256) -> None:
        if not isinstance(block, int) or not 8 <= block <= 1 << 20 or block % 8:
            raise CodecError(f"sign_ef: block must be a multiple of 8 in 8..{1 << 20}, got {block!r}")
        self.block = block

    def _blocks(self, numel: int) -> int:
        return math.ceil(numel / self.block)

    def encoded_size(self, numel: int) -> int:
        return 4 * self._blocks(numel) + math.ceil(numel / 8)

    def encode(self, x: torch.Tensor) -> bytes:
        x = self._flat(x)
        n, nb = x.numel(), self._blocks(x.numel())
        if n == 0:
            return b""
        padded = torch.zeros(nb * self.block, dtype=torch.float32)
        padded[:n] = x
        counts = torch.full((nb,), float(self.block))
        counts[-1] = n - (nb - 1) * self.block
        scale = padded.view(nb, self.block).abs().sum(dim=1) / counts.clamp(min=1)
        bits = np.packbits((x >= 0).numpy(), bitorder="little")
        return scale.numpy().astype("<f4").tobytes() + bits.tobytes()

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        if numel == 0:
            return torch.zeros(0)
        nb = self._blocks(numel)
        scale = torch.from_numpy(np.frombuffer(data, dtype="<f4", count=nb).astype(np.float32))
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, offset=4 * nb), count=numel, bitorder="little")
        signs = torch.from_numpy(bits.astype(np.float32)) * 2.0 - 1.0
        return signs * scale.repeat_interleave(self.block)[:numel]
