"""Room keys: make one, tell two apart, and find the one a run uses.

    python -m wccl.keys new room.key          32 random bytes (mode 0600); copy the file to every laptop
    python -m wccl.keys fingerprint room.key  8 hex digits: the same on every laptop of the room
    python -m wccl.keys fingerprint --config rooms/two-laptops.toml

(`wccl keys ...` is the same command.)

A room names its key with `[room] key_file = "room.key"` or `key_env =
"WCCL_ROOM_KEY"` (a passphrase in that environment variable, stretched with
scrypt). A room of real devices that names neither pairs over the light at
start (`pairs`: wccl.distributed.pairing, protocols.pairing): its ranks agree
on a key for the run and the people at the table check the six digits every
screen shows. A simulated room that names neither gets a fresh random key
for each run (`ephemeral`): the process that starts the run (wccl.node, or
wccl.launch for its ranks through WCCL_RUN_KEY) draws it, as if it had been
copied to every laptop; with `key = "pair"` it pairs as real devices do.
`key = "pair"` with a key_file keeps the paired key in that file, and later
runs read it instead of pairing. A room with `key = "none"` runs
unauthenticated, and says so loudly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from protocols.security import KEY_BYTES, NO_KEY, KeyError_, RoomKey, key_from_passphrase
from wccl.config import ConfigError
from wccl.cli import command_parser

RUN_KEY_ENV = "WCCL_RUN_KEY"  # the ephemeral key of a simulated run, set by wccl.launch for its ranks
# A simulated run that pairs: the folder where the people at the table note the code each screen shows
# (wccl.distributed.pairing.TableFolder), set by wccl.launch for its ranks.
PAIR_TABLE_ENV = "WCCL_PAIR_TABLE"


def new_run_nonce() -> int:
    """A sender's run nonce: random, never 0 (0 means 'none seen' in an echo)."""
    while True:
        n = int.from_bytes(os.urandom(8), "big")
        if n:
            return n


def read_key_file(path) -> bytes:
    """A key file's 32 bytes (raw, or 64 hex digits with optional whitespace)."""
    try:
        raw = open(path, "rb").read(4096)
    except FileNotFoundError:
        raise KeyError_(f"no key file at {path} (make one with: python -m wccl.keys new {path})") from None
    except (OSError, ValueError) as e:
        raise KeyError_(f"cannot read key file {str(path)[:200]}: {getattr(e, 'strerror', None) or e}") from None
    if len(raw) == KEY_BYTES:
        return raw
    text = raw.strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyError_(f"{path} is not a room key ({KEY_BYTES} bytes or {2 * KEY_BYTES} hex digits)")
    return key


def room_key(cfg, *, ephemeral: bytes | None = None) -> RoomKey:
    """The key a node of this room uses. `ephemeral`: the run's key if the room is simulated and names none
    (else WCCL_RUN_KEY from the environment); raises ConfigError for a key that cannot be had."""
    room = cfg.room
    if room.key == "none":
        return NO_KEY
    if pairs(cfg):
        raise ConfigError("room.key: this room gets its key by pairing over the light when its ranks start "
                          "(wccl.distributed.pairing), not before")
    try:
        if room.key_file is not None:
            return RoomKey(read_key_file(room.key_file), f"file {room.key_file}")
        if room.key_env is not None:
            value = os.environ.get(room.key_env)
            if value is None:
                raise ConfigError(f"room.key_env: the environment variable {room.key_env} is not set "
                                  "(it holds the room's passphrase)")
            return RoomKey(key_from_passphrase(value), f"passphrase in ${room.key_env}")
    except KeyError_ as e:
        raise ConfigError(f"room.key_file: {e}") from None
    if room.medium == "simulated":
        if ephemeral is None and os.environ.get(RUN_KEY_ENV):
            try:
                ephemeral = bytes.fromhex(os.environ[RUN_KEY_ENV])
            except ValueError:
                raise ConfigError(f"{RUN_KEY_ENV} is not a hex room key") from None
        if ephemeral is not None:
            try:
                return RoomKey(ephemeral, "ephemeral")
            except KeyError_ as e:
                raise ConfigError(f"{RUN_KEY_ENV}: {e}") from None
    return NO_KEY


def pairs(cfg) -> bool:
    """Whether this room's ranks pair over the light for their key: `key = "pair"` (unless its key_file
    already holds a key paired earlier), or real devices whose room names no key (`key = "auto"`, no
    key_file or key_env)."""
    room = cfg.room
    if room.key == "pair":
        return room.key_file is None or not Path(room.key_file).exists()
    return room.key == "auto" and room.medium != "simulated" and room.key_file is None and room.key_env is None


def keep_paired_key(path: str, secret: bytes) -> None:
    """Keep a paired key in the room's key_file for later runs (mode 0600, written whole; a file that another
    rank of this machine wrote first is left as it is)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    try:
        os.link(tmp, path)  # (whole or not at all: another rank reads either no file or the key)
    except FileExistsError:
        if read_key_file(path) != secret:
            raise KeyError_(f"{path} holds another key than the one just paired: remove it and pair again")
    finally:
        os.unlink(tmp)


def new_ephemeral() -> bytes:
    return os.urandom(KEY_BYTES)


def log_key(log, key: RoomKey) -> None:
    """Say which key a node uses; loudly if none."""
    if key.authenticated:
        log.info("room_key", source=key.source, fingerprint=key.fingerprint, frames="authenticated",
                 payloads="encrypted")
    else:
        log.warning("frames_unauthenticated",
                    why="no room key: anything with a screen in view can inject frames and any camera can "
                        "read the tensors; leave out [room] key = \"none\" to pair over the light, or set key_file "
                        "(python -m wccl.keys new room.key) or key_env")


def write_key(path: Path, force: bool = False) -> None:
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists: a room key is never overwritten (use --force to replace it)")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path}: no folder {path.parent} to write the key in (make it first, or give "
                                "another path)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(KEY_BYTES))


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.keys", "Room keys: make one, fingerprint one.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    new = sub.add_parser("new", help="write a new random room key (32 bytes, mode 0600)")
    new.add_argument("path", type=Path)
    new.add_argument("--force", action="store_true", help="replace an existing key file")
    fp = sub.add_parser("fingerprint", help="8 hex digits naming a key (compare them across laptops)")
    fp.add_argument("path", type=Path, nargs="?")
    fp.add_argument("--config", type=Path, help="the key a room file names")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "new":
            write_key(args.path, args.force)
            print(f"{args.path}: new room key, fingerprint {RoomKey(read_key_file(args.path)).fingerprint}; "
                  "copy this file to every laptop of the room, and to nobody else")
            return 0
        if args.config is not None:
            from wccl.config import load_config
            key = room_key(load_config(args.config))
        elif args.path is not None:
            key = RoomKey(read_key_file(args.path))
        else:
            ap.error("fingerprint: give a key file or --config")
        print(key.fingerprint)
        return 0
    except (KeyError_, ConfigError, FileExistsError, OSError) as e:
        print(f"wccl.keys: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
