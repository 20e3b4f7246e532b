"""bf16: bfloat16 (2 bytes a value, round to nearest even): the built-in run's wire format."""

from __future__ import annotations

import numpy as np
from wccl.compression import Codec, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


@REGISTRY.part("codec")
class Bf16(Codec):
    name = "bf16"

    def encoded_size(self, numel: int) -> int:
        return 2 * numel

    def encode(self, x: torch.Tensor) -> bytes:
        return self._flat(x).to(torch.bfloat16).view(torch.int16).numpy().astype("<i2", copy=False).tobytes()

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        raw = torch.from_numpy(np.frombuffer(data, dtype="<i2").astype(np.int16))
        return raw.view(torch.bfloat16).to(torch.float32)
