"""`wccl COMMAND ...`: one command for everything; each `python -m wccl.X` keeps working.

    wccl run --config config.toml                  # the built-in run (python -m wccl.node)
    wccl launch --config ROOM.toml train.py ...    # your PyTorch script on every laptop (python -m wccl.launch)
    wccl lab bench|sweep|sync|collectives|train    # measure the link, collectives, training (python -m wccl.lab)
    wccl devices                                   # cameras and displays (python -m wccl.devices)
    wccl keys new|fingerprint ...                  # room keys (python -m wccl.keys)
    wccl room views|draw|fit|bench|serve ...    # the simulated room's tools (python -m wccl.room.X)

`wccl` alone prints the commands to stderr and exits 2 (`wccl --help`: to
stdout, exit 0); `wccl room` likewise lists the room's tools. `wccl COMMAND
--help` lists the command's options with their defaults.
"""

from __future__ import annotations

import argparse
import difflib
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


_INVOKED_AS: list[str] = []  # the command as the user typed it, when `wccl` runs it ("wccl run")


def command_parser(module: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """The one way a command builds its parser: named as the user typed it (`wccl run` through `wccl`,
    `python -m wccl.node` otherwise; `module` is the latter's), every option's default in its help
    (`HelpFormatter`, unless `formatter_class` says otherwise)."""
    kwargs.setdefault("formatter_class", HelpFormatter)
    prog = _INVOKED_AS[-1] if _INVOKED_AS else f"python -m {module.removesuffix('.__main__')}"
    return argparse.ArgumentParser(prog=prog, description=description, **kwargs)


COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("wccl.node", "run a room's nodes: the built-in training run"),
    "launch": ("wccl.launch", "run a PyTorch script on every laptop of a room (the 'wccl' backend)"),
    "lab": ("wccl.lab.__main__", "measure the link, collectives, training: bench, sweep, sync, collectives, train"),
    "devices": ("wccl.devices", "list this laptop's cameras and displays"),
    "doctor": ("wccl.doctor", "record what this laptop's camera sees into one file for a bug report, or read one"),
    "aim": ("wccl.aim", "aim the laptops: each screen shows its code and what its camera sees, until both directions read"),
    "keys": ("wccl.keys", "make a room key, or fingerprint one (new, fingerprint)"),
    "seeds": ("wccl.training.seeds", "the seed study of the built-in model"),
}
ROOM_COMMANDS: dict[str, tuple[str, str]] = {
    "views": ("wccl.room.views", "what each camera sees at a moment of a run (pictures)"),
    "draw": ("wccl.room.draw", "a room file seen from above: laptops, fields of view, who reads whom (a picture)"),
    "fit": ("wccl.room.fit", "fit the simulated webcam to real photos of screens"),
    "bench": ("wccl.room.bench", "render speed per profile"),
    "serve": ("wccl.room.serve", "the simulated room as a process (the launcher starts it)"),
}


def _columns(rows: list[tuple[str, str]]) -> list[str]:
    """`  name  description` lines, every description starting in the same column."""
    width = max(len(name) for name, _ in rows)
    return [f"  {name:<{width}}  {text}" for name, text in rows]


def usage() -> str:
    """The top-level help: every command, and the room's tools as `room NAME`."""
    rows = [(name, text) for name, (_, text) in COMMANDS.items()]
    rows += [(f"room {name}", text) for name, (_, text) in ROOM_COMMANDS.items()]
    return "\n".join(["usage: wccl COMMAND [options]   (wccl COMMAND --help lists its options)", "", "commands:",
                      *_columns(rows)])


def room_usage() -> str:
    """`wccl room`'s help: the simulated room's tools, its subcommands."""
    rows = [(name, text) for name, (_, text) in ROOM_COMMANDS.items()]
    return "\n".join(["usage: wccl room SUBCOMMAND [options]   (wccl room SUBCOMMAND --help lists its options)", "",
                      "the simulated room's tools:", *_columns(rows)])


def main(argv: list[str] | None = None) -> int:
    """Run one command's `main` with the rest of the arguments; its exit status, or 2 for no or no such command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog, table, help_text, what = "wccl", COMMANDS, usage, "command"
    if argv[:1] == ["room"]:
        prog, table, help_text, what = "wccl room", ROOM_COMMANDS, room_usage, "subcommand"
        argv = argv[1:]
    if not argv:
        print(help_text(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(help_text())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in table:
        near = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        print(f"{prog}: no {what} {name!r}{hint}\n\n{help_text()}", file=sys.stderr)
        return 2
    module = importlib.import_module(table[name][0])
    _INVOKED_AS.append(f"{prog} {name}")
    try:
        return int(module.main(rest) or 0)
    finally:
        _INVOKED_AS.pop()


if __name__ == "__main__":
    sys.exit(main())
