"""`python -m wccl.lab fuzz --seconds N --json`: random and mutated inputs to everything that reads from outside.

Entry points, each with the only error it may raise (anything else is a
crash), and what it must never do:

| entry point       | the code                                           | may raise        | never |
|-------------------|----------------------------------------------------|------------------|-------|
| transfer_frames   | protocols.receiver.TransferReceiver.receive (keyed)| nothing          | deliver a tensor that was not sent |
| fec_symbols       | protocols.link.LinkCodec.decode_message            | UncorrectableFrame | - |
| snapshots         | protocols.snapshot.decode_snapshot                 | SnapshotError    | - |
| checkpoints       | wccl.runtime.recovery.load_checkpoint (keyed; and behind the tag, re-tagged with the key) | CheckpointError | load an altered file |
| config            | wccl.config.load_config (TOML text)                | ConfigError      | - |
| idx               | wccl.training.data.read_idx                        | DataError        | - |
| camera_images     | actors.frame_decoder.FrameDecoder on a Capture     | nothing          | deliver a tensor that was not sent |

Inputs: valid seeds (real frames, snapshots, checkpoints, the shipped
config, a small IDX file, camera captures of real frames in the simulated
room) and their mutations (bit flips, byte changes, insertions, deletions,
truncation, splices, interesting values; for config files, wrong types,
huge numbers, unknown keys and odd paths; for images, odd sizes and dtypes,
all black, all white, saturated, truncated, noise). A run longer than
`HANG_S` on one input is a hang. Printed per entry point: executions,
crashes, hangs, wrong deliveries, seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import tempfile
import time
import traceback
from abc import ABC, abstractmethod
from collections import Counter
from pathlib import Path

import numpy as np

from wccl.cli import command_parser

HANG_S = 5.0
BYTE_ENTRY_POINTS = ("transfer_frames", "fec_symbols", "snapshots", "checkpoints", "config", "idx")
ENTRY_POINTS = BYTE_ENTRY_POINTS + ("camera_images",)
INTERESTING = (0, 1, 0x7F, 0x80, 0xFF)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=60.0, help="total time, shared by the entry points")
    p.add_argument("--images-share", type=float, default=0.4, help="share of the time for camera images")
    p.add_argument("--only", help="comma-separated entry points (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


# ---- mutations ------------------------------------------------------------------------------------


def mutate(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    """One to four random edits of `data` (or of a splice with another seed)."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        n = len(b)
        if op == 0 and n:  # flip a bit
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # set a byte
            b[rng.randrange(n)] = rng.randrange(256)
        elif op == 2 and n:  # an interesting value, maybe a wide one
            i = rng.randrange(n)
            w = rng.choice((1, 2, 4, 8))
            v = rng.choice(INTERESTING)
            b[i:i + w] = bytes([v]) * min(w, n - i)
        elif op == 3:  # insert bytes
            i = rng.randrange(n + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 4 and n:  # delete bytes
            i = rng.randrange(n)
            del b[i:i + rng.randint(1, 16)]
        elif op == 5 and n:  # truncate
            del b[rng.randrange(n):]
        elif op == 6 and others:  # splice with another seed
            o = rng.choice(others)
            i, j = rng.randrange(len(b) + 1), rng.randrange(len(o) + 1)
            b = b[:i] + bytearray(o[j:])
        elif op == 7 and n:  # duplicate a block
            i = rng.randrange(n)
            b[i:i] = b[i:i + rng.randint(1, 64)]
        elif op == 8:  # entirely random
            b = bytearray(rng.randbytes(rng.randint(0, max(1, 2 * n))))
    return bytes(b)


# ---- entry points -----------------------------------------------------------------------------------


class _Entry(ABC):
    """Seeds, one execution on an input, and what counts as a failure."""

    allowed: tuple[type[BaseException], ...] = ()

    def __init__(self, rng: random.Random, tmp: Path) -> None:
        self.rng, self.tmp = rng, tmp
        self.seeds: list[bytes] = []
        self.wrong = 0

    def input(self) -> object:
        return mutate(self.rng, self.rng.choice(self.seeds), self.seeds)

    @abstractmethod
    def run(self, x) -> None:
        """One execution on input `x`."""

    def close(self) -> None:
        pass


class TransferFrames(_Entry):
    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from protocols.security import RoomKey
        from wccl.lab.attack import _Rank

        self.key = RoomKey(os.urandom(32))
        alice, bob = _Rank(0, self.key), _Rank(1, self.key)
        self.genuine = set()
        for i in range(6):
            payload = rng.randbytes(4 * rng.randint(1, 600))
            self.genuine.add(payload)
            alice.post(payload, i + 1)
        for n in range(200):
            m = alice.next_message(n * 100_000)
            self.seeds.append(m)
            bob.rx.receive(m)
            alice.rx.receive(bob.status(n * 100_000 + 50_000))
        self.bob = bob

    def run(self, x) -> None:
        r = self.bob.rx.receive(x)
        if r.data is not None and r.data not in self.genuine:
            self.wrong += 1


class FecSymbols(_Entry):
    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from protocols import fec
        from protocols.layout import GridLayout
        from protocols.link import LinkCodec

        self.allowed = (fec.UncorrectableFrame,)
        self.codec = LinkCodec(GridLayout(rows=24, cols=40, colours=8, cell_px=10), code_rate=0.8)
        msg = bytes(self.codec.message_bytes)
        from protocols import cells

        for _ in range(6):
            msg = rng.randbytes(self.codec.message_bytes)
            sym = cells.bytes_to_symbols(self.codec.encode_message(msg), 8, self.codec.layout.n_data)
            self.seeds.append(sym.astype(np.uint8).tobytes())

    def input(self):
        raw = super().input()
        sym = np.frombuffer(raw, np.uint8).copy()
        conf = None
        if self.rng.random() < 0.5:
            conf = np.clip(np.frombuffer(self.rng.randbytes(len(sym) * 4), np.float32).copy(), -1e30, 1e30)
            if self.rng.random() < 0.3:
                conf[: self.rng.randint(0, len(conf))] = np.nan
        return sym, conf

    def run(self, x) -> None:
        self.codec.decode_message(*x)


class Snapshots(_Entry):
    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from protocols import snapshot as snap

        self.snap = snap
        self.allowed = (snap.SnapshotError,)
        for n in (1, 3, 7):
            arrays = {f"layer{i}.w": np.frombuffer(rng.randbytes(4 * rng.randint(0, 50)), np.float32)
                      for i in range(n)}
            self.seeds.append(snap.encode_snapshot(snap.Snapshot(rng.randrange(99), rng.randrange(9), arrays)))

    def run(self, x) -> None:
        self.snap.decode_snapshot(x)


class Checkpoints(_Entry):
    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from protocols import snapshot as snap
        from protocols.security import RoomKey
        from wccl.runtime import recovery

        self.recovery = recovery
        self.allowed = (recovery.CheckpointError,)
        self.key = RoomKey(os.urandom(32))
        self.path = tmp / "fuzz.ckpt"
        for n in (1, 4):
            arrays = {f"w{i}": np.arange(rng.randint(1, 40), dtype=np.float32) for i in range(n)}
            recovery.save_checkpoint(self.path, {"session": 5, "node": "alice", "t0_us": 17},
                                     snap.Snapshot(3, 1, arrays), rng.randbytes(64), self.key)
            self.seeds.append(self.path.read_bytes())
        self.originals = set(self.seeds)

    def run(self, x) -> None:
        body = x
        if self.rng.random() < 0.5:  # behind the tag: as if the attacker had the key (the parser's own checks)
            _, _, rest = x.partition(b"\n")
            body = self.key.tag(rest, self.recovery.PERSON).hex().encode() + b"\n" + rest
        self.path.write_bytes(body)
        self.recovery.load_checkpoint(self.path, 5, self.key)
        if body is x and x not in self.originals:
            self.wrong += 1  # an altered file loaded without the key


class Config(_Entry):
    VALUES = ("-1", "0", "1e308", "-1e308", "nan", "inf", "99999999999999999999999", '"x"', '""', "true",
              "[]", "{}", '"../../../../etc/passwd"', '"/dev/zero"', '"\\u0000"', "[1, [2, [3]]]", '"' + "a" * 5000 + '"')

    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from wccl import config

        self.config = config
        self.allowed = (config.ConfigError,)
        root = Path(__file__).resolve().parents[2]
        for name in ("config.toml", "rooms/two-laptops-sim.toml", "rooms/fashion.toml", "rooms/intruder.toml"):
            p = root / name
            if p.is_file():
                self.seeds.append(p.read_bytes())
        self.path = tmp / "fuzz.toml"
        (tmp / "demo-room.key").write_bytes(os.urandom(32))

    def input(self):
        text = self.rng.choice(self.seeds)
        if self.rng.random() < 0.5:
            return mutate(self.rng, text, self.seeds)
        lines = text.decode().splitlines()
        i = self.rng.randrange(len(lines))
        op = self.rng.randrange(3)
        if op == 0 and "=" in lines[i]:  # a wrong type, a huge number, an odd path
            key = lines[i].split("=", 1)[0]
            lines[i] = f"{key}= {self.rng.choice(self.VALUES)}"
        elif op == 1:  # an unknown key
            lines.insert(i, f"{self.rng.choice(('bogus', 'rowz', 'key_file', 'nodes', 'steps'))} = {self.rng.choice(self.VALUES)}")
        else:  # a section dropped or repeated
            lines.insert(i, self.rng.choice(("[room]", "[[room.nodes]]", "[link]", "[training]", "[bogus]")))
        return "\n".join(lines).encode()

    def run(self, x) -> None:
        self.path.write_bytes(x)
        self.config.load_config(self.path)


class Idx(_Entry):
    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        import struct

        from wccl.training import data

        self.data = data
        self.allowed = (data.DataError,)
        imgs = np.frombuffer(rng.randbytes(10 * 28 * 28), np.uint8)
        self.seeds.append(struct.pack(">HBB3I", 0, 8, 3, 10, 28, 28) + imgs.tobytes())
        self.seeds.append(struct.pack(">HBBI", 0, 8, 1, 10) + bytes(rng.randrange(10) for _ in range(10)))
        self.path = tmp / "fuzz-idx-ubyte"

    def run(self, x) -> None:
        self.path.write_bytes(x)
        self.data.read_idx(self.path)


class CameraImages(_Entry):
    """Captures through a FrameDecoder (the one a rank runs), on its own event loop."""

    FRAMES, HOLD_S, SETTLE_S = 12, 0.3, 1.0

    def __init__(self, rng, tmp):
        super().__init__(rng, tmp)
        from actors.frame_decoder import FrameDecoder
        from protocols import layout as lay
        from protocols import transfer
        from protocols.messages import Capture, TransferArrived
        from protocols.security import Handshake, RoomKey
        from wccl.config import load_config
        from wccl.distributed.rank_node import collective_ladder
        from wccl.runtime.harness import ActorHarness
        from wccl.lab.attack import _Rank
        from wccl.room import SimulatedRoom

        root = Path(__file__).resolve().parents[2]
        cfg = load_config(root / "rooms" / "two-laptops-sim.toml")
        # The ladder's first layout of cells of 14 px or more: each of its frames reads from one capture
        # in this room (the finer ones need the several captures of a frame a real camera makes, which
        # this entry point does not film), so alice's real frames deliver her tensors.
        codec = next(c for c, _ in collective_ladder(cfg) if c.layout.cell_px >= 14)
        room = SimulatedRoom.from_config(cfg)
        key = RoomKey(bytes(range(32)))  # fixed, with fixed run nonces: the same captures every run
        alice = _Rank(0, key, cfg.room.session, nonce=0x0A11CE, message_bytes=codec.message_bytes)
        # Bob's decoder and alice have done their handshake, so alice's real frames are accepted and
        # delivered: the fuzzer can tell a wrong delivery from a right one.
        bob_hs = Handshake(1, 2, nonce=0x0B0B)
        bob_hs.heard(0, alice.hs.nonce, None, 0, 0)
        alice.rx.receive(transfer.status_message(session=cfg.room.session, sender=1, acks=(), message_bytes=1900,
                                                 run_nonce=bob_hs.nonce, trusts=0, echo=bob_hs.echo(), key=key))
        self.genuine = set()
        self.images: list[np.ndarray] = []
        for i in range(3):
            payload = rng.randbytes(4 * rng.randint(10, 300))  # a packet or two each
            self.genuine.add(payload)
            alice.post(payload, i + 1)
        # Each frame stays on alice's screen HOLD_S and is filmed 0.1 s after it went up, when the panel's
        # update, the webcam's exposure and its rolling readout (16 + 25 ms) all fall inside it; the
        # camera's auto exposure settles on the first frame for 1 s.
        for n in range(self.FRAMES):
            msg = alice.next_message(n * 100_000) if n else alice.status(0)
            img = lay.render(codec.encode_message(msg), codec.layout, cfg.screen.width, cfg.screen.height, sender=0, parity=n % 2)
            t = self.SETTLE_S + n * self.HOLD_S
            room.show_at("alice", img, 0.0 if n == 0 else t)
            self.images.append(room.capture_at("bob", t + 0.1, k=n))
        self.Capture, self.TransferArrived = Capture, TransferArrived
        self.loop = asyncio.new_event_loop()

        async def start() -> None:
            self.harness = ActorHarness(FrameDecoder, node="bob", capacity=8, overflow="drop_oldest", codec=codec,
                                        session=cfg.room.session, node_names=cfg.room.ranks,
                                        transfers=transfer.TransferAssembler(), key=key,
                                        handshake=bob_hs)
            await self.harness.__aenter__()

        self.start = start
        self.loop.run_until_complete(start())
        self.k = 0
        self.delivered = 0
        for img in self.images:  # first the real captures in order: the decoder must deliver alice's tensor
            self.run(img)

    def input(self):
        rng = self.rng
        img = rng.choice(self.images)
        op = rng.randrange(12)
        if op == 0:
            h, w = rng.randint(0, 40), rng.randint(0, 40)
            return np.frombuffer(rng.randbytes(h * w * 3), np.uint8).reshape(h, w, 3)
        if op == 1:
            return img.astype(rng.choice((np.uint16, np.float32, np.float64, np.int8, bool)))
        if op == 2:
            return np.zeros_like(img)
        if op == 3:
            return np.full_like(img, 255)
        if op == 4:
            return np.clip(img.astype(np.int16) * 4, 0, 255).astype(np.uint8)  # saturated
        if op == 5:
            return img[: rng.randint(0, img.shape[0]), : rng.randint(0, img.shape[1])]  # truncated
        if op == 6:
            return img[..., : rng.randint(0, 3)] if rng.random() < 0.5 else img[..., 0]  # channels missing
        if op == 7:
            noise = np.frombuffer(rng.randbytes(img.size), np.uint8).reshape(img.shape)
            return np.where(noise < 40, noise, img).astype(np.uint8)
        if op == 8:
            f = img.astype(np.float32)
            f[rng.randrange(img.shape[0])] = np.nan
            return f
        if op == 9:
            return np.ascontiguousarray(img[::-1, ::rng.choice((1, -1))])
        if op == 10:
            return np.frombuffer(rng.randbytes(img.size), np.uint8).reshape(img.shape)
        return img  # a real capture, unchanged

    def run(self, x) -> None:
        self.k += 1

        async def one():
            await self.harness.send(self.Capture(sender="bob", time=self.k * 0.01, image=x, seq=self.k))
            await self.harness.settle(rounds=3)

        self.loop.run_until_complete(one())
        for m in self.harness.of_type(self.TransferArrived):
            self.delivered += 1
            if m.payload not in self.genuine:
                self.wrong += 1
        self.harness.outputs.clear()
        task = self.harness.task
        if task.done():  # the decoder died on this image: a crash; a fresh one reads the next
            exc = task.exception() if not task.cancelled() else RuntimeError("decoder cancelled")
            self.loop.run_until_complete(self.start())
            raise exc

    def close(self) -> None:
        self.loop.run_until_complete(self.harness.stop())
        self.loop.close()


ENTRIES = {"transfer_frames": TransferFrames, "fec_symbols": FecSymbols,
           "snapshots": Snapshots, "checkpoints": Checkpoints, "config": Config, "idx": Idx,
           "camera_images": CameraImages}


def fuzz(seconds: float, only: list[str] | None = None, seed: int = 0, images_share: float = 0.4) -> dict:
    names = only or list(ENTRY_POINTS)
    unknown = set(names) - set(ENTRIES)
    if unknown:
        raise ValueError(f"unknown entry points: {', '.join(sorted(unknown))} (known: {', '.join(ENTRIES)})")
    byte_names = [n for n in names if n != "camera_images"]
    share = {n: (images_share if n == "camera_images" else (1 - images_share) / max(1, len(byte_names)))
             for n in names}
    if "camera_images" not in names or not byte_names:
        share = {n: 1 / len(names) for n in names}
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # counted, not logged
    out = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        with tempfile.TemporaryDirectory(prefix="wccl-fuzz-") as tmp:
            for i, name in enumerate(names):
                rng = random.Random(seed * 1000 + i)
                entry = ENTRIES[name](rng, Path(tmp))
                stats = Counter()
                first_crash = None
                t0 = time.perf_counter()
                budget = seconds * share[name]
                while time.perf_counter() - t0 < budget:
                    x = entry.input()
                    signal.setitimer(signal.ITIMER_REAL, HANG_S)
                    try:
                        entry.run(x)
                        stats["accepted"] += 1
                    except Hang:
                        stats["hangs"] += 1
                    except entry.allowed:
                        stats["refused"] += 1
                    except Exception as e:  # noqa: BLE001 - a crash: what the fuzzer is for
                        stats["crashes"] += 1
                        if first_crash is None:
                            tb = "".join(traceback.format_tb(e.__traceback__)[-3:])[-900:]
                            first_crash = f"{tb}{type(e).__name__}: {str(e)[:300]}"
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    stats["executions"] += 1
                entry.close()
                extra = {"tensors_delivered": entry.delivered} if hasattr(entry, "delivered") else {}
                out[name] = dict(**extra, executions=stats["executions"], crashes=stats["crashes"], hangs=stats["hangs"],
                                 wrong_deliveries=entry.wrong, refused=stats["refused"], accepted=stats["accepted"],
                                 seconds=round(time.perf_counter() - t0, 1),
                                 **({"first_crash": first_crash} if first_crash else {}))
    finally:
        signal.signal(signal.SIGALRM, old)
    byte_exec = sum(v["executions"] for k, v in out.items() if k in BYTE_ENTRY_POINTS)
    return dict(seconds=seconds, entry_points=out, byte_level_executions=byte_exec,
                camera_images=out.get("camera_images", {}).get("executions", 0),
                crashes=sum(v["crashes"] for v in out.values()), hangs=sum(v["hangs"] for v in out.values()),
                wrong_deliveries=sum(v["wrong_deliveries"] for v in out.values()))


def run(args: argparse.Namespace) -> int:
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    try:
        r = fuzz(args.seconds, only, args.seed, args.images_share)
    except ValueError as e:
        print(f"wccl.lab fuzz: {e}")
        return 2
    if args.json:
        print(json.dumps(r))
    else:
        for k, v in r["entry_points"].items():
            print(f"{k:16s} {v['executions']:9d} executions  {v['crashes']} crashes  {v['hangs']} hangs  "
                  f"{v['wrong_deliveries']} wrong  ({v['refused']} refused, {v['seconds']} s)")
            if "first_crash" in v:
                print("   first crash:", v["first_crash"].replace("\n", "\n   "))
    return 1 if r["crashes"] or r["hangs"] or r["wrong_deliveries"] else 0


if __name__ == "__main__":
    p = command_parser("wccl.lab.fuzz")
    add_arguments(p)
    raise SystemExit(run(p.parse_args()))
