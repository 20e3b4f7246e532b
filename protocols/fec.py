"""Inner error correction of one frame: interleaved Reed-Solomon over GF(256).

A frame of `frame_bytes` bytes holds `blocks` codewords of `n` bytes each
(`blocks * n <= frame_bytes`, at most 255), `nsym` parity bytes per codeword.
Codeword b owns the frame bytes b, b + blocks, b + 2*blocks, ...: a burst of
bad cells spreads over all codewords. The message (`capacity` bytes) is
spread the same way. Bytes whose cells the reader doubts are passed as
erasures: a codeword corrects `2*errors + erasures <= nsym`.

Uses the compiled codec of reedsolo >= 2 (`creedsolo`) when present, else the
pure-Python one (about 30x slower: fine for tests, not for a camera).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

try:  # the compiled codec of reedsolo 2.x
    import creedsolo as _rs

    COMPILED = True
except ImportError:  # pragma: no cover - depends on the install
    import reedsolo as _rs

    COMPILED = False

ReedSolomonError = _rs.ReedSolomonError


class UncorrectableFrame(ValueError):
    """More errors than the code can correct (detected, never delivered)."""


@lru_cache(maxsize=64)
def _codec(nsym: int, n: int):
    return _rs.RSCodec(nsym, nsize=n)


@dataclass(frozen=True, slots=True)
class FrameCode:
    frame_bytes: int
    code_rate: float

    def __post_init__(self) -> None:
        if not 0.2 <= self.code_rate <= 1.0:
            raise ValueError(f"code_rate must be within [0.2, 1.0], got {self.code_rate}")
        if self.frame_bytes < 8:
            raise ValueError("a frame needs at least 8 bytes")

    @property
    def blocks(self) -> int:
        return -(-self.frame_bytes // 255)

    @property
    def n(self) -> int:
        return self.frame_bytes // self.blocks

    @property
    def nsym(self) -> int:
        if self.code_rate >= 1.0:
            return 0
        return max(2, int(round(self.n * (1.0 - self.code_rate))) // 2 * 2)

    @property
    def k(self) -> int:
        return self.n - self.nsym

    @property
    def capacity(self) -> int:
        """Message bytes a frame carries."""
        return self.blocks * self.k

    def _order(self) -> np.ndarray:
        # frame position of (block b, index i) = i * blocks + b
        return (np.arange(self.n)[None, :] * self.blocks + np.arange(self.blocks)[:, None])

    def encode(self, message: bytes) -> bytes:
        """`message` (exactly `capacity` bytes) -> `frame_bytes` bytes."""
        if len(message) != self.capacity:
            raise ValueError(f"message must be {self.capacity} bytes, got {len(message)}")
        msg = np.frombuffer(message, np.uint8).reshape(self.k, self.blocks).T  # message byte j -> block j % blocks
        out = np.zeros(self.frame_bytes, np.uint8)
        order = self._order()
        for b in range(self.blocks):
            word = msg[b].tobytes()
            if self.nsym:
                word = bytes(_codec(self.nsym, self.n).encode(bytearray(word)))
            out[order[b]] = np.frombuffer(word, np.uint8)
        return out.tobytes()

    def decode(self, frame: bytes, erasures: np.ndarray | None = None) -> tuple[bytes, int]:
        """Correct `frame`; returns (message, corrected byte count). Raises UncorrectableFrame.

        `erasures`: boolean per frame byte, True where the byte is doubtful.
        """
        if len(frame) < self.frame_bytes:
            raise ValueError(f"frame must be {self.frame_bytes} bytes, got {len(frame)}")
        data = np.frombuffer(frame, np.uint8)
        order = self._order()
        msg = np.zeros((self.blocks, self.k), np.uint8)
        corrected = 0
        for b in range(self.blocks):
            word = bytearray(data[order[b]].tobytes())
            if not self.nsym:
                msg[b] = np.frombuffer(bytes(word), np.uint8)
                continue
            erase = []
            if erasures is not None:
                erase = np.flatnonzero(erasures[order[b]]).tolist()
                if len(erase) > self.nsym:
                    raise UncorrectableFrame(f"block {b}: {len(erase)} erasures > {self.nsym}")
            try:
                dec, _, errata = _codec(self.nsym, self.n).decode(word, erase_pos=bytearray(erase) if erase else None)
            except ReedSolomonError as e:
                raise UncorrectableFrame(f"block {b}: {e}") from None
            corrected += len(errata)
            msg[b] = np.frombuffer(bytes(dec), np.uint8)
        return msg.T.reshape(-1).tobytes(), corrected
