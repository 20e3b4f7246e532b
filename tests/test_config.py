"""Bad configs exit with status 2 and a short message naming the file and the key."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tomllib

from wccl.config import ConfigError, load_config, parse_config
from wccl.node import main

from conftest import ROOT, deep_update, shipped_config_dict


def _write(tmp_path, data: dict) -> str:
    def dump(d: dict, prefix: str = "") -> list[str]:
        lines, tables = [], []
        for k, v in d.items():
            if isinstance(v, dict):
                tables.append((k, v))
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                tables.append((k, v))
            else:
                lines.append(f"{k} = {_toml_value(v)}")
        for k, v in tables:
            name = f"{prefix}{k}"
            if isinstance(v, list):
                for item in v:
                    lines += ["", f"[[{name}]]"] + dump(item, name + ".")
            else:
                lines += ["", f"[{name}]"] + dump(v, name + ".")
        return lines

    p = tmp_path / "room.toml"
    p.write_text("\n".join(dump(data)) + "\n")
    assert tomllib.loads(p.read_text()) == data
    return str(p)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def test_shipped_config_loads():
    cfg = load_config(ROOT / "config.toml")
    assert cfg.room.server == "alice" and cfg.room.workers == ["alice", "bob"]
    assert cfg.training.steps == 30 and sum(s for _, s in cfg.schedule.resolved()) == 8.0


def _nodes(*roles):
    return [{"name": n, "roles": list(r)} for n, r in zip(["alice", "bob", "carol"], roles)]


BAD = {
    "unknown_key": ({"link": {"colour_count": 8}}, "link.colour_count: unknown key"),
    "unknown_section": ({"network": {"port": 1}}, "network: unknown key"),
    "wrong_type": ({"training": {"steps": "thirty"}}, "training.steps"),
    "two_servers": ({"room": {"nodes": _nodes(["server", "worker"], ["server"])}}, "exactly one node must have the 'server' role"),
    "no_worker": ({"room": {"nodes": _nodes(["server"], [])}}, "room.nodes[1].roles"),
    "no_server": ({"room": {"nodes": _nodes(["worker"], ["worker"])}}, "found 0"),
    "duplicate_names": ({"room": {"nodes": [{"name": "bob", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]}}, "repeated: bob"),
    "bad_colours": ({"link": {"colours": 5}}, "link.colours"),
    "grid_too_big": ({"link": {"cell_px": 40}}, "needs"),
    "phases_out_of_order": ({"schedule": {"preset": "custom", "phases": [{"name": "uplink", "seconds": 1.0}, {"name": "compute", "seconds": 1.0}]}}, "schedule"),
    "quorum_too_big": ({"training": {"quorum": 3}}, "quorum"),
    "missing_dataset": ({"training": {"dataset": "no/such/folder"}}, "training.dataset: no such folder"),
    "observer_without_server": ({"training": {"exchange": "collectives"}},
                                "observer 'carol' watches a parameter server's screen"),
    "unknown_actor_policy": ({"supervision": {"actors": {"janitor": {"max_restarts": 1}}}}, "janitor"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_exits_2_naming_file_and_key(case, tmp_path, capsys):
    update, expected = BAD[case]
    data = shipped_config_dict()
    if "room" in update and "nodes" in update["room"]:
        data["room"]["nodes"] = update["room"]["nodes"]
        update = {}
    path = _write(tmp_path, deep_update(data, update))
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert path in err and expected in err, err
    assert "Traceback" not in err


def test_missing_file_and_invalid_toml(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: config file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[room\nseed = 1\n")
    assert main(["--config", str(bad)]) == 2
    assert "bad.toml: invalid TOML" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        load_config(bad)


def test_unknown_camera_name_and_node(tmp_path, capsys):
    data = shipped_config_dict()
    data["room"]["nodes"][1]["camera"] = "telescope"
    path = _write(tmp_path, data)
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert "no camera named 'telescope'" in err and "Traceback" not in err
    assert main(["--config", str(ROOT / "config.toml"), "--node", "mallory"]) == 2
    assert "--node mallory" in capsys.readouterr().err


def test_cli_bad_config_in_a_real_process(tmp_path):
    path = _write(tmp_path, deep_update(shipped_config_dict(), {"camera": {"fps": -1}}))
    p = subprocess.run([sys.executable, "-m", "wccl.node", "--config", path], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 2
    assert "camera.fps" in p.stderr and "Traceback" not in p.stderr


def test_the_configuration_reference_is_generated_from_the_models():
    from wccl.configref import SECTIONS, reference

    doc = (ROOT / "docs" / "config.md").read_text()
    assert doc == reference(), "docs/config.md is stale: run `python -m wccl.configref > docs/config.md`"
    for section, cls in SECTIONS:  # every key of every section is in it
        for name in cls.model_fields:
            assert f"| `{name}` |" in doc


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["launch", "--help"], ["lab", "bench", "--help"],
                                  ["lab", "collectives", "--help"], ["devices", "--help"],
                                  ["room", "snapshot", "--help"]])
def test_one_command_with_help_on_each_subcommand(argv):
    p = subprocess.run([sys.executable, "-m", "wccl.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout
    if argv[0] in ("run", "lab"):
        assert "(default: " in p.stdout  # options list their defaults


def test_an_unknown_command_is_one_line_and_the_list():
    p = subprocess.run([sys.executable, "-m", "wccl.cli", "fly"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no command 'fly'" in p.stderr and "launch" in p.stderr


def test_a_link_table_that_gives_a_layout_pins_it():
    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]
    assert parse_config({"room": {"nodes": nodes}}).link.choose == "auto"  # the default: the start-up ladder
    small = parse_config({"room": {"nodes": nodes}, "screen": {"width": 640, "height": 400},
                          "link": {"rows": 40, "cols": 70, "cell_px": 8}})
    assert small.link.choose == "pinned" and small.link.rows == 40  # the ladder would not fit this screen
    explicit = parse_config({"room": {"nodes": nodes}, "link": {"rows": 50, "choose": "auto"}})
    assert explicit.link.choose == "auto"
