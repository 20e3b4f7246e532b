"""Implementations by name: the one registry of every kind of part.

A *kind* ("codec", "algorithm", "actor.worker", "camera", "screen",
"medium") maps names to factories (a class, or a function that builds the
part). Config and CLI flags name a part; the code that builds one asks
the registry. Each kind names the modules that register its standard parts
(`sources`, declared where the kind is defined): they are imported the first
time the kind is looked up, so a name can be checked (a config, a flag)
before anything heavy is imported, and a new part is one file plus its
module's place in its kind's sources. A part registers itself, at the end
of its module: `REGISTRY.register(kind, name, factory)`, or as a class
decorator, `@REGISTRY.part(kind)` (named by the class's `name`). Tests
register their own parts the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class UnknownPart(LookupError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"no {kind} named {name!r} (known: {', '.join(known) or 'none'})")
        self.kind, self.name, self.known = kind, name, known


class Registry:
    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Callable[..., Any]]] = {}
        self._sources: dict[str, list[str]] = {}  # kind (its first word) -> the modules that register its parts
        self._loaded: dict[str, int] = {}  # kind -> how many of its sources are imported

    def sources(self, kind: str, *modules: str) -> None:
        """The modules that register `kind`'s standard parts ("actor" covers every "actor.ROLE")."""
        self._sources.setdefault(kind, []).extend(modules)

    def _load(self, kind: str) -> None:
        first = kind.split(".")[0]
        sources = self._sources.get(first, [])
        while (done := self._loaded.get(first, 0)) < len(sources):
            self._loaded[first] = done + 1  # (before the import: a source that looks its kind up does not loop)
            importlib.import_module(sources[done])

    def register(self, kind: str, name: str, factory: Callable[..., Any] | None = None, *, replace: bool = False):
        """Register `factory` as `kind`/`name`; usable as a decorator when `factory` is omitted."""

        def _add(f: Callable[..., Any]) -> Callable[..., Any]:
            parts = self._parts.setdefault(kind, {})
            if name in parts and parts[name] is not f and not replace:
                raise ValueError(f"{kind} {name!r} is already registered")
            parts[name] = f
            return f

        return _add(factory) if factory is not None else _add

    def part(self, kind: str) -> Callable[[type], type]:
        """A class decorator: register the class as `kind`/its `name`."""
        return lambda cls: self.register(kind, cls.name, cls)

    def unregister(self, kind: str, name: str) -> None:
        self._parts.get(kind, {}).pop(name, None)

    def parts(self, kind: str) -> dict[str, Callable[..., Any]]:
        """`kind`'s parts by name (a copy), in the order of the sources that register them, whatever order
        they were imported in (others after them, as they registered): an order a choice can break ties by."""
        self._load(kind)
        sources = self._sources.get(kind.split(".")[0], [])
        parts = self._parts.get(kind, {})

        def place(name: str) -> int:
            module = getattr(parts[name], "__module__", None)
            return sources.index(module) if module in sources else len(sources)

        return {name: parts[name] for name in sorted(parts, key=place)}

    def get(self, kind: str, name: str) -> Callable[..., Any]:
        parts = self.parts(kind)
        if name not in parts:
            raise UnknownPart(kind, name, sorted(parts))
        return parts[name]

    def names(self, kind: str) -> list[str]:
        return sorted(self.parts(kind))

    def create(self, kind: str, name: str, /, **kwargs: Any) -> Any:
        return self.get(kind, name)(**kwargs)


REGISTRY = Registry()
# The sources of protocols' own kinds (the runtime's, codecs, cameras, screens, media and actors:
# wccl/__init__.py).
# (in this order: protocols.algorithms.choose breaks a tie in cost by it)
REGISTRY.sources("algorithm", *(f"protocols.algorithms.{m}" for m in ("all_see_all", "ring", "star", "tree")))
