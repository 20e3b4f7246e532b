"""`python -m wccl.lab attack --frames N --json`: forged, replayed, foreign and bit-flipped frames against a rank.

Two ranks, alice (sending tensors) and bob (reading them), run twice under
one room key at the frame-message level (what the error correction hands
on; pixels add nothing an attacker needs). The first run is filmed. During
the second, an attacker who sees both screens but has no key slips its own
frames in between alice's, N of each kind:

- random: random bytes; half of them start like a transfer frame (magic,
  version, alice's session and rank, a plausible length), so they reach the
  MAC check;
- forged: well-formed frames with everything an onlooker can copy (session,
  sender, alice's run nonce, trust mask, echo, acknowledgements) and a
  tensor of the attacker's, checked under a key of its own;
- replayed (another run): frames filmed in the first run, shown again;
- replayed (old): frames of this run, shown again more than the replay
  window after they first went up;
- foreign: frames of another session of the same room key;
- bit-flipped: alice's real frames of this run with 1 to 3 bits flipped.

Bob reads every frame through protocols.receiver.TransferReceiver (with
the run handshake, protocols.security.Handshake), the code his FrameDecoder
runs; alice and bob frame theirs as a rank's ScreenWriter does
(protocols.transfer: status frames every other frame until the handshake is
complete, a transfer shown until bob acknowledges it). With `--path
collectives` (the default) alice's tensors are a collective's transfers;
with `--path steps` alice is the built-in run's parameter server and bob a
worker: her tensors are her word on each step (op `avg`, seq the step, the
streams envelope of protocols.streams sealed with the tensor), the same
acknowledged transfers through the same receive path. Printed: per kind,
frames tried, accepted (must be 0) and refused by reason; and alice's
tensors: sent and acknowledged, delivered to bob, delivered wrong (must be 0).
"""

from __future__ import annotations

import struct

import argparse
import json
import os
import random
import time
from collections import Counter

from protocols import frames, streams, transfer
from protocols.receiver import TransferReceiver
from protocols.security import REPLAY_WINDOW_S, Handshake, RoomKey
from wccl.cli import command_parser
from wccl.keys import new_run_nonce

MESSAGE_BYTES = 1900  # a mid-sized layout's frame message
FRAME_S = 0.1  # one frame every 100 ms
SESSION = 1
KINDS = ("random", "forged", "replayed_other_run", "replayed_old", "foreign_session", "bit_flipped")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--frames", type=int, default=10_000, help="attack frames of each kind (default 10,000)")
    p.add_argument("--seed", type=int, default=0, help="the attacker's choices")
    p.add_argument("--path", choices=("collectives", "steps"), default="collectives",
                   help="what alice sends: a collective's transfers (collectives) or, as the built-in run's "
                   "server, its word on each step (steps)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def tensor_header(session: int, sender: int, tid: int, seq: int, payload: bytes,
                  stream: str | None = None) -> tuple[transfer.TransferHeader, bytes]:
    """The header (length and digest still empty) and bytes of one transfer from rank `sender` to the other
    of two: a collective's (`stream` None: float32), or the built-in run's tensor on `stream` (uint8,
    protocols.streams: epoch 0, base `seq`)."""
    if stream is None:
        return transfer.TransferHeader(session, sender, tid, seq, "allreduce", "float32", len(payload) // 4, 0, b"",
                                       0, 1 << (1 - sender)), payload
    data = streams.wrap(0, seq, payload)
    return transfer.TransferHeader(session, sender, tid, seq, stream, "uint8", len(data), 0, b"", 0,
                                   1 << (1 - sender)), data


class _Rank:
    """One rank's screen and camera at the message level: the ScreenWriter's framing, the receive path.

    `stream` None: its transfers are a collective's (allreduce, float32); else the built-in run's tensors
    on that stream (protocols.streams: uint8, its envelope first)."""

    def __init__(self, rank: int, key: RoomKey, session: int = SESSION, nonce: int | None = None,
                 stream: str | None = None, message_bytes: int = MESSAGE_BYTES) -> None:
        self.rank, self.key, self.session, self.stream = rank, key, session, stream
        self.message_bytes = message_bytes  # its frames' message size (a layout's LinkCodec.message_bytes)
        hs = Handshake(rank, 2, new_run_nonce() if nonce is None else nonce)
        self.rx = TransferReceiver(rank, 2, session, key, handshake=hs)
        self.hs = self.rx.handshake
        self.tid = 0
        self.out: list[transfer.Outgoing] = []
        self.turn = 0

    def post(self, payload: bytes, seq: int) -> bytes:
        """Show `payload` as this rank's next transfer, for the other rank; returns the transfer's bytes (a
        stream's: the envelope, epoch 0 and base `seq`, then the payload)."""
        self.tid += 1
        h, payload = tensor_header(self.session, self.rank, self.tid, seq, payload, self.stream)
        self.out.append(transfer.outgoing(h, payload, message_bytes=self.message_bytes, key=self.key,
                                          run_nonce=self.hs.nonce, repair=4))
        return payload

    def status(self, shown_us: int) -> bytes:
        return transfer.status_message(session=self.session, sender=self.rank, acks=self.rx.assembler.acks(2),
                                       message_bytes=self.message_bytes, shown_us=shown_us, run_nonce=self.hs.nonce,
                                       trusts=self.hs.trust_mask(), echo=self.hs.echo(), key=self.key)

    def next_message(self, shown_us: int) -> bytes:
        """Status frames every other frame until the handshake is complete; then the oldest transfer."""
        self.turn += 1
        if not self.out or (not self.hs.complete and self.turn % 2):
            return self.status(shown_us)
        return self.out[0].message(self.turn // 2, message_bytes=self.message_bytes, acks=self.rx.assembler.acks(2),
                                   shown_us=shown_us, run_nonce=self.hs.nonce, trusts=self.hs.trust_mask(),
                                   key=self.key)


def _tensor(rng: random.Random) -> bytes:
    return rng.randbytes(4 * rng.randint(1, 900))


def _run(key: RoomKey, frames_n: int, rng: random.Random, session: int = SESSION, attack=None, judged=None,
         stream: str | None = None) -> dict:
    """A run of alice sending tensors to bob (`stream`: as the built-in run's server, on that stream);
    `attack(t_us, alice, filmed)`: (kind, message) pairs to slip in after each of alice's frames, each handed
    with bob's verdict to `judged(kind, received)`."""
    alice, bob = _Rank(0, key, session, stream=stream), _Rank(1, key, session)
    sent: dict[int, bytes] = {}
    delivered: dict[int, bytes] = {}
    filmed: list[tuple[int, bytes]] = []
    seq = 0
    for n in range(frames_n):
        t_us = round(n * FRAME_S * 1e6)
        if len(alice.out) < 2:
            seq += 1
            data = alice.post(_tensor(rng), seq)
            sent[alice.tid] = data
        msg = alice.next_message(t_us)
        filmed.append((t_us, msg))
        r = bob.rx.receive(msg)
        if r.data is not None:
            delivered[r.frame.header.tid] = r.data
        for kind, m in (attack(t_us, alice, filmed) if attack else ()):
            r = bob.rx.receive(m)
            judged(kind, r)
            if r.data is not None:
                delivered[r.frame.header.tid] = r.data
        back = alice.rx.receive(bob.status(t_us + 50_000))  # bob's screen: acknowledgements and echo
        if back.peer_ack is not None:
            alice.out = [o for o in alice.out if not back.peer_ack.has(o.header.tid)]
    return dict(sent=sent, delivered=delivered, filmed=filmed, alice=alice, bob=bob)


def run_attack(frames_each: int, seed: int = 0, path: str = "collectives") -> dict:
    rng = random.Random(seed)
    key, wrong = RoomKey(os.urandom(32), "bench"), RoomKey(os.urandom(32), "attacker")
    t0 = time.perf_counter()
    stream = "avg" if path == "steps" else None

    def run_pair(*args, **kw) -> dict:
        return _run(*args, stream=stream, **kw)

    first = run_pair(key, 400, rng)  # the filmed run
    other_run = [m for _, m in first["filmed"]]
    foreign = [m for _, m in run_pair(key, 400, rng, session=SESSION + 1)["filmed"]]
    results = {k: dict(tried=0, accepted=0, refused=Counter()) for k in KINDS}
    window_us = int((REPLAY_WINDOW_S + 1) * 1e6)

    def forge(alice, t_us: int) -> bytes:
        """A status frame or a transfer frame (alice's kind of tensor) with what an onlooker copies from
        her frames (session, sender, run nonce, trust mask, echo), sealed and checked under another key."""
        if rng.random() < 0.3:
            return transfer.status_message(session=SESSION, sender=0, acks=(transfer.Ack(rng.randrange(99), 0),) * 2,
                                           message_bytes=MESSAGE_BYTES, shown_us=t_us, run_nonce=alice.hs.nonce,
                                           trusts=0b11, echo=alice.hs.echo(), key=wrong)
        tid = alice.tid + rng.randint(0, 3)
        h, data = tensor_header(SESSION, 0, tid, rng.randrange(1, 99), _tensor(rng), stream)
        out = transfer.outgoing(h, data, message_bytes=MESSAGE_BYTES, key=wrong, run_nonce=alice.hs.nonce)
        return out.message(0, message_bytes=MESSAGE_BYTES, shown_us=t_us, run_nonce=alice.hs.nonce,
                           trusts=alice.hs.trust_mask(), key=wrong)

    def random_frame(t_us: int) -> bytes:
        b = bytearray(rng.randbytes(MESSAGE_BYTES))
        if rng.random() < 0.5:
            b[:6] = bytes([frames.MAGIC, transfer.VERSION]) + SESSION.to_bytes(2, "big") + bytes([0, 0])
            psize = rng.randrange(transfer.PAYLOAD_ID_BYTES + 1, MESSAGE_BYTES - transfer.OVERHEAD_BYTES)
            at = struct.calcsize(">BBHBBIIBBHBII8s")  # where the header's packet_size is
            b[at:at + 2] = psize.to_bytes(2, "big")
        return bytes(b)

    def flip(msg: bytes) -> bytes:
        b = bytearray(msg)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b) if bytes(b) != msg else flip(msg)

    def attack(t_us: int, alice: _Rank, filmed: list) -> list[bytes]:
        out = []
        for kind in KINDS:
            if results[kind]["tried"] >= frames_each:
                continue
            if kind == "random":
                m = random_frame(t_us)
            elif kind == "forged":
                m = forge(alice, t_us)
            elif kind == "replayed_other_run":
                m = rng.choice(other_run)
            elif kind == "foreign_session":
                m = rng.choice(foreign)
            elif kind == "bit_flipped":
                m = flip(filmed[-1][1])
            else:  # replayed_old: a frame of this run, shown again after more than the replay window
                old = [msg for ts, msg in filmed[: max(0, len(filmed) - 1 - int(window_us / (FRAME_S * 1e6)))]
                       if ts < t_us - window_us]
                if not old:
                    continue
                m = rng.choice(old)
            results[kind]["tried"] += 1
            out.append((kind, m))
        return out

    def judged(kind: str, r) -> None:
        duplicate = getattr(r, "duplicate", False)
        if r.refused is None and not duplicate:
            results[kind]["accepted"] += 1
        results[kind]["refused"][r.refused or ("duplicate" if duplicate else "accepted")] += 1

    # Run 2: the frames alice and bob show, and the attacker's in between.
    frames_needed = frames_each + int(window_us / (FRAME_S * 1e6)) + 50
    state = run_pair(key, frames_needed, rng, attack=attack, judged=judged)
    wrong_tensors = sum(1 for tid, d in state["delivered"].items() if state["sent"].get(tid) != d)
    return dict(
        path=path, frames_each=frames_each, seconds=round(time.perf_counter() - t0, 1),
        kinds={k: dict(tried=v["tried"], accepted=v["accepted"], refused=dict(v["refused"])) for k, v in results.items()},
        tensors_sent=len(state["sent"]) - len(state["alice"].out),  # those bob acknowledged
        tensors_delivered=len(state["delivered"]),
        tensors_wrong=wrong_tensors, handshake_complete=state["bob"].hs.complete)


def run(args: argparse.Namespace) -> int:
    r = run_attack(args.frames, args.seed, args.path)
    if args.json:
        print(json.dumps(r))
    else:
        for k, v in r["kinds"].items():
            print(f"{k:20s} tried {v['tried']:6d}  accepted {v['accepted']}  refused {v['refused']}")
        print(f"alice's tensors: {r['tensors_sent']} sent and acknowledged, {r['tensors_delivered']} delivered, "
              f"{r['tensors_wrong']} wrong ({r['seconds']} s)")
    bad = sum(v["accepted"] for v in r["kinds"].values()) + r["tensors_wrong"]
    return 1 if bad else 0


if __name__ == "__main__":
    p = command_parser("wccl.lab.attack")
    add_arguments(p)
    raise SystemExit(run(p.parse_args()))
