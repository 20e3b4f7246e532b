"""Intruder: a laptop in the room without the room key, showing frames nobody may accept (a test).

Consumes: `Capture` (its own camera: it films the other screens). Emits:
nothing; it drives the injected screen.

It reads every code it sees down to the frame message (the error
correction is public; the key is not), keeps what it filmed, and every
`hold_s` shows one attack frame, in turn:

- `random`: random message bytes under the error correction (a frame that
  reads cleanly and means nothing);
- `forged`: a transfer frame with everything an onlooker can copy from a
  real one (session, sender, run nonce, acknowledgements) and a tensor of
  its own, its check made under a key of the intruder's;
- `replayed`: a real frame filmed more than the replay window ago (or, with
  `replay_from`, one filmed in an earlier run and saved with `record_to`,
  shown again in the order filmed: its start-up and pairing while this
  run's start up; then the two take turns);
- `bit_flipped`: the latest real frame with 1 to 3 bits flipped (under the
  error correction, so the flips survive it).

Counts what it showed by kind (`results["intruder"]`). What it filmed is
the node's `filmed` list (given by wccl.intruder), so a restarted instance
goes on with it, and `record_to` always holds everything the node filmed.
A room with an intruder must end exactly as the same room without it.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from protocols import layout, transfer
from protocols.link import LinkCodec
from protocols.messages import Capture
from protocols.security import REPLAY_WINDOW_S, RoomKey
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY
from wccl.imaging import reader
from wccl.media import Screen

KINDS = ("random", "forged", "replayed", "bit_flipped")
FILMED_MAX = 4000


class Intruder(Actor):
    consumes = (Capture,)
    mailbox = (2, Overflow.DROP_OLDEST)  # what it films: only the latest matters

    def __init__(self, ctx: ActorContext, screen: Screen, codec: LinkCodec, screen_w: int, screen_h: int,
                 hold_s: float, session: int, world: int, seed: int = 0, record_to: str | None = None,
                 replay_from: str | None = None, replay_window_s: float = REPLAY_WINDOW_S,
                 filmed: list[tuple[float, int, bytes]] | None = None) -> None:
        super().__init__(ctx)
        self.screen, self.codec = screen, codec
        self.screen_w, self.screen_h = screen_w, screen_h
        self.hold_s, self.session, self.world = hold_s, session, world
        self.replay_window_s = replay_window_s  # the room's: a replay must be older than this to be one
        self.rng = random.Random(seed)
        self.own_key = RoomKey(os.urandom(32), "intruder")
        self.tracker = reader.QuadTracker(codec.layout)
        self.model = reader.ColourModel(codec.layout)
        # (when, sender strip, message); the node's list, kept across this actor's restarts
        self.filmed: list[tuple[float, int, bytes]] = filmed if filmed is not None else []
        self.record_to = Path(record_to) if record_to else None
        self.old_run = [bytes.fromhex(x) for x in Path(replay_from).read_text().split()] if replay_from else []
        self.results = ctx.results.setdefault("intruder", {f"shown_{k}": 0 for k in KINDS} | {"filmed": 0})
        self._turn = 0
        self._old_at = 0  # the next frame of the earlier run to show again
        self._replay_turn = 0  # replays take turns: the earlier run's, then this run's

    async def handle(self, msg: Capture) -> None:
        for quad in self.tracker(msg.image):
            code = reader.read_quad(msg.image, quad, self.codec.layout, self.model)
            if code is None or code.mixed or code.sender is None:
                continue
            try:
                message, _ = self.codec.decode_message(code.symbols, code.confidence)
            except Exception:  # noqa: BLE001 - an unreadable frame is nothing to film
                continue
            if self.filmed and self.filmed[-1][2] == message:
                continue
            self.filmed.append((self.clock.now(), code.sender, message))
            self.results["filmed"] += 1
            if len(self.filmed) > FILMED_MAX:
                del self.filmed[: FILMED_MAX // 4]

    async def run(self) -> None:
        await self.run_beside(self._show())

    def _attack(self) -> tuple[str, int, bytes] | None:
        kind = KINDS[self._turn % len(KINDS)]
        self._turn += 1
        mb = self.codec.message_bytes
        if kind == "random":
            return kind, self.rng.randrange(self.world), self.rng.randbytes(mb)
        if not self.filmed:
            return None
        _, sender, last = self.filmed[-1]
        if kind == "forged":
            data = self.rng.randbytes(4 * self.rng.randint(1, 200))
            # What anyone can read off a real frame's header (the check vouches for it, but hides nothing).
            nonce, tid = transfer.peek(last)
            tid += self.rng.randint(0, 2)
            h = transfer.TransferHeader(self.session, sender % self.world, max(tid, 1), self.rng.randrange(1, 50),
                                        "allreduce", "float32", len(data) // 4, 0, b"", 0, (1 << self.world) - 1)
            out = transfer.outgoing(h, data, message_bytes=mb, sealed=True)  # (made-up bytes: nothing to seal)
            return kind, sender, out.message(0, message_bytes=mb, run_nonce=nonce, trusts=(1 << self.world) - 1,
                                             key=self.own_key)
        if kind == "replayed":
            now = self.clock.now()
            old = [f for f in self.filmed if f[0] < now - self.replay_window_s - 1.0]
            # (once this run has frames old enough, the two kinds take turns)
            self._replay_turn ^= 1
            if self.old_run and (not old or self._replay_turn):
                # The earlier run in the order it was filmed: its start-up (and pairing) while this run starts up
                message = self.old_run[self._old_at % len(self.old_run)]
                self._old_at += 1
                return kind, self.rng.randrange(self.world), message
            if not old:
                return None
            _, sender, message = self.rng.choice(old)
            return kind, sender, message
        b = bytearray(last)
        for _ in range(self.rng.randint(1, 3)):
            b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return kind, sender, bytes(b)

    async def _show(self) -> None:
        parity = 0
        while True:
            await self.clock.sleep_until(self.clock.now() + self.hold_s)
            attack = self._attack()
            if attack is None:
                continue
            kind, sender, message = attack
            image = layout.render(self.codec.encode_message(message), self.codec.layout, self.screen_w, self.screen_h,
                                  sender=sender, parity=parity)
            parity ^= 1
            self.screen.show(image)
            self.results[f"shown_{kind}"] += 1

    async def finish(self) -> None:
        if self.record_to is not None:
            self.record_to.write_text("\n".join(m.hex() for _, _, m in self.filmed) + "\n")
        self.log.info("intruder_done", **self.results)
        await asyncio.sleep(0)


REGISTRY.register("actor.intruder", "standard", Intruder)
