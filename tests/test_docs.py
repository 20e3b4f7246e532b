"""The docs say only what is so: every event, config key, CLI flag, module and file path that README.md,
docs/*.md and wccl/room/NOTES.md name in backticks exists in the code (a renamed or removed name left in a
doc fails here). And a test of that test: a doc naming a missing event or flag fails it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "wccl" / "room" / "NOTES.md"]
# Names of other programs' that the docs quote: v4l2-ctl's flag and controls (docs/real-laptops.md), torch's
# own test files and tests (docs/torch-tests.md).
EXTERNAL = {"--list-ctrls", "exposure_auto", "exposure_absolute", "require_backend_is_available"}
EXTERNAL_PREFIXES = ("torch/", "test/", "/")  # torch's tree; the dashboard's endpoints


def _code() -> tuple[set[str], set[str]]:
    """Every identifier and string word of the code, config and tests; every --flag they spell."""
    texts = []
    for folder in ("wccl", "actors", "protocols", "examples", "tests", "rooms", ".ci"):
        for p in (ROOT / folder).rglob("*"):
            if (p.is_file() and (p.suffix in (".py", ".toml", ".html", ".js") or p.name == "run")
                    and p.name != "test_docs.py"):
                texts.append(p.read_text(errors="replace"))
    texts += [(ROOT / "config.toml").read_text(), (ROOT / "pyproject.toml").read_text()]
    code = "\n".join(texts)
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)), set(re.findall(r"--[a-z][a-z0-9-]*", code))


def _module_exists(name: str, words: set[str]) -> bool:
    """`wccl.lab.rooms`, `protocols.discovery.steady_hold`: a module of ours, then names in it."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT / Path(*parts[:i])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return all(p in words for p in parts[i:])
    return False


def stale(text: str, doc: Path, words: set[str], flags: set[str]) -> list[str]:
    """What a doc names in backticks that the code does not have."""
    out = []
    for m in re.finditer(r"`([^`\n]+)`", text):
        tok = m.group(1).strip()
        if tok in EXTERNAL:
            continue
        out += [f"flag {f}" for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", tok) if f not in flags | EXTERNAL]
        if re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", tok) and tok not in words:
            if not (doc.name == "torch-tests.md" and tok.startswith("test_")):
                out.append(f"name {tok}")
        if (re.fullmatch(r"[\w./-]+\.(py|toml|md|json|png|jpg|key)", tok) and "/" in tok
                and not tok.startswith(EXTERNAL_PREFIXES) and not re.search(r"\b[A-Z]{2,}\b", tok)):
            if not (ROOT / tok).exists() and not (doc.parent / tok).exists():
                out.append(f"path {tok}")
        if re.fullmatch(r"(wccl|protocols|actors)(\.[a-z_0-9]+)+", tok) and not _module_exists(tok, words):
            out.append(f"module {tok}")
    return out


def test_the_docs_name_only_what_the_code_has():
    words, flags = _code()
    found = {doc.relative_to(ROOT).as_posix(): stale(doc.read_text(), doc, words, flags) for doc in DOCS}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_a_doc_that_names_a_missing_event_flag_path_or_module_fails():
    words, flags = _code()
    doc = ROOT / "docs" / "made-up.md"
    text = ("The run logs `layout_chosen` (`--old-flag`), see `docs/gone.md` and `wccl.training.nodes.no_such_thing`; "
            "`sight_known`, `--config`, `docs/limits.md` and `wccl.training.nodes.node_class` are there.")
    assert stale(text, doc, words, flags) == ["name layout_chosen", "flag --old-flag", "path docs/gone.md",
                                              "module wccl.training.nodes.no_such_thing"]


def test_the_config_overview_names_every_key_of_each_section_it_lists():
    """docs/config-overview.md: each top-level section's row lists exactly the keys its model has (a key added or
    renamed without the overview fails here)."""
    import re

    from wccl.configref import SECTIONS

    models = {name.replace("[]", ""): model for name, model in SECTIONS}
    text = (ROOT / "docs" / "config-overview.md").read_text()
    rows = re.findall(r"^\| `\[\[?([a-z_.]+)\]\]?` \| ([^|]*) \|", text, re.M)
    checked = 0
    for section, keys in rows:
        if section not in models:
            continue
        listed = set(re.findall(r"`([a-z_0-9]+)`", keys))
        # (a table of its own row, such as [[room.nodes]], is not listed again as a key of its parent)
        want = {k for k in models[section].model_fields if f"{section}.{k}" not in dict(rows)}
        assert listed == want, (section, listed ^ want)
        checked += 1
    assert checked >= 10
