"""`wccl doctor`: a bundle to attach to a bug report when the laptops do not read each other, and its replay.

    wccl doctor --config room.toml --node bob --seconds 20          # on bob's laptop, the others running
    wccl doctor --replay wccl-doctor-bob.zip                        # on any machine

Making a bundle runs the node as `wccl run --node bob` does (its screen shows its code, its camera
films the others' screens) for `--seconds`, records what the camera filmed (lossless, `record_to`), and
writes one zip: the room file as given, the recording (`camera.nut`), the node's log (`log.jsonl`, JSON
lines), and `about.json` (the node, the seconds, the versions of Python, the platform and the libraries,
the cameras and displays this laptop has when its camera is a real one, the room key's fingerprint but
never the key). On a simulated room every node of the room runs (there are no other laptops), for that
many room seconds, and the named node's camera is recorded.

Replaying decodes the recording with the decoder every node runs (actors/frame_decoder.py, as a
listener: no frame is answered) in every layout of the room's start-up ladder and prints, per screen it
read and per layout, the frames decoded (their error correction held), and why the others were lost:
uncorrectable, or filmed while the screen changed (mixed); then the captures with no code at all, and what
the camera saw in words. The bundle holds no key, so a frame's check is not verified: a frame decoded
here was read cleanly, not proven to be of the room.
"""

from __future__ import annotations

import asyncio
import io
import json
import platform
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wccl.cli import command_parser
from wccl.config import ConfigError, load_config, parse_config, with_values

BUNDLE_FILES = ("about.json", "room.toml", "camera.nut", "log.jsonl")


def versions() -> dict[str, str]:
    """Python, the platform, WCCL and the libraries it reads and shows frames with (installed versions)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("wccl", "torch", "opencv-python", "av", "numpy", "structlog", "pydantic", "reedsolo", "raptorq",
                 "cryptography"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def make(config_path: Path, node: str, seconds: float, out: Path) -> dict[str, Any]:
    """Run `node` (every node, in a simulated room) for `seconds`, recording its camera; write the bundle to
    `out`. Returns the bundle's about.json."""
    from wccl.keys import room_key
    from wccl.runtime.logs import configure_logging
    from wccl.node import RoomRun
    from wccl.runtime.timebase import new_loop

    text = config_path.read_text()
    cfg = load_config(config_path)
    names = [n.name for n in cfg.room.nodes]
    if node not in names:
        raise ConfigError(f"--node {node}: not a node of the room ({', '.join(names)})")
    simulated = cfg.room.medium == "simulated"
    with tempfile.TemporaryDirectory() as tmp:
        recording = Path(tmp) / "camera.nut"
        nodes = [dict(n.model_dump(exclude_defaults=True), name=n.name) for n in cfg.room.nodes]
        for n in nodes:
            if n["name"] == node:
                n["record_to"] = str(recording)
        cfg = with_values(cfg, "wccl doctor", room={"nodes": nodes}, dashboard={"enabled": False})
        logs = io.StringIO()
        configure_logging("json", "info", stream=logs)

        async def go() -> dict[str, Any]:
            run = RoomRun(cfg, None if simulated else node)

            async def stop_later():
                await asyncio.sleep(seconds)
                run.stop.set()

            timer = asyncio.create_task(stop_later())
            try:
                return await run.run()
            finally:
                timer.cancel()

        loop = new_loop(cfg.room.clock if simulated else "realtime")
        try:
            result = loop.run_until_complete(go())
        except BaseExceptionGroup as eg:  # a node that gave up (the room did not connect): its log says why
            result = {"failed": [str(e) for e in eg.exceptions]}
        finally:
            loop.close()
        spec = cfg.room.node(node)
        about = dict(node=node, seconds=seconds, medium=cfg.room.medium, profile=cfg.room.profile,
                     camera=spec.camera, screen=spec.screen, versions=versions(),
                     key_fingerprint=room_key(cfg).fingerprint if cfg.room.key_file or cfg.room.key_env else None,
                     run={k: result.get(k) for k in ("applied", "steps", "stopped", "failed") if k in result})
        if spec.camera == "webcam":
            from wccl.devices import list_cameras

            about["cameras"] = list_cameras(read=False)
        if not recording.exists():
            raise RuntimeError(f"{node}'s camera recorded nothing in {seconds} s (its log: see above)")
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("about.json", json.dumps(about, indent=1) + "\n")
            z.writestr("room.toml", text)
            z.write(recording, "camera.nut")
            z.writestr("log.jsonl", logs.getvalue())
    return about


def replay(bundle: Path) -> dict[str, Any]:
    """Decode a bundle's recording: per sender and layout, the frames decoded and lost (see the module
    docstring)."""
    import tomllib

    from actors.frame_decoder import FrameDecoder
    from protocols import transfer
    from protocols.messages import Capture
    from wccl.runtime.actor import ActorContext, Mailbox
    from wccl.distributed.rank_node import collective_ladder
    from wccl.room.record import iter_recording
    from wccl.runtime.timebase import NodeClock

    with zipfile.ZipFile(bundle) as z:
        missing = [f for f in BUNDLE_FILES if f not in z.namelist()]
        if missing:
            raise ValueError(f"{bundle}: not a wccl doctor bundle (no {', '.join(missing)})")
        about = json.loads(z.read("about.json"))
        room = tomllib.loads(z.read("room.toml").decode())
        video = z.read("camera.nut")
    room.get("room", {}).pop("key_file", None)
    room.get("room", {}).pop("key_env", None)  # (the bundle holds no key: the check is not verified)
    cfg = parse_config(room, f"{bundle}:room.toml", Path.cwd())
    ladder = [c for c, _ in collective_ladder(cfg)]
    names = [n.name for n in cfg.room.nodes]
    node = about["node"]

    async def go(path: Path) -> FrameDecoder:
        async def nowhere(msg):  # a listener answers nothing
            return None

        ctx = ActorContext(node, "frame_decoder", NodeClock(), Mailbox("replay", 8, "drop_oldest"), nowhere)
        decoder = FrameDecoder(ctx, ladder[0], cfg.room.session, names, transfer.TransferAssembler(),
                               ladder=ladder, lens=cfg.lens_of(node), listen=True)
        for seq, (image, t) in enumerate(iter_recording(path)):
            await decoder.handle(Capture(sender=node, time=t, image=image, seq=seq))
        return decoder

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "camera.nut"
        path.write_bytes(video)
        decoder = asyncio.run(go(path))
    captures = decoder.stats["captures"]
    per = by_sender(decoder.tally, names, lambda k: decoder.layout_of(k).layout.words())
    view = decoder.view
    decoded = any(c.get("decoded") for lays in per.values() for c in lays.values())
    # (nothing decoded: why, in the words a node gives; else the per-layout counts say it)
    return dict(node=node, about=about, captures=captures, captures_with_code=view.with_code,
                captures_without_code=captures - view.with_code,
                read={who: {lay: dict(c) for lay, c in lays.items()} for who, lays in per.items()},
                seen=None if decoded else view.problem(), largest_code_px=list(view.largest))


def by_sender(tally: Counter, names: list[str], words: Callable[[int], str]) -> dict[str, dict[str, Counter]]:
    """The decoder's tally, (sender, layout, outcome) -> frames, as sender name -> layout in words -> outcome
    -> frames. A frame whose two sender strips disagree has no sender (None): "sender unread"."""
    per: dict[str, dict[str, Counter]] = {}
    for (sender, k, outcome), n in sorted(tally.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, *kv[0][1:])):
        who = ("sender unread" if sender is None else names[sender] if 0 <= sender < len(names) else f"rank {sender}")
        per.setdefault(who, {}).setdefault(words(k), Counter())[outcome] += n
    return per


def _print_replay(r: dict[str, Any]) -> None:
    about = r["about"]
    print(f"{r['node']}'s camera, {about['seconds']:g} s ({about['medium']}, camera {about['camera']}): "
          f"{r['captures']} captures, {r['captures_with_code']} with a code, {r['captures_without_code']} without")
    if not r["read"]:
        print("  no frame decoded in any layout of the ladder")
    for who, lays in r["read"].items():
        for lay, c in lays.items():
            lost = ", ".join(f"{c[k]} {k}" for k in ("uncorrectable", "mixed") if c.get(k))
            print(f"  {who}, {lay}: {c.get('decoded', 0)} frames decoded" + (f"; lost: {lost}" if lost else ""))
    if r["seen"]:
        print(f"  what the camera saw: {r['seen']}")
    else:
        print("  (a frame decoded here was read cleanly; its check is not verified: the bundle holds no key)")


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.doctor", "Record what this laptop's camera sees of the other screens into one file "
                                      "for a bug report (--config, --node), or decode such a file (--replay).")
    p.add_argument("--config", help="the room file")
    p.add_argument("--node", help="this laptop's node (its camera is recorded)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to record (default 20)")
    p.add_argument("--out", help="the bundle to write (default: wccl-doctor-NODE.zip)")
    p.add_argument("--replay", metavar="BUNDLE", help="decode a bundle and print what its camera read")
    p.add_argument("--json", action="store_true", help="--replay: print one JSON object")
    a = p.parse_args(argv)
    if a.replay:
        from wccl.runtime.logs import configure_logging

        configure_logging("json", "error", stream=sys.stderr)
        try:
            r = replay(Path(a.replay))
        except OSError as e:
            print(f"wccl doctor: cannot read {a.replay}: {e.strerror or e}", file=sys.stderr)
            return 2
        except (ValueError, zipfile.BadZipFile, ConfigError) as e:
            print(f"wccl doctor: {a.replay}: {e}", file=sys.stderr)
            return 2
        if a.json:
            print(json.dumps(r))
        else:
            _print_replay(r)
        return 0
    if not a.config or not a.node:
        p.error("give --config and --node to make a bundle, or --replay BUNDLE to read one")
    if not a.seconds > 0:
        p.error(f"--seconds: a positive number of seconds, not {a.seconds:g}")
    out = Path(a.out or f"wccl-doctor-{a.node}.zip")
    try:
        about = make(Path(a.config), a.node, a.seconds, out)
    except OSError as e:
        print(f"wccl doctor: {e.filename or a.config}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (ConfigError, RuntimeError) as e:
        print(f"wccl doctor: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 1e6:.0f} MB): {a.node}'s camera for {a.seconds:g} s, its log and the "
          f"room file; attach it to the report (it holds no room key). Read it with: wccl doctor --replay {out}")
    return 0 if about else 1


if __name__ == "__main__":
    sys.exit(main())
