"""Bodies the fleet's hot endpoints (telemetry, enrolment, inventory, enrollment tokens) read
and write themselves, for their cost per request (bench.fleet, bench.ingest):

- `json_body(Model)`: the body parsed and validated in one pass by pydantic's JSON parser,
  where FastAPI's own body path runs json.loads first and validates the dict after; with
  nul_free_json, so a document whose bytes hold no NUL escape is not walked for one again.
  Errors read as FastAPI's would: 422 with each field under "body"; 413 over the size limit.
- `fast_json_body(FastDecoder(Model))`: the same, decoded by msgspec into a struct derived
  from the model (service.fastwire), with the model as the judge of what msgspec refuses —
  for telemetry, where pydantic was a third of serve's CPU.
- `json_response(model)`: the answer serialized once, where FastAPI validates a returned
  model against the route's response_model again before serializing it.

The route still names both models (`openapi_extra=request_schema(Model)`, `response_model`),
so the OpenAPI document says what it always said; `SELF_READ` lists the bodies it must add.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from agent.contract.base import nul_free_json
from service.errors import PayloadTooLarge
from service.fastwire import FastDecoder
from service.ops.middleware import BODY_TOO_LARGE

M = TypeVar("M", bound=BaseModel)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

# the models read by json_body: their schemas go into the OpenAPI document's components
SELF_READ: list[type[BaseModel]] = []


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency returning the request's body as `model`."""

    async def read(request: Request) -> M:
        raw = await _raw_body(request)
        try:
            try:
                with nul_free_json(raw):
                    return model.model_validate_json(raw)
            except ValidationError as error:
                if not _lone_surrogate(error, raw):
                    raise
            # pydantic's parser refuses a lone surrogate escape as "unexpected end of hex
            # escape"; json.loads takes it, and the model's check then says what is wrong
            return model.model_validate(json.loads(raw))
        except ValidationError as error:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in error.errors()]
            ) from None

    read.__name__ = f"{model.__name__}_body"
    return read


def fast_json_body(
    decoder: FastDecoder[M], checked: bool = False
) -> Callable[[Request], Awaitable[Any]]:
    """A dependency returning the request's body as `decoder`'s struct (service.fastwire):
    msgspec where it takes the body, else the model's verdict — its errors, as json_body's,
    or what it took, as the struct. With `checked`: (struct, what the decoder's whole check
    found of it), the second None where the model judged the body."""
    judge = json_body(decoder.model)

    async def read(request: Request) -> Any:
        fast = decoder.decode_checked(await _raw_body(request))
        if fast is not None:
            return fast if checked else fast[0]
        validated = await judge(request)  # the body is read once: Starlette keeps it
        try:
            document = decoder.from_model(validated)
        except msgspec.ValidationError as error:
            # the model took what its struct cannot hold: refused, with msgspec's reason
            raise RequestValidationError(
                [{"type": "value_error", "loc": ("body",), "msg": str(error), "input": None}]
            ) from None
        return (document, None) if checked else document

    read.__name__ = f"{decoder.model.__name__}_fast_body"
    return read


async def _raw_body(request: Request) -> bytes:
    try:
        return await request.body()
    except Exception:
        limit = request.scope.get(BODY_TOO_LARGE)
        if limit is not None:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes") from None
        raise


def _lone_surrogate(error: ValidationError, raw: bytes) -> bool:
    return (
        error.error_count() == 1
        and error.errors()[0]["type"] == "json_invalid"
        and (SURROGATE_ESCAPE.search(raw) is not None)
    )


def request_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The route's openapi_extra: its body documented as `model`, required."""
    if model not in SELF_READ:
        SELF_READ.append(model)
    reference = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}
    }


def json_response(model: BaseModel, status_code: int = 200) -> Response:
    """`model` as the response's JSON, serialized as FastAPI would (by field name)."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")
