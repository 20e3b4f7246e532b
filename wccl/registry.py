"""Implementations by name: how config (and tests) choose the parts of a node.

A registry maps a *kind* (e.g. "camera", "screen", "medium") and a *name*
(e.g. "room", "fake") to a factory. Config names the part; the supervisor
asks the registry. Tests register their own parts here, the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class UnknownPart(LookupError):
    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        super().__init__(f"no {kind} named {name!r} (known: {', '.join(known) or 'none'})")
        self.kind, self.name, self.known = kind, name, known


class Registry:
    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Callable[..., Any]]] = {}

    def register(self, kind: str, name: str, factory: Callable[..., Any] | None = None, *, replace: bool = False):
        """Register `factory` as `kind`/`name`; usable as a decorator when `factory` is omitted."""

        def _add(f: Callable[..., Any]) -> Callable[..., Any]:
            parts = self._parts.setdefault(kind, {})
            if name in parts and parts[name] is not f and not replace:
                raise ValueError(f"{kind} {name!r} is already registered")
            parts[name] = f
            return f

        return _add(factory) if factory is not None else _add

    def unregister(self, kind: str, name: str) -> None:
        self._parts.get(kind, {}).pop(name, None)

    def get(self, kind: str, name: str) -> Callable[..., Any]:
        parts = self._parts.get(kind, {})
        if name not in parts:
            raise UnknownPart(kind, name, sorted(parts))
        return parts[name]

    def names(self, kind: str) -> list[str]:
        return sorted(self._parts.get(kind, {}))

    def create(self, kind: str, name: str, /, **kwargs: Any) -> Any:
        return self.get(kind, name)(**kwargs)


REGISTRY = Registry()
