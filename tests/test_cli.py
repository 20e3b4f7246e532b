"""The `wccl` command: its help, its commands, and its exit statuses."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from wccl.cli import COMMANDS, ROOM_COMMANDS, main

from conftest import ROOT, shipped_config_dict


def test_no_arguments_prints_the_help_to_stderr_and_exits_2(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: wccl COMMAND")
    for name in [*COMMANDS, *(f"room {n}" for n in ROOM_COMMANDS)]:
        assert f"\n  {name} " in err


def test_help_prints_the_same_help_to_stdout_and_exits_0(capsys):
    assert main([]) == 2
    alone = capsys.readouterr().err
    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        out, err = capsys.readouterr()
        assert out == alone and err == ""


def _described(text: str, rows: dict[str, str]) -> list[int]:
    """The column where each row's description starts, checking each line is `  NAME  description`."""
    columns = []
    for name, description in rows.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  {name} "))
        assert re.fullmatch(rf"  {name} +{re.escape(description)}", line), line
        columns.append(line.index(description))
    return columns


def test_the_help_columns_are_aligned(capsys):
    assert main(["--help"]) == 0
    rows = {name: text for name, (_, text) in COMMANDS.items()}
    rows |= {f"room {name}": text for name, (_, text) in ROOM_COMMANDS.items()}
    columns = _described(capsys.readouterr().out, rows)
    assert len(set(columns)) == 1 and len(columns) == len(COMMANDS) + len(ROOM_COMMANDS)


def test_room_help_lists_the_rooms_subcommands(capsys):
    assert main(["room", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: wccl room SUBCOMMAND")
    columns = _described(out, {name: text for name, (_, text) in ROOM_COMMANDS.items()})
    assert len(set(columns)) == 1 and {"views", "fit", "bench", "serve"} <= set(ROOM_COMMANDS)
    assert "\n  launch " not in out and "\n  room " not in out  # the room's help, not the top-level one
    assert main(["room"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: wccl room SUBCOMMAND")


@pytest.mark.parametrize("argv,near", [(["fly"], None), (["rn"], "run"), (["room", "viewz"], "views")])
def test_an_unknown_command_names_itself_and_lists_the_commands(argv, near, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    prog = "wccl room: no subcommand" if argv[0] == "room" else "wccl: no command"
    assert first == f"{prog} {argv[-1]!r}" + (f" (did you mean {near!r}?)" if near else "")
    assert "usage: wccl" in err and ("serve" if argv[0] == "room" else "launch") in err


@pytest.mark.parametrize("argv", [[name, "--help"] for name in COMMANDS if name != "lab"]
                         + [["lab", "bench", "--help"], ["lab", "collectives", "--help"]]
                         + [["room", name, "--help"] for name in ROOM_COMMANDS], ids=" ".join)
def test_every_command_has_its_own_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    # every command's parser is built one way (wccl.cli.command_parser): named as the user typed it
    typed = " ".join(a for a in argv if a != "--help")
    assert out.startswith(f"usage: wccl {typed} "), out
    if argv[0] in ("run", "lab"):
        assert "(default: " in out  # options list their defaults


@pytest.mark.parametrize("module", ["wccl.node", "wccl.aim", "wccl.lab", "wccl.keys"])
def test_a_command_run_as_a_module_names_itself_as_typed(module):
    p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith(f"usage: python -m {module} "), p.stdout[:200]


def test_what_a_user_mistypes_is_named_in_one_line(tmp_path, capsys):
    from wccl.lab.__main__ import main as lab

    assert lab(["placement", "--screens", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wccl.lab placement: --screens abc: expected numbers separated by commas"), err
    assert main(["run", "--config", str(tmp_path)]) == 2  # a folder, not a file
    err = capsys.readouterr().err
    assert f"{tmp_path}: a folder, not a room file" in err and err.count("\n") == 1, err
    assert main(["keys", "new", str(tmp_path / "no-such-dir" / "room.key")]) == 2
    err = capsys.readouterr().err
    assert "no folder" in err and "Errno" not in err, err


def test_keys_makes_a_key_and_fingerprints_it(tmp_path, capsys):
    key = tmp_path / "room.key"
    assert main(["keys", "new", str(key)]) == 0
    made = capsys.readouterr().out
    assert main(["keys", "fingerprint", str(key)]) == 0
    fingerprint = capsys.readouterr().out.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", fingerprint) and f"fingerprint {fingerprint}" in made
    assert main(["keys", "new", str(key)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err


def _bad_room(tmp_path) -> str:
    text = (ROOT / "config.toml").read_text().replace('profile = "webcam"', 'profile = "webcm"')
    assert shipped_config_dict()["room"]["profile"] == "webcam" and 'profile = "webcm"' in text
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


BAD_PROFILE = "room.profile: 'webcm' is not a profile; choose one of exact, ideal, webcam, harsh (did you mean 'webcam'?)"


def test_a_bad_config_through_wccl_launch_is_one_line_and_exit_2(tmp_path, capsys):
    path = _bad_room(tmp_path)
    assert main(["launch", "--config", path, str(ROOT / "examples" / "ddp_mnist.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith(f"{path}: {BAD_PROFILE}\n"), err


def test_a_bad_config_through_wccl_run_is_one_line_and_exit_2(tmp_path):
    path = _bad_room(tmp_path)
    p = subprocess.run([sys.executable, "-m", "wccl.cli", "run", "--config", path], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [f"wccl: config error: {path}: {BAD_PROFILE}"], p.stderr
    assert p.stdout == ""


def test_only_the_built_in_run_keeps_a_progress_line_on_a_terminal():
    # aim mode, the launcher, the room's process: their output is lines; a training run's step line under
    # them stayed for good and glued what they printed next to it ("startingalice: aimed ...").
    import io

    import structlog

    from wccl.runtime.logs import configure_logging, end_progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for progress, shown in ((None, False), (True, True)):
        term = Terminal()
        configure_logging("console", "warning", stream=term, **({} if progress is None else {"progress": True}))
        structlog.get_logger("wccl").warning("camera_reads_nothing", problem="none")
        end_progress()
        assert ("wccl | step" in term.getvalue()) is shown, term.getvalue()
    configure_logging("json", "debug", stream=io.StringIO())
