"""Where cells sit on a screen, and how a frame is drawn.

A code is a `rows` x `cols` grid of cells ringed by a white border
`border_cells` thick (the locator: its outer edge is the quadrilateral a
camera finds), drawn centred on a black screen, each cell `cell_px` screen
pixels square. Inside the grid some cells are reserved:

- pilots: a staggered lattice, one cell in `pilot_spacing`^2, cycling
  through the palette: the reader's colour model per region of the frame;
- parity marks: pairs (mark, anti-mark) down both sides, drawn white/black
  or black/white by the frame's parity bit: a capture that mixes two frames
  (or, with a rolling shutter, shows different frames in different rows)
  has marks that disagree or sit in between, and is rejected before
  decoding;
- sender strips: the sender's number in 8 black/white cells, top left and
  bottom right: which screen is which, before anything is decoded.

A layout may also be drawn on part of the screen (`GridLayout.in_part`,
PARTS): the same cells, fewer of them across (or down), against one side of
where the whole grid sits, for a camera that sees only that part of the
screen. A reader finds and reads it like any code: its outline is its own.

All other cells carry data, in raster order, `log2(colours)` bits each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from protocols import cells

DATA, PILOT, MARK, ANTI, SENDER = 0, 1, 2, 3, 4
SENDER_BITS = 8
WHITE = np.array([255, 255, 255], np.uint8)
# The parts of the screen a layout can be drawn on: (share of the whole grid kept, the side it is drawn
# against). Index 0 is the whole grid, centred on the screen.
PARTS = ((1.0, "whole"), (0.75, "left"), (0.75, "right"), (0.75, "top"), (0.75, "bottom"),
         (0.5, "left"), (0.5, "right"), (0.5, "top"), (0.5, "bottom"))


@dataclass(frozen=True)
class GridLayout:
    rows: int
    cols: int
    colours: int
    cell_px: int
    border_cells: int = 1
    pilot_spacing: int = 6
    part: int = 0  # where on the screen it is drawn (PARTS; 0: the whole grid, centred)
    whole: tuple[int, int] | None = None  # with a part: the outer cells of the whole grid it is part of
    roles: np.ndarray = field(init=False, repr=False, compare=False)
    pilot_symbols: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cells.bits_per_cell(self.colours)
        if self.rows < 6 or self.cols < 2 * SENDER_BITS + 6:
            raise ValueError(f"a grid needs at least 6 rows and {2 * SENDER_BITS + 6} columns")
        if min(self.cell_px, self.border_cells) < 1 or self.pilot_spacing < 2:
            raise ValueError("cell_px and border_cells must be >= 1, pilot_spacing >= 2")
        if not 0 <= self.part < len(PARTS) or (self.part > 0) != (self.whole is not None):
            raise ValueError(f"part must be one of 0..{len(PARTS) - 1}, with the whole grid's size when not 0")
        roles = np.zeros((self.rows, self.cols), np.uint8)
        r_last, c_last = self.rows - 1, self.cols - 1
        roles[0, 4 : 4 + SENDER_BITS] = SENDER
        roles[r_last, c_last - 3 - SENDER_BITS : c_last - 3] = SENDER
        for r in self.parity_rows:  # one cell in from the ring, whose light bleeds into its neighbours
            roles[r, 1], roles[r, 2] = MARK, ANTI
            roles[r, c_last - 1], roles[r, c_last - 2] = MARK, ANTI
        p = self.pilot_spacing
        rr, cc = np.mgrid[0 : self.rows, 0 : self.cols]
        lattice = (rr % p == p // 2) & ((cc - (rr // p % 2) * (p // 2)) % p == p // 2)
        roles[lattice & (roles == DATA)] = PILOT
        object.__setattr__(self, "roles", roles)
        n_pilots = int((roles == PILOT).sum())
        object.__setattr__(self, "pilot_symbols", (np.arange(n_pilots) % self.colours).astype(np.uint8))

    # -- geometry -------------------------------------------------------------
    def words(self, hold_s: float | None = None) -> str:
        """The layout in a person's words: `68x124 cells of 10 px, 8 colours, frames held 50 ms` (and, drawn
        on part of the screen, `on the left 3/4 of the screen`)."""
        held = "" if hold_s is None else f", frames held {hold_s * 1000:.0f} ms"
        share, side = PARTS[self.part]
        where = f", on the {side} {'3/4' if share == 0.75 else '1/2'} of the screen" if self.part else ""
        return f"{self.rows}x{self.cols} cells of {self.cell_px} px, {self.colours} colours{held}{where}"

    def in_part(self, part: int) -> GridLayout | None:
        """This layout drawn on part `part` of the screen (PARTS): the grid's outer cells across (left,
        right) or down (top, bottom) cut to the part's share, drawn against that side of where the whole grid
        sits. None where the grid that is left is too small for a code."""
        if part == self.part:
            return self
        whole = self.whole or self.outer_cells
        share, side = PARTS[part]
        b = 2 * self.border_cells
        rows, cols = whole[0] - b, whole[1] - b
        if side in ("left", "right"):
            cols = int(share * whole[1]) - b
        elif side != "whole":
            rows = int(share * whole[0]) - b
        try:
            return GridLayout(rows, cols, self.colours, self.cell_px, self.border_cells, self.pilot_spacing,
                              part, whole if part else None)
        except ValueError:
            return None

    @property
    def parity_rows(self) -> list[int]:
        k = max(3, self.rows // 6)
        return sorted({int(round(x)) for x in np.linspace(0, self.rows - 1, k)})

    @property
    def outer_cells(self) -> tuple[int, int]:
        """(rows, cols) of the code including its border."""
        b = 2 * self.border_cells
        return self.rows + b, self.cols + b

    @property
    def size_px(self) -> tuple[int, int]:
        r, c = self.outer_cells
        return r * self.cell_px, c * self.cell_px

    def check_fits(self, screen_w: int, screen_h: int) -> None:
        h, w = self.size_px
        if h > screen_h or w > screen_w:
            raise ValueError(
                f"a {self.rows}x{self.cols} grid of {self.cell_px}px cells needs {w}x{h} px, "
                f"the screen has {screen_w}x{screen_h}"
            )

    def index(self, role: int) -> np.ndarray:
        """Flat (row-major) indices of the cells with `role`."""
        return np.flatnonzero(self.roles.ravel() == role)

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    @property
    def n_data(self) -> int:
        return int((self.roles == DATA).sum())

    @property
    def frame_bytes(self) -> int:
        """Bytes the data cells of one frame carry (before error correction)."""
        return self.n_data * cells.bits_per_cell(self.colours) // 8

    def cell_centres(self) -> np.ndarray:
        """(n_cells, 2) x, y of every cell's centre in code units (outer ring corner at 0, 0; 1 unit = 1 cell)."""
        b = self.border_cells
        yy, xx = np.mgrid[0 : self.rows, 0 : self.cols]
        return np.stack([xx.ravel() + b + 0.5, yy.ravel() + b + 0.5], axis=1).astype(np.float32)


def render_cells(frame: bytes, layout: GridLayout, sender: int, parity: int) -> np.ndarray:
    """The code as one BGR colour per cell, ring included: (outer_rows, outer_cols, 3) uint8."""
    if not 0 <= sender < 2**SENDER_BITS:
        raise ValueError(f"sender must fit in {SENDER_BITS} bits")
    pal = cells.palette_bgr(layout.colours)
    flat = np.zeros((layout.n_cells, 3), np.uint8)
    flat[layout.index(DATA)] = pal[cells.bytes_to_symbols(frame, layout.colours, layout.n_data)]
    flat[layout.index(PILOT)] = pal[layout.pilot_symbols]
    flat[layout.index(MARK)] = WHITE * np.uint8(parity & 1)
    flat[layout.index(ANTI)] = WHITE * np.uint8(1 - (parity & 1))
    bits = np.array([(sender >> (SENDER_BITS - 1 - i)) & 1 for i in range(SENDER_BITS)], np.uint8)
    sidx = layout.index(SENDER)
    flat[sidx] = WHITE[None, :] * np.concatenate([bits, bits])[:, None]
    r, c = layout.outer_cells
    b = layout.border_cells
    grid = np.empty((r, c, 3), np.uint8)
    grid[:] = WHITE
    grid[b : b + layout.rows, b : b + layout.cols] = flat.reshape(layout.rows, layout.cols, 3)
    return grid


def render(frame: bytes, layout: GridLayout, screen_w: int, screen_h: int, sender: int = 0,
           parity: int = 0) -> np.ndarray:
    """Draw one frame's bytes as a screen image (H x W x 3 uint8 BGR)."""
    return _on_screen(render_cells(frame, layout, sender, parity), layout, screen_w, screen_h)


def _on_screen(grid: np.ndarray, layout: GridLayout, screen_w: int, screen_h: int) -> np.ndarray:
    """One colour per cell (ring included) drawn `cell_px` square on a black screen: centred, or for a part
    of the screen against its side of where the whole grid sits."""
    layout.check_fits(screen_w, screen_h)
    px = layout.cell_px
    r, c = grid.shape[:2]
    screen = np.zeros((screen_h, screen_w, 3), dtype=np.uint8)
    wr, wc = layout.whole or (r, c)
    y0 = (screen_h - wr * px) // 2
    x0 = (screen_w - wc * px) // 2
    side = PARTS[layout.part][1]
    if side == "right":
        x0 += (wc - c) * px
    elif side == "bottom":
        y0 += (wr - r) * px
    if side in ("top", "bottom"):
        x0 = (screen_w - c * px) // 2
    elif side in ("left", "right"):
        y0 = (screen_h - r * px) // 2
    # Each cell repeated px times down and across, straight into the screen (six times faster than np.repeat).
    cv2.resize(grid, (c * px, r * px), dst=screen[y0 : y0 + r * px, x0 : x0 + c * px],
               interpolation=cv2.INTER_NEAREST_EXACT)
    return screen


IDLE_LEVEL = 186  # sRGB grey with the mean light of a random frame (half of full light at gamma 2.2)


def render_idle(layout: GridLayout, screen_w: int, screen_h: int) -> np.ndarray:
    """What a screen shows between tensors: the ring around an even grey of a data frame's mean light.

    Cameras keep their exposure (auto-exposure sees the same light as during a transfer), and
    readers recognise it at once (its cells are all alike) instead of trying to decode it.
    """
    r, c = layout.outer_cells
    b = layout.border_cells
    grid = np.full((r, c, 3), 255, np.uint8)
    grid[b : b + layout.rows, b : b + layout.cols] = IDLE_LEVEL
    return _on_screen(grid, layout, screen_w, screen_h)


def blank(screen_w: int, screen_h: int) -> np.ndarray:
    """What an idle screen shows: black."""
    return np.zeros((screen_h, screen_w, 3), dtype=np.uint8)
