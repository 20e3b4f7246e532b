"""`python -m wccl.configref > docs/config.md`: the configuration reference, generated from the models.

Consumes: the pydantic models of wccl.config (their fields, types, defaults
and bounds) and the comment beside each field in their source. Emits: one
Markdown table per section, so the reference can never drift from the code
(tests/test_config.py checks docs/config.md against this output).
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import typing

from pydantic import BaseModel

from wccl import config as C

SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("room", C.RoomConfig), ("room.nodes[]", C.NodeSpec), ("room.nodes[].changes[]", C.ChannelChange),
    ("room.nodes[].webcam", C.WebcamOptions),
    ("room.nodes[].window", C.WindowOptions), ("room.desktop", C.DesktopOptions), ("screen", C.ScreenConfig),
    ("camera", C.CameraConfig), ("link", C.LinkConfig), ("link.ladder[]", C.LadderStep),
    ("schedule", C.ScheduleConfig), ("schedule.phases[]", C.Phase), ("sync", C.SyncConfig),
    ("recovery", C.RecoveryConfig), ("training", C.TrainingConfig), ("collectives", C.CollectivesConfig),
    ("logging", C.LoggingConfig), ("supervision.default, supervision.actors.NAME", C.RestartPolicy),
    ("dashboard", C.DashboardConfig),
]
_FIELD = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$")


def _comments(cls: type) -> dict[str, str]:
    """The comment on each field's line (or on the comment lines just above it) in the class source."""
    out: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = _FIELD.match(line)
        if m and not stripped.startswith(("def ", "@", "return", '"""')):
            out[m.group(1)] = " ".join(filter(None, [" ".join(above), m.group(2) or ""])).strip()
        above = []
    return out


def _choices(names) -> str:
    return " / ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in names)


def _type(annotation, field=None) -> str:
    """A field's type in words: its choices for an enumerated one (Literal, or OneOf: a module's names, or a
    registry kind's, which tests may add to), else the type with `or` for unions."""
    checks = [m.func for m in (field.metadata if field is not None else ())
              if isinstance(getattr(m, "func", None), C.OneOf)]
    if checks:
        names = checks[0].names
        return f"str: a registered {names.kind}" if isinstance(names, C.Registered) else _choices(names())
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return _choices(args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _bounds(field) -> str:
    parts = []
    for meta in field.metadata:
        for name, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "len >="),
                          ("max_length", "len <="), ("pattern", "matches")):
            value = getattr(meta, name, None)
            if value is not None:
                parts.append(f"{sym} {value}")
    return ", ".join(parts)


def _default(field) -> str:
    if field.is_required():
        return "(required)"
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(table below)"
    return f"`{value!r}`".replace("|", "\\|")


def reference() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the models in `wccl/config.py` by `python -m wccl.configref` (a test checks that",
             "this file is current). Every key is optional except `room.nodes`; unknown keys are an error.", ""]
    for section, cls in SECTIONS:
        doc = inspect.getdoc(cls)
        lines += [f"## `[{section}]`", ""]
        if doc and cls.__doc__:
            lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
        lines += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        notes = _comments(cls)
        for name, field in cls.model_fields.items():
            lines.append(f"| `{name}` | {_type(field.annotation, field)} | {_default(field)} | {_bounds(field)} | "
                         f"{notes.get(name, '').replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(reference())
