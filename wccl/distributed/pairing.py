"""Pairing over the light at start: the ranks of a room with no key agree on one (protocols.pairing).

`pair()` runs before a rank's node: a node of the ranks' own collectives (`CollectiveNode`, given), keyed by
nothing yet, carries the pairing's three collectives (commitments, reveals, the leader's sealed key); every
rank then shows the same six digits (large, on its screen: `code_picture`; and on its console), that node
drains and stops, and the key is used only once the people at the table confirm the digits (`confirm`);
then the rank's node starts under the new key.

Confirmations, by where the laptops are:
- `ConsolePeople`: a real laptop asks its person on the console (the code on every screen the same?);
- `TableFolder`: the people who see every screen, where one launcher started every rank (the simulated
  room, the desktop loopback): each rank writes the code its screen shows into a folder of the run's
  (wccl.launch makes it: WCCL_PAIR_TABLE), and they confirm when every rank's code is there and all are
  the same (a rank whose pairing failed writes why, and nobody confirms);
- `Table`: the same in one process (tests, ranks in one loop).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import cv2
import numpy as np
import structlog

from protocols.messages import CollectiveDone, CollectiveRequest, Drain
from protocols.pairing import LEADER, SALT_BYTES, SEALED_BYTES, Pairing, PairingError
from protocols.security import KEY_BYTES, NO_KEY, RoomKey
from wccl.config import WcclConfig

POLL_S = 0.1  # how often (room seconds) the simulated people look at the screens again


class People(Protocol):
    async def confirm(self, node: str, code: str | None, why: str = "") -> bool:
        """Whether the people at the table confirm `code` on `node`'s laptop (None: its pairing failed,
        `why`)."""


class Table:
    """The simulated people at a table of ranks in one process: they confirm once every rank shows its code,
    if all show the same (every rank says its word, a code or its failure, so nobody waits for ever)."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.codes: dict[str, str | None] = {}
        self._all = asyncio.Event()
        self.failed = asyncio.Event()  # some rank's pairing failed: the others need not finish theirs

    async def confirm(self, node: str, code: str | None, why: str = "") -> bool:
        self.codes[node] = code
        if code is None:
            self.failed.set()
        if set(self.codes) >= set(self.names):
            self._all.set()
        await self._all.wait()
        return None not in self.codes.values() and len(set(self.codes.values())) == 1


class TableFolder:
    """The simulated people at a table of ranks in several processes (wccl.launch): each rank's code in a
    file of `folder`; they confirm when all are there and the same."""

    def __init__(self, folder: str, names: list[str], wait_s: float = 300.0, stop: asyncio.Event | None = None) -> None:
        self.folder, self.names, self.wait_s, self.stop = Path(folder), list(names), wait_s, stop

    async def confirm(self, node: str, code: str | None, why: str = "") -> bool:
        """True once every rank's code is noted and all are the same; False at once for a failure noted,
        after `wait_s` (a rank whose process died notes nothing), or when `stop` is set."""
        tmp = self.folder / f".{node}.tmp"
        tmp.write_text(code if code is not None else f"failed: {why}")
        tmp.replace(self.folder / node)
        loop = asyncio.get_running_loop()  # (its clock: the room's, virtual or real)
        until = loop.time() + self.wait_s
        while True:
            seen = {n: (self.folder / n).read_text() for n in self.names if (self.folder / n).exists()}
            if any(v.startswith("failed") for v in seen.values()):
                return False
            if len(seen) == len(self.names):
                return len(set(seen.values())) == 1 and code is not None
            if loop.time() > until or (self.stop is not None and self.stop.is_set()):
                return False
            await asyncio.sleep(POLL_S)


class ConsolePeople:
    """A real laptop's person: the code on the console, and a question answered with y or n (on a thread of its
    own, so Esc in the window, `stop`, ends the wait). A console with nothing to read (stdin closed) is an
    error that says so, not a no."""

    def __init__(self, stop: asyncio.Event | None = None) -> None:
        self.stop = stop

    async def confirm(self, node: str, code: str | None, why: str = "") -> bool:
        if code is None:
            return False
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        sys.stderr.write(f"\nwccl: pairing code on {node}: {code}\n"
                         "      Does every laptop's screen and console show these same six digits? [y/N] ")
        sys.stderr.flush()

        def ask() -> None:
            line = sys.stdin.readline()
            try:
                loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(line))
            except RuntimeError:  # (the loop closed meanwhile: nobody waits for the answer any more)
                pass

        threading.Thread(target=ask, name="wccl-pairing-question", daemon=True).start()
        waits = [answer] + ([asyncio.ensure_future(self.stop.wait())] if self.stop is not None else [])
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits[1:]:
            w.cancel()
        if not answer.done():
            return False  # (stopped)
        line = answer.result()
        if line == "":
            raise PairingError("pairing: no console to answer on (its input is closed): run it in a terminal, or "
                               "give the room a key file")
        return line.strip().lower() in ("y", "yes")


def people_for(cfg: WcclConfig, names: list[str], stop: asyncio.Event | None = None, wait_s: float = 300.0) -> People:
    """Who confirms the code: where one launcher started every rank (the simulated room, the desktop loopback),
    the people who see all their screens (TableFolder, in the launcher's folder); on a real laptop, the
    person at this one (ConsolePeople)."""
    from wccl.keys import PAIR_TABLE_ENV

    folder = os.environ.get(PAIR_TABLE_ENV)
    if folder:
        return TableFolder(folder, names, wait_s, stop)
    if cfg.room.medium == "simulated":
        raise PairingError(f"a simulated room pairs with its people's folder ({PAIR_TABLE_ENV}, set by "
                           "python -m wccl.launch)")
    return ConsolePeople(stop)


async def pair(cfg: WcclConfig, node: str, medium: Any, people: People, node_class: Callable[..., Any], *,
               clock_origin: float = 0.0, timeout_s: float = 300.0, stop: asyncio.Event | None = None,
               random=os.urandom) -> tuple[RoomKey, tuple[Any, Any]]:
    """This rank's side of the room's pairing: the key for the run, once the people confirm the code, and the
    (camera, screen) it paired with, for the rank's node (one window and one webcam a laptop, opened once).
    Raises PairingError with the reason (the codes differ, a reveal does not match, the sealed key does not
    open, the collectives failed, `stop` was set) on this rank, its camera closed; every rank's people are
    told (`confirm` with None). `node_class`: the ranks' node (wccl.distributed.rank_node.CollectiveNode)."""
    structlog.contextvars.bind_contextvars(node=node)  # (this task's context: each rank's pairing its own)
    log = structlog.get_logger("wccl")
    ranks = cfg.room.ranks
    rank, world = ranks.index(node), len(ranks)
    me = Pairing(rank, world, random(KEY_BYTES), random(SALT_BYTES),
                 random(KEY_BYTES) if rank == LEADER else None, names=tuple(ranks))
    done: dict[int, CollectiveDone] = {}
    arrived = asyncio.Event()

    def on_done(m: CollectiveDone) -> None:
        done[m.seq] = m
        arrived.set()

    sup = node_class(cfg, node, medium, timeout_s=timeout_s, on_done=on_done, clock_origin=clock_origin,
                     key=NO_KEY, announce_key=False, stop=stop, keep_media=True)
    try:
        sup.build()
    except Exception as e:  # (its camera or window would not open): said to the people too, so nobody waits
        await people.confirm(node, None, str(e))
        raise
    started = sup.local_clock.now()
    log.info("pairing_started", ranks=world, leader=ranks[LEADER])
    task = asyncio.ensure_future(sup.run())

    failed = getattr(people, "failed", None)  # (people who hear at once when a rank's pairing fails)

    async def collective(seq: int, op: str, data: bytes) -> tuple[bytes, ...]:
        await sup.submit(CollectiveRequest(sender=node, time=0.0, seq=seq, op=op, dtype="uint8", numel=len(data),
                                           inputs=(data,), root=LEADER, ready_at=sup.local_clock.now(), handle=seq))
        while seq not in done:
            if task.done():
                raise PairingError(f"pairing: start-up stopped: {sup.greeted.problem or _failure(task)}")
            if failed is not None and failed.is_set():
                raise PairingError("pairing: another laptop's pairing failed (its console says why)")
            arrived.clear()
            waiters = [asyncio.ensure_future(arrived.wait())] + (
                [asyncio.ensure_future(failed.wait())] if failed is not None else [])
            await asyncio.wait([*waiters, task], return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
        m = done[seq]
        if m.error is not None:
            raise PairingError(f"pairing: {m.error}")
        return tuple(p[0] for p in m.parts)

    code, key, why = None, None, ""
    try:
        commitments = await collective(0, "allgather", me.commitment())
        reveals = await collective(1, "allgather", me.reveal())
        code = me.take(list(commitments), list(reveals))
        log.warning("pairing_code", code=code, say=f"pairing code {code}: every laptop must show the same")
        sealed = await collective(2, "broadcast", me.sealed() if rank == LEADER else bytes(SEALED_BYTES * (world - 1)))
        key = me.open(sealed[LEADER])
    except Exception as e:  # noqa: BLE001 - any failure is this rank's word to the people, never a silent wait
        code, why = None, str(e) if isinstance(e, PairingError) else f"pairing: {type(e).__name__}: {e}"
    finally:
        if not task.done():  # (a node stopped meanwhile, by Esc or its start-up giving up, takes no more)
            await sup.submit(Drain(sender=node, time=0.0, timeout_s=cfg.collectives.drain_s))
    try:
        await task
    except Exception as e:  # noqa: BLE001 - the pairing's node failed after its collectives: said, not raised
        log.warning("pairing_node_failed", error=str(e))
    sup.screen.show(code_picture(code, cfg.screen.width, cfg.screen.height))  # (until the node's own frames)
    try:
        confirmed = await people.confirm(node, code, why)
    except PairingError as e:  # (a console with nothing to read)
        confirmed, code, why = False, None, str(e)
    took = round(sup.local_clock.now() - started, 3)
    if code is None or not confirmed:
        sup.screen.show(code_picture(None, cfg.screen.width, cfg.screen.height))
        close = getattr(sup.camera, "close", None)
        if close is not None:
            close()
    if code is None:
        log.error("pairing_failed", problem=why, took_s=took)
        raise PairingError(why)
    if not confirmed:
        why = (f"pairing: the people at the table did not confirm the code {code}: the laptops' screens showed "
               "different codes (another screen took part in the pairing), or someone answered no. No key: the "
               "run does not start")
        log.error("pairing_failed", problem=why, code=code, took_s=took)
        raise PairingError(why)
    room_key = RoomKey(key, f"paired over the light (code {code})")
    log.info("paired", code=code, fingerprint=room_key.fingerprint, took_s=took)
    return room_key, (sup.camera, sup.screen)


def keep_once_greeted(sup: Any, cfg: WcclConfig, key: RoomKey) -> None:
    """With `key = "pair"` and a key_file, keep the paired key there (wccl.keys.keep_paired_key) once the
    rank's node has greeted its peers under it: proof that the others confirmed and use it too. Call after
    the node's build."""
    if cfg.room.key != "pair" or cfg.room.key_file is None:
        return

    def keep() -> None:
        from wccl.keys import keep_paired_key

        path = str(cfg.room.key_file)
        keep_paired_key(path, key.secret)
        structlog.get_logger("wccl").info("room_key_kept", path=path,
                                          say=f"later runs of this room read the key from {path}")

    sup.handshake.on_complete.append(keep)


def code_picture(code: str | None, width: int, height: int) -> np.ndarray:
    """What a screen shows while its people compare: the code in digits as tall as a fifth of the screen, and
    the question (or, when its pairing failed, that it did)."""
    img = np.full((height, width, 3), 255, np.uint8)
    lines = ([(code, height / 5), ("the same on every laptop? answer y on each", height / 24)] if code is not None
             else [("pairing failed", height / 8), ("see this laptop's console", height / 24)])
    y = height * 0.4
    for text, size in lines:
        scale = cv2.getFontScaleFromHeight(cv2.FONT_HERSHEY_SIMPLEX, max(8, int(size)), 4)
        (w, h), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 4)
        if w > width * 0.9:  # (a narrow screen: as wide as it allows)
            scale *= width * 0.9 / w
            (w, h), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 4)
        cv2.putText(img, text, (int((width - w) / 2), int(y + h / 2)), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 4,
                    cv2.LINE_AA)
        y += h * 2.2
    return img


def _failure(task: asyncio.Future) -> str:
    if task.cancelled():
        return "cancelled"
    e = task.exception()
    return str(e) if e is not None else "the node ended"
