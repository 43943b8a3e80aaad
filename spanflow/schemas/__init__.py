"""What the pydantic schemas of spanflow's files and request bodies share. Each schema lives
beside the code that reads its file: models/directory.py (spanflow.json), tasks/embed/journal.py
(the embed job's journals), serving/requests.py and tasks/embed/request.py (request bodies)."""
from spanflow.schemas.fields import (Names, NonNegativeInt, PositiveInt, expect, expected, explain, field_path,
                                     first_field, invalid)

__all__ = ["Names", "NonNegativeInt", "PositiveInt", "expect", "expected", "explain", "field_path", "first_field",
           "invalid"]
