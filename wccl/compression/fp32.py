"""fp32: the values as they are (4 bytes each, little endian)."""

from __future__ import annotations

import numpy as np
from wccl.compression import Codec, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class Fp32(Codec):
    name = "fp32"

    def encoded_size(self, numel: int) -> int:
        return 4 * numel

    def encode(self, x: torch.Tensor) -> bytes:
        return self._flat(x).numpy().astype("<f4", copy=False).tobytes()

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))
