"""The link codec: a tensor's bytes <-> the cell symbols of the frames that carry it.

    tensor bytes --fountain (frames.fountain)--> transfer frame messages (protocols.transfer)
      --Reed-Solomon (fec.FrameCode)--> frame bytes --scrambler--> cell symbols (layout)

and back: symbols (+ per-cell confidence) --> bytes with doubtful ones
erased --> corrected message --> checked transfer frame --> (an assembler) tensor.

The scrambler XORs every frame with a fixed pseudo-random sequence so that
the cells of any frame look random (no large uniform patches, every colour
everywhere: the reader's colour model relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from protocols import cells, fec, frames, streams, transfer
from protocols.adapt import split
from protocols.layout import GridLayout
from protocols.security import NO_KEY, RoomKey


@dataclass(frozen=True)
class LinkCodec:
    layout: GridLayout
    code_rate: float = 0.8
    code: fec.FrameCode = field(init=False, repr=False)
    _whitening: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", fec.FrameCode(self.layout.frame_bytes, self.code_rate))
        transfer.packet_size_for(self.code.capacity, 0)  # raises if a frame is too small for any packet
        key = np.random.default_rng(0x5CA1AB1E).integers(0, 256, self.layout.frame_bytes, dtype=np.uint8)
        object.__setattr__(self, "_whitening", key)

    @property
    def message_bytes(self) -> int:
        return self.code.capacity

    def packet_size(self, ranks: int = 0) -> int:
        """The packet (payload id + fountain symbol) of a frame in this layout that carries the
        acknowledgements and holdings of `ranks` ranks (a group's size; 0: the largest any frame holds)."""
        return transfer.packet_size_for(self.message_bytes, ranks)

    @property
    def payload_per_frame(self) -> int:
        """Tensor bytes a frame without per-rank entries carries (a fountain symbol): the most any carries."""
        return self.packet_size() - frames.PAYLOAD_ID_BYTES

    def margin(self, wrong: int) -> float:
        """The share of this code's error correction a frame read with `wrong` cells wrong left unused: 1
        for a clean read, 0 (or less) for one at the edge of what the code corrects (a wrong cell spoils
        about one byte; each Reed-Solomon block corrects nsym / 2 wrong bytes, more when the reader's
        confidence marks them as erasures)."""
        correctable = self.code.blocks * (self.code.nsym // 2)
        return 1.0 - wrong / correctable if correctable else (1.0 if wrong == 0 else 0.0)

    def frames_needed(self, nbytes: int, ranks: int = 0) -> int:
        """Frames (source packets) a transfer of `nbytes` sent bytes needs at the least (`ranks`: the
        ranks whose entries its frames carry)."""
        return frames.source_packets(nbytes, self.packet_size(ranks))

    def in_part(self, part: int) -> LinkCodec:
        """This codec with its layout drawn on part `part` of the screen (protocols.layout.PARTS); itself (the
        whole) where the grid left is too small for a frame."""
        key = (self.layout, self.code_rate, part)
        if key not in _PARTS:
            lay = self.layout.in_part(part)
            try:
                _PARTS[key] = self if lay is None or lay == self.layout else replace(self, layout=lay)
            except ValueError:
                _PARTS[key] = self
        return _PARTS[key]

    def _scramble(self, frame: bytes) -> bytes:
        return (np.frombuffer(frame, np.uint8) ^ self._whitening).tobytes()

    def encode_message(self, message: bytes) -> bytes:
        """Frame bytes (what `layout.render` draws) for a message of `message_bytes` bytes: its
        Reed-Solomon code, scrambled."""
        return self._scramble(self.code.encode(message))

    def encode(self, data: bytes, *, count: int, session: int, sender: int, stream: str, step: int,
               epoch: int = 0, base: int = 0, key: RoomKey = NO_KEY, run_nonce: int = 1, ranks: int = 0,
               tid: int = 1) -> list[bytes]:
        """`count` frames' bytes (what `layout.render` draws) of one of the built-in run's tensors as its
        sender's transfer `tid` (protocols.streams: its envelope, sealed under `key`; for every reader;
        packets sized for frames carrying `ranks` ranks' entries, though these carry none; timing fields
        zero). Fewer than the transfer needs if `count` is smaller: then it cannot be rebuilt."""
        payload = streams.wrap(epoch, base, data)
        header = transfer.TransferHeader(session, sender, tid, step, stream, "uint8", len(payload), 0, b"")
        out = transfer.outgoing(header, payload, message_bytes=self.message_bytes, ranks=ranks, key=key,
                                run_nonce=run_nonce, count=count)
        return [self.encode_message(out.message(i, message_bytes=self.message_bytes, run_nonce=run_nonce, key=key))
                for i in range(count)]

    def decode(self, symbols: np.ndarray, confidence: np.ndarray | None = None,
               erase_below: float = fec.ERASE_BELOW, key: RoomKey = NO_KEY) -> tuple[transfer.TransferFrame, int]:
        """One frame's data-cell symbols -> (trusted transfer frame, cells that were wrong).

        Raises fec.UncorrectableFrame or frames.FrameError; never returns an unchecked frame.
        """
        message, wrong = self.decode_message(symbols, confidence, erase_below)
        return transfer.parse_message(message, key), wrong

    def decode_message(self, symbols: np.ndarray, confidence: np.ndarray | None = None,
                       erase_below: float = fec.ERASE_BELOW) -> tuple[bytes, int]:
        """One frame's data-cell symbols -> (error-corrected message, cells that were wrong).

        The message is not checked yet: parse it with transfer.parse_message. Raises fec.UncorrectableFrame.
        """
        symbols = np.asarray(symbols)
        if (symbols.dtype.kind not in "ui" or symbols.ndim != 1 or symbols.size != self.layout.n_data
                or (symbols.size and (int(symbols.min()) < 0 or int(symbols.max()) >= self.layout.colours))):
            raise fec.UncorrectableFrame(f"not this layout's cells: {symbols.dtype} {symbols.shape}, "
                                         f"expected {self.layout.n_data} symbols < {self.layout.colours}")
        raw = cells.symbols_to_bytes(symbols, self.layout.colours, self.layout.frame_bytes)
        byte_conf = None
        if confidence is not None and np.shape(confidence) != symbols.shape:
            confidence = None  # a confidence that does not fit: read the cells as sure
        if confidence is not None and self.code.nsym:
            conf = np.nan_to_num(np.asarray(confidence, np.float32), nan=0.0)
            bits = cells.bits_per_cell(self.layout.colours)
            # byte j spans bits 8j..8j+7: cells (8j)//bits .. (8j+7)//bits; its confidence is their minimum
            j = np.arange(self.layout.frame_bytes)
            first, last = (8 * j) // bits, np.minimum((8 * j + 7) // bits, len(conf) - 1)
            byte_conf = np.minimum(conf[first], conf[last])
            if bits == 3:
                byte_conf = np.minimum(byte_conf, conf[np.minimum(first + 1, len(conf) - 1)])
        message, corrected = self.code.decode(self._scramble(raw), byte_conf, erase_below)
        wrong = 0
        if corrected:
            # What the cells should have been, now that the frame is known: the raw cell error count.
            truth = cells.bytes_to_symbols(self._scramble(self.code.encode(message)), self.layout.colours,
                                           self.layout.n_data)
            wrong = int(np.count_nonzero(truth != np.asarray(symbols)))
        return message, wrong


_PARTS: dict[tuple, LinkCodec] = {}  # LinkCodec.in_part's answers


def in_ladder(ladder: list[tuple[LinkCodec, float]], ask: int) -> tuple[LinkCodec, float]:
    """The layout (codec, hold) an ask's byte names in `ladder` (protocols.adapt.ask): its ladder layout (the
    last one for one past it) on its part of the screen (the whole where that part is too small)."""
    k, part = split(ask)
    codec, hold = ladder[min(k, len(ladder) - 1)]
    return codec.in_part(part), hold
