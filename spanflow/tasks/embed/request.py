"""The embeddings route's own request fields, as a pydantic schema: OpenAI's `encoding_format`
(float or base64), `dimensions` (keep the first N, then renormalise) and `user` (accepted, unused)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_core.core_schema import ValidationInfo

from spanflow.errors import ConfigError
from spanflow.schemas import expect, expected, explain, first_field

# absent, null or an empty string: float, as OpenAI's API reads it (a 0 or an empty list is no format)
EncodingFormat = expect(Annotated[Literal["float", "base64"], BeforeValidator(lambda v: "float" if v in (None, "")
                                                                              else v)], '"float" or "base64"')


class EmbedOptions(BaseModel):
    """What a body to /v1/embeddings may say beyond the texts and the model (serving/requests.py
    refuses any other field before these are read)."""

    model_config = ConfigDict(extra="ignore")

    encoding_format: EncodingFormat = "float"
    dimensions: int | None = Field(None, json_schema_extra={"type": "integer", "minimum": 1})
    user: expect(Annotated[str, Field(strict=True)], "a string") | None = None

    @field_validator("dimensions", mode="plain")
    @classmethod
    def _width(cls, v, info: ValidationInfo):
        dim = info.context["dim"]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= dim):
            raise expected("an integer from 1 to {dim} (the model's width)", dim=dim)
        return v


def read_options(body: dict, dim: int) -> dict:
    """{"encoding_format", "dimensions"} of a request body for a model of width `dim`; a ConfigError
    naming the field and the value otherwise (the server answers it with a 422)."""
    try:
        opts = EmbedOptions.model_validate(body, context={"dim": dim})
    except ValidationError as e:
        raise ConfigError(explain(e), field=first_field(e)) from None
    return {"encoding_format": opts.encoding_format, "dimensions": opts.dimensions}
