"""Checkpoints of the parameter server's state on its own disk.

A checkpoint file holds a tag line (64 hex digits: a keyed BLAKE2b-256 of
everything after it, under the room key), one JSON line (session, node,
schedule, epoch, applied, torch's RNG state) and the training state as a
protocols.snapshot blob. A truncated or altered file, or one written under
another room key, fails the tag and is refused whole: nothing of it is
loaded. It is written to a temporary file and renamed, so a
kill mid-write leaves the previous checkpoint intact. Read by the server's
node when it resumes (`--resume` / `recovery.resume`); nothing else reads it:
other nodes learn the state only from the server's screen.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
from pathlib import Path
from typing import Any

from protocols import snapshot as snap
from protocols.security import NO_KEY, RoomKey

PERSON = b"wccl-ckpt"


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, corrupt, or of another session)."""


def checkpoint_path(folder: str | Path, session: int, node: str) -> Path:
    return Path(folder) / f"session{session}-{node}.ckpt"


def save_checkpoint(path: Path, meta: dict[str, Any], state: snap.Snapshot, rng_state: bytes,
                    key: RoomKey = NO_KEY) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = dict(meta, applied=state.applied, epoch=state.epoch, rng=base64.b64encode(rng_state).decode())
    body = json.dumps(head).encode() + b"\n" + snap.encode_snapshot(state)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # (two runs of one room file never write one temporary file)
    with open(tmp, "wb") as f:
        f.write(key.tag(body, PERSON).hex().encode() + b"\n")
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, session: int, key: RoomKey = NO_KEY) -> tuple[dict[str, Any], snap.Snapshot, bytes]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None
    tag, sep, body = raw.partition(b"\n")
    ok = bool(sep) and hmac.compare_digest(tag, key.tag(body, PERSON).hex().encode())
    if not ok:
        raise CheckpointError(f"{path}: refused: the checkpoint is truncated or altered, or was written under "
                              "another room key (its tag does not match); nothing of it was loaded")
    head, sep, blob = body.partition(b"\n")
    try:
        meta = json.loads(head)
        state = snap.decode_snapshot(blob)
        rng = base64.b64decode(meta.pop("rng"), validate=True)
    except (ValueError, snap.SnapshotError, KeyError, TypeError, AttributeError) as e:  # JSON, UTF-8, base64 too
        raise CheckpointError(f"{path}: corrupt checkpoint ({type(e).__name__}: {e})") from None
    if not sep:
        raise CheckpointError(f"{path}: corrupt checkpoint (no training state)")
    if meta.get("session") != session:
        raise CheckpointError(f"{path}: checkpoint of session {meta.get('session')}, this room is session {session}")
    return meta, state, rng
