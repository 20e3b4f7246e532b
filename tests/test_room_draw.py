"""`wccl room draw`: every shipped room file gives its top view (a PNG OpenCV reads back, of the size it says,
not blank), or one line saying why there is none; and what it says of the two-laptop room is so."""

from __future__ import annotations

import re
import subprocess
import sys

import cv2
import pytest

from wccl.cli import main
from wccl.room.draw import WIDTH

from conftest import ROOT

ROOMS = sorted([ROOT / "config.toml", *(ROOT / "rooms").glob("*.toml"), *(ROOT / "rooms" / "pairs").glob("*.toml")])


def _room(path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text()).get("room", {})


@pytest.mark.parametrize("room", ROOMS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shipped_room_is_drawn_or_says_in_one_line_why_not(room, tmp_path, capsys):
    out = tmp_path / "room.png"
    status = main(["room", "draw", str(room), "--out", str(out)])
    text, err = capsys.readouterr()
    table = _room(room)
    if table.get("medium", "simulated") != "simulated":  # real devices: no poses to draw
        assert status == 2 and text == "" and err.count("\n") == 1, (text, err)
        assert "needs a simulated room" in err and not out.exists(), err
        return
    if table.get("profile") == "exact":  # a perfect camera: no geometry
        assert status == 0 and err == "" and text.count("\n") == 1 and "'exact'" in text, (text, err)
        assert not out.exists()
        return
    assert status == 0, err
    m = re.search(r"^wrote (.+) \((\d+)x(\d+)\)$", text, re.M)
    assert m and m[1] == str(out), text
    image = cv2.imread(str(out))
    assert image is not None and image.shape == (int(m[3]), int(m[2]), 3) and image.shape[1] == WIDTH
    assert image.std() > 20 and len({tuple(px) for px in image[::7, ::7].reshape(-1, 3)}) > 50  # not blank
    assert text.startswith(f"{room.name}: profile "), text  # (a path given whole: the title is its name)


def test_both_directions_of_the_two_laptop_room_are_seen(tmp_path, capsys):
    assert main(["room", "draw", str(ROOT / "rooms" / "two-laptops-sim.toml"), "--out", str(tmp_path / "x.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    for direction in ("bob -> alice", "alice -> bob"):
        (line,) = [ln for ln in lines if ln.strip().startswith(f"{direction}:")]
        assert re.match(rf"  {direction}: seen, 0\.60 m, .*; readable: \d+x\d+ \d+px [248]c \d+ms at [0-9.]+ camera px "
                        "per cell$", line), line


def test_a_screen_out_of_view_says_why_and_an_observer_shows_nothing(tmp_path, capsys):
    # config.toml: carol, the observer, sits beside bob, turned to alice's screen: bob's screen is behind her
    # camera, and her own screen shows nothing
    assert main(["room", "draw", str(ROOT / "config.toml"), "--out", str(tmp_path / "x.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("  bob -> carol: not seen: behind the camera (") for ln in lines), lines
    assert not any(ln.strip().startswith("carol ->") for ln in lines), lines


def test_it_runs_as_a_module_too(tmp_path):
    out = tmp_path / "far.png"
    p = subprocess.run([sys.executable, "-m", "wccl.room.draw", "rooms/pairs/far.toml", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "bob -> alice: seen, 0.80 m" in p.stdout and out.is_file()
