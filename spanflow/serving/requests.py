"""The body of a task route, as a pydantic schema: the texts, in the field the task names
(`Task.request_field`), the model, and the server's limits on both. Other fields are the task's
own options (`Task.request_options`, which its `request_params` reads) and are kept; a field
of neither is refused."""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, create_model
from pydantic_core.core_schema import ValidationInfo

from spanflow.schemas import expect, expected, explain, first_field, invalid
from spanflow.schemas.fields import json_quote


@dataclass(frozen=True)
class Limits:
    """What one request may hold (--max-texts, --max-text-chars)."""

    max_texts: int
    max_text_chars: int


class InvalidRequest(Exception):
    """A body that does not fit its route's schema; `field` names the field at fault."""

    def __init__(self, message: str, field: str | None):
        super().__init__(message)
        self.message, self.field = message, field


def _token_ids(texts) -> bool:
    return isinstance(texts, list) and bool(texts) and all(
        _int(t) or (isinstance(t, list) and t and all(_int(x) for x in t)) for t in texts)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON's true is no token id


def _texts(value, info: ValidationInfo) -> list[str]:
    """One text or a list of texts, within the limits in the validation context."""
    texts = [value] if isinstance(value, str) else value
    if _token_ids(texts):  # what OpenAI's embeddings API also accepts
        raise invalid("holds token ids; this server tokenizes itself: send the texts")
    if not isinstance(texts, list):
        raise expected("a string or a list of strings")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:  # which one: a list of thousands quoted whole would hide it
        raise invalid(f"text {bad} must be a string, got {json_quote(texts[bad], 100)}")
    limits: Limits = info.context
    if len(texts) > limits.max_texts:
        raise invalid(f"{len(texts)} texts in one request; the limit is {limits.max_texts} (--max-texts)")
    for i, t in enumerate(texts):
        if len(t) > limits.max_text_chars:
            raise invalid(f"text {i} has {len(t)} characters; the limit is {limits.max_text_chars} "
                          "(--max-text-chars)")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON's \ud800 escapes decode to lone surrogates
            raise invalid(f"text {i} is not valid Unicode: a lone surrogate at character {e.start}") from None
    return texts


Texts = Annotated[list[str], PlainValidator(_texts)]
ModelName = expect(Annotated[str, Field(strict=True)], "a model name (a string)")


class RequestBody(BaseModel):
    """What every task route reads; `texts` comes from the task's own field name."""

    model_config = ConfigDict(extra="allow")

    model: ModelName | None = None  # which served model; any name where one model of the task is loaded
    texts: Texts


@functools.cache
def body_schema(field: str) -> type[RequestBody]:
    """The schema of the body of a route whose texts are in `field`."""
    return create_model(f"RequestBody_{field}", __base__=RequestBody, texts=(Texts, Field(alias=field)))


# the fields other APIs send texts in, and whose they are: a body that has one of these instead of
# the route's own field is told which it sent, not only what is missing (they are not taken in its
# place: the response is this route's shape, which a client of the other API would not read)
TEXT_FIELDS = {"input": "OpenAI's embeddings field", "inputs": "Text Embeddings Inference's field",
               "texts": "spanflow's field", "text": None, "sentences": None, "documents": None}
ROUTE_FIELDS = {"input": "as OpenAI's embeddings API does"}
# the fields of protocols that refuse an empty list (OpenAI answers one with an error; its client reads a
# 200 without data as a failure of its own); spanflow's own routes answer one with no results
NOT_EMPTY = {"input"}


def _missing(body: dict, field: str) -> InvalidRequest:
    """The error for a body without the route's text field, naming what it sent instead."""
    takes = f"this endpoint takes the texts in '{field}'" + (f", {ROUTE_FIELDS[field]}" if field in ROUTE_FIELDS
                                                             else "") + ": a string or a list of strings"
    sent = next((k for k in body if k in TEXT_FIELDS and k != field), None)
    if sent is not None:
        whose = f" ({TEXT_FIELDS[sent]})" if TEXT_FIELDS[sent] else ""
        return InvalidRequest(f"'{field}' is missing; got '{sent}'{whose}: {takes}", field)
    keys = ", ".join(repr(str(k)[:40]) for k in list(body)[:5]) + (", ..." if len(body) > 5 else "")
    return InvalidRequest(f"'{field}' is missing: {takes}" + (f"; the body has {keys}" if body else ""), field)


def _unknown(body: dict, known: list[str]) -> InvalidRequest | None:
    """The error for a field the route does not read (a misspelt option would be ignored)."""
    extra = next((k for k in body if k not in known), None)
    if extra is None:
        return None
    close = difflib.get_close_matches(str(extra), known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InvalidRequest(f"unknown field {str(extra)[:40]!r}{hint}; this endpoint reads "
                          f"{', '.join(repr(k) for k in known)}", str(extra)[:40])


def read_body(body: dict, field: str, limits: Limits, options: tuple[str, ...] | None = ()) -> RequestBody:
    """`body` (a parsed JSON object) checked against its route's schema: the texts in `field`, the
    model and the task's `options` (None: a task that names none keeps any other field); an
    InvalidRequest otherwise."""
    if field not in body:
        raise _missing(body, field)
    unknown = None if options is None else _unknown(body, [field, "model", *options])
    if unknown:
        raise unknown
    try:
        req = body_schema(field).model_validate(body, context=limits)
    except ValidationError as e:
        raise InvalidRequest(explain(e), first_field(e)) from None
    if not req.texts and field in NOT_EMPTY:
        raise InvalidRequest(f"'{field}' is an empty list: send at least one text {ROUTE_FIELDS[field]}", field)
    return req


def request_schema(task) -> dict:
    """The JSON schema of a task route's body, for /openapi.json (the handlers read the raw body,
    so the framework cannot derive it): the texts in the task's own field, `model`, and the task's
    own options (`Task.request_schema()`, their properties); any other field is refused (422)."""
    field = task.request_field
    texts = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
             "description": "a text, or a list of texts"}
    model = {"type": "string", "description": "the served model's name (any, where one model of the task is served)"}
    options = task.request_schema() if hasattr(task, "request_schema") else {}
    return {"type": "object", "title": f"{task.name} request", "required": [field],
            "properties": {field: texts, "model": model, **options}, "additionalProperties": False}


def response_schema(task) -> dict:
    """The JSON schema of a task route's 200 answer (`Task.response_schema()`), for /openapi.json;
    any object for a task that gives none."""
    return task.response_schema() if hasattr(task, "response_schema") else {"type": "object"}
