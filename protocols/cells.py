"""Cell colour codec: bytes <-> symbols (one per cell) <-> colours.

A cell carries `bits_per_cell = log2(colours)` bits. Colours are corners of
the RGB cube, chosen to be as far apart as possible for the count:
2 -> black/white, 4 -> black/yellow/magenta/cyan (a regular tetrahedron),
8 -> all eight corners. Colours are given in BGR order (OpenCV's).
"""

from __future__ import annotations

import numpy as np

_CORNERS_RGB = {
    2: [(0, 0, 0), (1, 1, 1)],
    4: [(0, 0, 0), (1, 1, 0), (1, 0, 1), (0, 1, 1)],
    8: [(r, g, b) for r in (0, 1) for g in (0, 1) for b in (0, 1)],
}

SUPPORTED_COLOURS = tuple(sorted(_CORNERS_RGB))


def bits_per_cell(colours: int) -> int:
    if colours not in _CORNERS_RGB:
        raise ValueError(f"colours must be one of {SUPPORTED_COLOURS}, got {colours}")
    return colours.bit_length() - 1


def palette_bgr(colours: int, level: int = 255) -> np.ndarray:
    """The `colours` x 3 uint8 BGR palette; symbol i is drawn with row i."""
    bits_per_cell(colours)
    rgb = np.array(_CORNERS_RGB[colours], dtype=np.uint8) * np.uint8(level)
    return np.ascontiguousarray(rgb[:, ::-1])


def bytes_to_symbols(data: bytes, colours: int, cells: int) -> np.ndarray:
    """Spread `data` over `cells` symbols (most significant bit first), zero padded.

    Raises ValueError when the data does not fit.
    """
    bits = bits_per_cell(colours)
    capacity = cells * bits // 8
    if len(data) > capacity:
        raise ValueError(f"{len(data)} bytes do not fit in {cells} cells of {bits} bits ({capacity} bytes)")
    bitstream = np.zeros(cells * bits, dtype=np.uint8)
    unpacked = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    bitstream[: unpacked.size] = unpacked
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (bitstream.reshape(cells, bits) * weights).sum(axis=1).astype(np.uint8)


def symbols_to_bytes(symbols: np.ndarray, colours: int, nbytes: int | None = None) -> bytes:
    """Inverse of `bytes_to_symbols`; returns the first `nbytes` bytes (all whole bytes by default)."""
    bits = bits_per_cell(colours)
    sym = np.asarray(symbols, dtype=np.uint8).ravel()
    if sym.size and int(sym.max()) >= colours:
        raise ValueError(f"symbol {int(sym.max())} out of range for {colours} colours")
    shifts = np.arange(bits - 1, -1, -1, dtype=np.uint8)
    bitstream = ((sym[:, None] >> shifts) & 1).astype(np.uint8).ravel()
    whole = bitstream.size // 8
    out = np.packbits(bitstream[: whole * 8]).tobytes()
    if nbytes is None:
        return out
    if nbytes > len(out):
        raise ValueError(f"asked for {nbytes} bytes but the symbols carry {len(out)}")
    return out[:nbytes]


def classify(samples_bgr: np.ndarray, palette: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest palette colour for each sampled colour.

    Returns (symbols uint8, confidence float32 in [0, 1]): the confidence is the
    margin between the nearest and second-nearest palette colour, relative to
    the palette's smallest spacing.
    """
    s = np.asarray(samples_bgr, dtype=np.float32).reshape(-1, 3)
    p = np.asarray(palette, dtype=np.float32)
    d = ((s[:, None, :] - p[None, :, :]) ** 2).sum(axis=2)
    order = np.argsort(d, axis=1)
    best = order[:, 0]
    rows = np.arange(s.shape[0])
    d1 = np.sqrt(d[rows, best])
    d2 = np.sqrt(d[rows, order[:, 1]])
    spacing = np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(axis=2))
    min_spacing = float(spacing[spacing > 0].min())
    confidence = np.clip((d2 - d1) / min_spacing, 0.0, 1.0).astype(np.float32)
    return best.astype(np.uint8), confidence
