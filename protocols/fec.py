"""Inner error correction of one frame: interleaved Reed-Solomon over GF(256).

A frame of `frame_bytes` bytes holds `blocks` codewords of `n` bytes each
(`blocks * n <= frame_bytes`, at most 255), `nsym` parity bytes per codeword.
Codeword b owns the frame bytes b, b + blocks, b + 2*blocks, ...: a burst of
bad cells spreads over all codewords. The message (`capacity` bytes) is
spread the same way.

Soft decisions: the reader says how sure it is of each byte's cells, and a
codeword corrects `2*errors + erasures <= nsym`. Each codeword is decoded
first with its doubtful bytes as erasures (at most half its parity); one
that does not decode so is decoded again with more of its least sure bytes
erased, then fewer (Forney's generalised minimum distance decoding), each
try leaving `GUARD` parity bytes unerased so that a wrong correction stays
unlikely (and the frame's check catches the rest).

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


ERASE_BELOW = 0.15  # a byte read with less confidence than this is doubtful: a codeword's first try erases it
GUARD = 10  # parity bytes a retry leaves unerased: it still corrects 5 errors, a wrong correction ~1e-3


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

    def erasure_counts(self, doubtful: int) -> list[int]:
        """How many of a codeword's least sure bytes each try erases: first its `doubtful` ones (at most
        half its parity), then, if that fails, more and fewer of them down to none."""
        first = min(doubtful, self.nsym // 2)
        most = max(first, self.nsym - GUARD)
        out = [first]
        for e in (most, (first + most) // 2, first // 2, 0):
            if e not in out:
                out.append(e)
        return out

    def decode(self, frame: bytes, confidence: np.ndarray | None = None,
               erase_below: float = ERASE_BELOW) -> tuple[bytes, int]:
        """Correct `frame`; returns (message, corrected byte count). Raises UncorrectableFrame.

        `confidence`: per frame byte, how sure the reader is of it (0 to 1; None: every byte sure); bytes
        below `erase_below` are the doubtful ones a codeword's first try erases.
        """
        if len(frame) < self.frame_bytes:
            raise ValueError(f"frame must be {self.frame_bytes} bytes, got {len(frame)}")
        data = np.frombuffer(frame, np.uint8)
        order = self._order()
        if confidence is not None:
            confidence = np.asarray(confidence)
        msg = np.zeros((self.blocks, self.k), np.uint8)
        corrected = 0
        for b in range(self.blocks):
            word = bytearray(data[order[b]].tobytes())
            if not self.nsym:
                msg[b] = np.frombuffer(bytes(word), np.uint8)
                continue
            conf = None if confidence is None else confidence[order[b]]
            doubtful = np.flatnonzero(conf < erase_below) if conf is not None else np.zeros(0, np.intp)
            ranked = None  # the codeword's bytes, least sure first (sorted only when a try needs it)
            for e in self.erasure_counts(len(doubtful)) if conf is not None else [0]:
                if e == len(doubtful):
                    erase = doubtful.tolist()  # (the doubtful bytes are the e least sure)
                else:
                    if ranked is None:
                        ranked = np.argsort(conf, kind="stable")
                    erase = ranked[:e].tolist()
                try:
                    dec, _, errata = _codec(self.nsym, self.n).decode(
                        word, erase_pos=bytearray(erase) if erase else None)
                    break
                except ReedSolomonError:
                    continue
            else:
                raise UncorrectableFrame(f"block {b}: more errors than its {self.nsym} parity bytes correct")
            corrected += len(errata)
            msg[b] = np.frombuffer(bytes(dec), np.uint8)
        return msg.T.reshape(-1).tobytes(), corrected
