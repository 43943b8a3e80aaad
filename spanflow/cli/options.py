"""Command-line flags made from an options dataclass: one flag per field that carries a "help"
in its metadata, named after the field (`max_wait_ms` -> `--max-wait-ms`), typed and
defaulted by the field itself. The dataclass is the one source of names, units and defaults."""
from __future__ import annotations

import argparse
import dataclasses


def _scalar(annotation) -> type:
    """The flag's type: the first of int/float/str in an annotation like `int | None`."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if name in str(text).replace("|", " ").split():
            return typ
    return str


def add_options(p, cls, *, skip: tuple[str, ...] = (), keep=None, unset=None,
                words: dict[str, str] | None = None) -> None:
    """Add a flag for every documented field of dataclass `cls` not in `skip`; with `keep(name)`,
    only for the fields it keeps (a task's own). `unset(name)`: what an unset field
    gets, said in its help ahead of the field's own note (None: the note alone). `words`: what a
    help's `{name}` stands for (a task's own word, such as its dev score)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if f.name in skip or "help" not in meta or (keep is not None and not keep(f.name)):
            continue
        target = p
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = p.add_argument_group(meta["group"], meta.get("group_help"))
            target = groups[meta["group"]]
        flag = "--" + f.name.replace("_", "-")
        text = meta["help"].format_map(words) if words else meta["help"]
        typ = _scalar(f.type)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if typ is bool:
            target.add_argument(flag, action="store_true", help=text)
            continue
        said = unset(f.name) if unset else None
        unset_note = meta.get("unset")
        if said:
            rest = unset_note.removeprefix("per task").lstrip(", ") if unset_note else ""
            unset_note = said + (f"; {rest}" if rest else "")
        shown = (f"[%(default)s{'; ' + unset_note if unset_note else ''}]" if default is not None
                 else f"[{unset_note or 'none'}]")
        target.add_argument(flag, type=typ, default=default, choices=meta.get("choices"), help=f"{text} {shown}")


def options_from(cls, a: argparse.Namespace, **given):
    """An instance of `cls` from the parsed flags (fields without a flag keep their defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(a).items() if k in names}
    return cls(**{**values, **given})
