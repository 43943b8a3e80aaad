"""Records as JSON Lines whatever their values hold: the ids and kept columns of a bulk job's
JSONL output come from any input column (bytes, dates, NaN), and JSON has no form for some."""
from __future__ import annotations

import base64
import datetime
import json
import math
from collections.abc import Mapping


def json_value(value):
    """`value` as JSON can hold it: NaN and infinities as null, bytes as base64, dates and times
    in ISO 8601, decimals and any other value as its str; lists and dicts item by item."""
    if value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def json_line(record: dict, *, ensure_ascii: bool = False) -> str:
    """`record` as one line of valid JSON, whatever its values (see json_value)."""
    try:
        return json.dumps(record, ensure_ascii=ensure_ascii, allow_nan=False)
    except (TypeError, ValueError):  # a value JSON has no form for (bytes, a date, a NaN): json_value gives one
        return json.dumps(json_value(record), ensure_ascii=ensure_ascii, allow_nan=False)
