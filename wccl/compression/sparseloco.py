"""sparseloco: the largest values of each chunk, two bits each, with error feedback (SparseLoCo).

The flat tensor is cut into chunks of `chunk` values (the last may be
shorter); each chunk sends its k = ceil(ratio x length) largest magnitudes.
A kept value travels as its offset in the chunk (ceil(log2 chunk) bits: 12
for 4,096) and two bits: its sign, and whether it is in the larger or the
smaller half of the chunk's kept magnitudes. Each chunk also sends those two
halves' mean magnitudes (float16 each), which is what a reader puts back. At
ratio 0.02 and chunk 4,096 that is about 0.30 bits a value, about 107x fewer
bytes than fp32 and 3.7x fewer than sign_ef. Everything not sent, and what the
two levels round, stays in the residual (ErrorFeedback), as SparseLoCo's
error feedback does for the outer change of local steps."""

from __future__ import annotations

import math

import numpy as np
from wccl.compression import Codec, CodecError, torch  # torch: loaded on first use
from protocols.registry import REGISTRY


F16_MAX = 65504.0  # the largest finite float16


@REGISTRY.part("codec")
class SparseLoCo(Codec):
    name = "sparseloco"
    error_feedback = True
    params = ("ratio", "chunk")

    def __init__(self, ratio: float = 0.02, chunk: int = 4096) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise CodecError(f"sparseloco: ratio must be in (0, 1], got {ratio!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 2 <= chunk <= 1 << 20:
            raise CodecError(f"sparseloco: chunk must be an integer in 2..{1 << 20}, got {chunk!r}")
        self.ratio, self.chunk = float(ratio), chunk
        self.offset_bits = math.ceil(math.log2(chunk))

    def _kept(self, m: int) -> int:
        """How many of a chunk of `m` values travel."""
        return min(m, max(1, math.ceil(self.ratio * m)))

    def _chunks(self, numel: int) -> tuple[np.ndarray, np.ndarray]:
        """(length, kept) of each chunk, as arrays."""
        full, rest = divmod(numel, self.chunk)
        lengths = np.array([self.chunk] * full + ([rest] if rest else []), dtype=np.int64)
        kept = np.array([self._kept(self.chunk)] * full + ([self._kept(rest)] if rest else []), dtype=np.int64)
        return lengths, kept

    def encoded_size(self, numel: int) -> int:
        lengths, kept = self._chunks(numel)
        return 4 * len(lengths) + math.ceil(int(kept.sum()) * (self.offset_bits + 2) / 8)

    def encode(self, x: torch.Tensor) -> bytes:
        x = self._flat(x)
        n = x.numel()
        if n == 0:
            return b""
        full, rest = divmod(n, self.chunk)
        parts = []  # (scales, offsets, signs, high) of the full chunks, then of the shorter last one
        if full:
            parts.append(self._chunks_of(x[:full * self.chunk].view(full, self.chunk), self._kept(self.chunk)))
        if rest:
            parts.append(self._chunks_of(x[full * self.chunk:].view(1, rest), self._kept(rest)))
        scales = np.concatenate([p[0] for p in parts])
        off, sign, high = (np.concatenate([p[i].reshape(-1) for p in parts]) for i in (1, 2, 3))
        shifts = np.arange(self.offset_bits - 1, -1, -1)
        bits = np.concatenate([(off.astype(np.int64)[:, None] >> shifts) & 1, sign[:, None], high[:, None]],
                              axis=1).astype(np.uint8)
        return scales.astype("<f2").tobytes() + np.packbits(bits.reshape(-1)).tobytes()

    @staticmethod
    def _chunks_of(rows: torch.Tensor, k: int) -> tuple[np.ndarray, ...]:
        """Rows of equal length, k kept from each: (their two levels, offsets ascending, sign bits, high bits)."""
        # stable: among equal magnitudes the lower offset wins, the same on every machine
        by_size = torch.sort(rows.abs(), dim=1, descending=True, stable=True).indices[:, :k]  # largest first
        top = (k + 1) // 2  # the larger half: the first ceil(k/2) by magnitude
        a = rows.gather(1, by_size).abs()
        hi = a[:, :top].mean(dim=1).clamp(max=F16_MAX)  # a larger change: the rest stays in the residual
        lo = a[:, top:].mean(dim=1).clamp(max=F16_MAX) if k > top else hi
        keep = torch.sort(by_size, dim=1, stable=True)
        signs = rows.gather(1, keep.values) >= 0
        return (torch.stack([hi, lo], dim=1).numpy(), keep.values.numpy(), signs.numpy(),
                (keep.indices < top).numpy())

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        self._check(data, numel)
        out = torch.zeros(numel, dtype=torch.float32)
        if numel == 0:
            return out
        lengths, kept = self._chunks(numel)
        scales = np.frombuffer(data, dtype="<f2", count=2 * len(lengths)).astype(np.float32).reshape(-1, 2)
        if (scales < 0).any():
            raise CodecError("sparseloco: a chunk's magnitude is negative")
        total, width = int(kept.sum()), self.offset_bits + 2
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, offset=4 * len(lengths)),
                             count=total * width).reshape(total, width).astype(np.int64)
        off = (bits[:, :self.offset_bits] << np.arange(self.offset_bits - 1, -1, -1)).sum(axis=1)
        sign = bits[:, -2] * 2 - 1
        level = np.where(bits[:, -1] == 1, 0, 1)
        row = np.repeat(np.arange(len(lengths)), kept)  # each kept value's chunk
        first = np.r_[True, row[1:] != row[:-1]]
        if (off >= lengths[row]).any() or (np.diff(off)[~first[1:]] <= 0).any():
            raise CodecError(f"sparseloco: offsets out of order or beyond their chunk of {numel} values")
        vals = sign * scales[row, level]
        out[torch.from_numpy(row * self.chunk + off)] = torch.from_numpy(vals.astype(np.float32))
        return out
