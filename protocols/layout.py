"""Where cells sit on a screen image, and how a frame is drawn.

A code is a `rows` x `cols` grid of data cells, ringed by a white border
`border_cells` thick (the locator), drawn centred on a black screen. All
sizes are in screen pixels; the grid's cell is `cell_px` square.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocols import cells


@dataclass(frozen=True, slots=True)
class GridLayout:
    rows: int
    cols: int
    colours: int
    cell_px: int
    border_cells: int = 1

    def __post_init__(self) -> None:
        cells.bits_per_cell(self.colours)
        if min(self.rows, self.cols, self.cell_px, self.border_cells) < 1:
            raise ValueError("rows, cols, cell_px and border_cells must all be >= 1")

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    @property
    def frame_bytes(self) -> int:
        return self.n_cells * cells.bits_per_cell(self.colours) // 8

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


def render(frame: bytes, layout: GridLayout, screen_w: int, screen_h: int) -> np.ndarray:
    """Draw one frame's bytes as a screen image (H x W x 3 uint8 BGR)."""
    layout.check_fits(screen_w, screen_h)
    sym = cells.bytes_to_symbols(frame, layout.colours, layout.n_cells).reshape(layout.rows, layout.cols)
    pal = cells.palette_bgr(layout.colours)
    r, c = layout.outer_cells
    b = layout.border_cells
    grid = np.full((r, c, 3), 255, dtype=np.uint8)
    grid[b : b + layout.rows, b : b + layout.cols] = pal[sym]
    px = layout.cell_px
    code = np.repeat(np.repeat(grid, px, axis=0), px, axis=1)
    screen = np.zeros((screen_h, screen_w, 3), dtype=np.uint8)
    y0 = (screen_h - code.shape[0]) // 2
    x0 = (screen_w - code.shape[1]) // 2
    screen[y0 : y0 + code.shape[0], x0 : x0 + code.shape[1]] = code
    return screen


def blank(screen_w: int, screen_h: int) -> np.ndarray:
    """What an idle screen shows: black."""
    return np.zeros((screen_h, screen_w, 3), dtype=np.uint8)
