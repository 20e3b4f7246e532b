"""Checkpoints of the parameter server's state on its own disk.

A checkpoint file holds one JSON line (session, node, schedule, epoch,
applied, torch's RNG state) followed by the training state as a
protocols.snapshot blob. It is written to a temporary file and renamed, so a
kill mid-write leaves the previous checkpoint intact. Read by the server's
node when it resumes (`--resume` / `recovery.resume`); nothing else reads it:
other nodes learn the state only from the server's screen.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from protocols import snapshot as snap


class CheckpointError(Exception):
    """A checkpoint that cannot be used (missing, corrupt, or of another session)."""


def checkpoint_path(folder: str | Path, session: int, node: str) -> Path:
    return Path(folder) / f"session{session}-{node}.ckpt"


def save_checkpoint(path: Path, meta: dict[str, Any], state: snap.Snapshot, rng_state: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = dict(meta, applied=state.applied, epoch=state.epoch, rng=base64.b64encode(rng_state).decode())
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(head).encode() + b"\n")
        f.write(snap.encode_snapshot(state))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, session: int) -> tuple[dict[str, Any], snap.Snapshot, bytes]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    head, sep, blob = raw.partition(b"\n")
    try:
        meta = json.loads(head)
        state = snap.decode_snapshot(blob)
    except (json.JSONDecodeError, snap.SnapshotError) as e:
        raise CheckpointError(f"{path}: corrupt checkpoint ({e})") from None
    if not sep or meta.get("session") != session:
        raise CheckpointError(f"{path}: checkpoint of session {meta.get('session')}, this room is session {session}")
    return meta, state, base64.b64decode(meta.pop("rng"))
