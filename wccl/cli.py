"""`wccl COMMAND ...`: one command for everything; each `python -m wccl.X` keeps working.

    wccl run --config config.toml                 # the built-in run (python -m wccl.node)
    wccl launch --config ROOM.toml train.py ...   # your PyTorch script on every laptop (python -m wccl.launch)
    wccl lab bench|sweep|sync|collectives|train   # measure the link, collectives, training (python -m wccl.lab)
    wccl devices                                  # cameras and displays (python -m wccl.devices)
    wccl room snapshot|fit|bench|serve ...        # the simulated room's tools (python -m wccl.room.X)

`wccl COMMAND --help` lists the command's options with their defaults.
"""

from __future__ import annotations

import argparse
import importlib
import sys


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless it says it already, or there is none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default in (None, False, argparse.SUPPRESS)
                or isinstance(action, argparse._HelpAction)):
            return text
        return (text + " " if text else "") + "(default: %(default)s)"


COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("wccl.node", "run a room's nodes: the built-in training run"),
    "launch": ("wccl.launch", "run a PyTorch script on every laptop of a room (the 'wccl' backend)"),
    "lab": ("wccl.lab.__main__", "measure the link, collectives, training: bench, sweep, sync, collectives, train"),
    "devices": ("wccl.devices", "list this laptop's cameras and displays"),
    "seeds": ("wccl.training.seeds", "the seed study of the built-in model"),
}
ROOM_COMMANDS: dict[str, tuple[str, str]] = {
    "snapshot": ("wccl.room.snapshot", "what each camera sees at a moment of a run (pictures)"),
    "fit": ("wccl.room.fit", "fit the simulated webcam to real photos of screens"),
    "bench": ("wccl.room.bench", "render speed per profile"),
    "serve": ("wccl.room.serve", "the simulated room as a process (the launcher starts it)"),
}


def _usage() -> str:
    lines = ["usage: wccl COMMAND [options]   (wccl COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in COMMANDS.items()]
    lines += [f"  room {name:<4} {text}" for name, (_, text) in ROOM_COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    table = COMMANDS
    if name == "room":
        if not rest or rest[0] in ("-h", "--help"):
            print(_usage())
            return 0 if rest else 2
        name, rest, table = rest[0], rest[1:], ROOM_COMMANDS
    if name not in table:
        print(f"wccl: no command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(table[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
