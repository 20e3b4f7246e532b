"""The placement table (python -m wccl.lab placement): its geometry, its CLI, and the copy in docs/real-laptops.md."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

from wccl.config import DEFAULT_LADDER, LadderStep
from wccl.lab.__main__ import main as lab_main
from wccl.lab.placement import (
    MIN_CAMERA_PX_PER_CELL,
    Screen,
    camera_px_per_cell,
    furthest_distance,
    layout_label,
    needed_px,
    screen_share,
)

DOC = ROOT / "docs" / "real-laptops.md"
BLOCK = re.compile(r"<!-- placement-table: (python -m wccl\.lab placement[^>]*?) -->\n(.*?)<!-- /placement-table -->",
                   re.DOTALL)


def test_camera_pixels_per_cell_match_a_hand_computation():
    # 13.3 inches = 0.33782 m across the diagonal; a 16:9 panel is 16/sqrt(16^2 + 9^2) of it wide: 0.294436 m;
    # the 1280 px frame fills that width: 0.230028 mm a pixel, 2.30028 mm a 10 px cell. A 60-degree lens at
    # 0.5 m sees 2 * 0.5 * tan(30 deg) = 0.577350 m across 1280 px: 0.451055 mm a pixel. 2.30028 / 0.451055.
    assert camera_px_per_cell(10, Screen(13.3, (16, 9)), 60, 0.5) == pytest.approx(5.0998, abs=1e-3)
    # A 16:10 panel of the same diagonal is 0.286471 m wide and the 16:9 frame fills its width: 4.9618.
    assert camera_px_per_cell(10, Screen(13.3, (16, 10)), 60, 0.5) == pytest.approx(4.9618, abs=1e-3)
    # Seen 60 degrees off, the cell is half as wide; the panel fills 0.294436 / 0.577350 of the picture.
    assert camera_px_per_cell(10, Screen(13.3), 60, 0.5, angle_deg=60) == pytest.approx(5.0998 / 2, abs=1e-3)
    assert screen_share(Screen(13.3), 60, 0.5) == pytest.approx(0.5100, abs=1e-3)
    # A frame taller than the panel's shape fills its height instead: 1280x1024 on 16:9 is limited by 1024 px.
    tall = camera_px_per_cell(10, Screen(13.3), 60, 0.5, frame=(1280, 1024))
    assert tall == pytest.approx(5.0998 * (720 / 1024), abs=1e-3)


def test_furthest_distance_grows_with_the_cell_and_shrinks_with_the_lens_field_of_view():
    dist = [furthest_distance({"cell_px": px, "colours": 8}, 13.3, 70) for px in (10, 11, 12, 14, 16, 20)]
    assert all(a < b for a, b in itertools.pairwise(dist)), dist
    by_fov = [furthest_distance({"cell_px": 12, "colours": 8}, 15.6, f) for f in (50, 60, 70, 78, 90)]
    assert all(a > b for a, b in itertools.pairwise(by_fov)), by_fov
    # fewer colours need fewer camera pixels: the same cell reads further
    assert furthest_distance({"cell_px": 16, "colours": 4}, 13.3, 70) > furthest_distance(
        {"cell_px": 16, "colours": 8}, 13.3, 70)
    # at the furthest distance, a cell is exactly the decoder's need
    for step in DEFAULT_LADDER:
        d = furthest_distance(step, 14.0, 78, aspect=(16, 10), angle_deg=30)
        assert camera_px_per_cell(step["cell_px"], Screen(14.0, (16, 10)), 78, d, angle_deg=30) == pytest.approx(
            needed_px(step["colours"]))
    # a cell too small to read anywhere the screen fits in the picture: no distance
    assert furthest_distance({"cell_px": 2, "colours": 8}, 13.3, 70) is None
    assert set(MIN_CAMERA_PX_PER_CELL) == {2, 4, 8}


def test_the_cli_prints_a_table_with_every_layout_of_the_ladder(capsys):
    assert lab_main(["placement"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| screen | lens | view | distance"))
    for step in DEFAULT_LADDER:
        assert layout_label(LadderStep(**step)) in header
    rows = [line for line in out.splitlines() if re.match(r'\| [\d.]+" 16:(9|10) \| \d+ deg \| [^|]+ \| [\d.]+ m \| \d+%', line)]
    assert len(rows) == 4 * 2 * 3 * 2 * 6  # screens x aspects x lenses x angles x distances
    # --json: the same table as one object, every cell marked
    assert lab_main(["placement", "--json", "--screens", "13.3", "--aspects", "16:9", "--fov", "70", "--angle", "0"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [lay["rows"] for lay in table["layouts"]] == [s["rows"] for s in DEFAULT_LADDER]
    assert len(table["rows"]) == 6 and all(len(r["cells"]) == len(DEFAULT_LADDER) for r in table["rows"])
    near, far = table["rows"][0]["cells"], table["rows"][-1]["cells"]  # 0.4 m, 1.2 m
    assert all(c["readable"] for c in near) and [c["readable"] for c in far] == [False] * 6 + [True]  # 32 px
    # a room file's layouts: rooms/two-laptops.toml pins one
    assert lab_main(["placement", "--config", str(ROOT / "rooms" / "two-laptops.toml"), "--angle", "0"]) == 0
    assert "| 36x70 16px 8c 200ms |" in capsys.readouterr().out
    assert lab_main(["placement", "--aspects", "16-9"]) == 2


def test_the_table_in_the_guide_is_what_the_command_prints_now():
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert blocks, f"{DOC.name} has no <!-- placement-table: python -m wccl.lab placement ... --> block"
    for command, pasted in blocks:
        argv = shlex.split(command)
        p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           check=False)
        assert p.returncode == 0, p.stderr
        assert pasted.strip() == p.stdout.strip(), f"regenerate the table in {DOC.name} with: {command}"
