"""Field types whose errors say what was expected, and one way to turn a pydantic validation
error into a message that names the field and quotes the value."""
from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from spanflow.errors import QUOTE_CHARS

EXPECTED = "expected"  # an error whose message is "must be ...", followed by the value
INVALID = "invalid"  # an error whose message says all, value included


def expect(tp: Any, what: str) -> Any:
    """The type `tp`, where any error reads "must be {what}" and quotes the whole value
    (not the one item of a list that failed)."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(EXPECTED, "must be {what}", {"what": what}) from None

    return Annotated[tp, WrapValidator(check)]


def expected(what: str, **ctx) -> PydanticCustomError:
    """The error of a hand-written check, read like those of `expect`."""
    return PydanticCustomError(EXPECTED, "must be " + what, ctx or None)


def invalid(message: str) -> PydanticCustomError:
    """An error whose message stands alone (it quotes what it needs of the value)."""
    return PydanticCustomError(INVALID, message)  # (no context given: braces in it stay as they are)


def json_quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """`value` as JSON (what the document held: null, true, "a"), cut to about `limit` characters;
    a lone surrogate in a string is escaped, so the message can be written anywhere."""
    try:
        r = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # keys JSON has not (a tuple), a circular value: none come from JSON
        r = repr(value)
    r = r.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate (JSON's "\ud800") as its escape
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def _distinct(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("names repeat")
    return names


PositiveInt = expect(Annotated[int, Field(strict=True, ge=1)], "a positive integer")
NonNegativeInt = expect(Annotated[int, Field(strict=True, ge=0)], "a non-negative integer")
Names = expect(Annotated[list[Annotated[str, Field(strict=True, min_length=1)]], Field(min_length=1),
                         AfterValidator(_distinct)], "a non-empty list of distinct names")


def field_path(loc: tuple) -> str:
    """("done", "3", "bytes", 0) as done.3.bytes[0]; ("done", "x", "[key]") as "done.x (a key)"."""
    out = ""
    for part in loc:
        if part == "[key]":
            out += " (a key)"
        else:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_OBJECT = ("model_type", "model_attributes_type", "dict_type")


def _one(err: dict) -> str:
    kind, where, value = err["type"], field_path(err["loc"]), err.get("input")
    name = f"{where!r} " if where else ""
    if kind == "missing":
        return f"{where!r} is missing"
    if kind == "extra_forbidden":
        return f"{where!r} is not a known field"
    if kind == "json_invalid":
        return f"invalid JSON ({str(err.get('ctx', {}).get('error', ''))[:200]})"
    if kind == INVALID:
        return f"{where!r}: {err['msg']}" if where else err["msg"]
    msg = err["msg"]
    if kind in _OBJECT:
        msg = "must be a JSON object"
    elif kind == "value_error":  # a plain ValueError of a validator
        msg = msg.removeprefix("Value error, ")
    elif kind != EXPECTED:  # pydantic's own wording: "Input should be a valid integer"
        msg = msg.replace("Input should be ", "must be ", 1) if msg.startswith("Input should") else msg.lower()
    return f"{name}{msg}, got {json_quote(value, 100)}"


def explain(e: ValidationError) -> str:
    """The first problem `e` found, as "'field' must be ..., got VALUE", and how many more there are."""
    errors = e.errors(include_url=False)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return _one(errors[0]) + more


def first_field(e: ValidationError) -> str | None:
    """The field the first problem of `e` is in (its top-level name), or None for the whole object."""
    loc = e.errors(include_url=False)[0]["loc"]
    return str(loc[0]) if loc else None
