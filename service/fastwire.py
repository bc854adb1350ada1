"""msgspec decoders derived from the wire contract's pydantic models, for the hot path.

A telemetry batch validated by pydantic cost `serve` 12-13 µs a window, more than a third of
its CPU for a 500-window batch (py-spy, bench.ingest); msgspec decodes and checks the same
window in about 1.3 µs. The contract (agent.contract) stays the one definition of a message:
`struct_for(Model)` builds a msgspec Struct from the model's fields — the same names, types,
bounds, patterns, lengths, defaults and refusal of unknown fields — and runs the model's own
after-validators on each decoded struct. What the translation does not know (a field
validator, a before-validator other than the NUL walk, a constraint it has no equal for) is
refused when the struct is built, at import: a contract change the fast path cannot mirror
fails every test, never passes a window pydantic would refuse.

`FastDecoder.decode(raw)` is the fast path and pydantic the judge: a document msgspec refuses
(or one whose bytes hold a NUL or surrogate escape, which only pydantic's NUL walk checks) is
left to the model (service.bodies) — its errors are the ones a client reads — and, when the
model takes it after all (a unix-time datetime: pydantic's lax JSON mode accepts one),
converted to the struct from the model's own values. So the fast path may be stricter than
the model, never more lenient (tests/service/test_fastwire.py holds the two side by side on
hostile input).
"""

from __future__ import annotations

import re
import types
import typing
import uuid
from collections.abc import Callable, Collection
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Generic, TypeVar, get_args, get_origin

import annotated_types
import msgspec
from pydantic import AwareDatetime, BaseModel
from pydantic.fields import FieldInfo
from pydantic.types import Strict

from agent.contract.base import InputModel, may_hold_unstorable

M = TypeVar("M", bound=BaseModel)

# the bounds msgspec.Meta takes, by annotated_types' constraint
_BOUNDS: dict[type, str] = {
    annotated_types.Ge: "ge",
    annotated_types.Le: "le",
    annotated_types.Gt: "gt",
    annotated_types.Lt: "lt",
    annotated_types.MinLen: "min_length",
    annotated_types.MaxLen: "max_length",
}
# msgspec matches a pattern with re.search, where `$` also matches before a final newline;
# pydantic's Rust regex matches `$` only at the end ("sda\n" is not a device name)
_END = re.compile(r"(?<!\\)\$$")


def _meta(metadata: list[Any], where: str) -> dict[str, Any]:
    """msgspec.Meta's keyword arguments for pydantic field metadata; strict numbers are what
    msgspec decodes anyway (no "12" for 12, no 1.0 for an integer)."""
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, FieldInfo):
            found.update(_meta(item.metadata, where))
        elif isinstance(item, Strict):
            if not item.strict:
                raise TypeError(f"{where}: lax numbers have no msgspec equal")
        elif type(item) in _BOUNDS:
            name = _BOUNDS[type(item)]
            found[name] = getattr(item, name)
        elif type(item).__name__ == "_PydanticGeneralMetadata" and set(vars(item)) == {"pattern"}:
            found["pattern"] = _END.sub(r"\\Z", item.pattern)
        else:
            raise TypeError(f"{where}: no msgspec equal for {item!r}")
    return found


class _Builder:
    def __init__(
        self,
        deferred: frozenset[object] = frozenset(),
        raw: Collection[tuple[type[BaseModel], str]] = (),
    ) -> None:
        self.structs: dict[type[BaseModel], type[msgspec.Struct]] = {}
        self.deferred = deferred  # after-validators the decoder runs on the whole document
        self.found: set[object] = set()
        self.raw = frozenset(raw)  # (model, field) left as their JSON for the whole check
        self.raw_found: set[tuple[type[BaseModel], str]] = set()

    def type_of(self, annotation: Any, metadata: list[Any], where: str) -> Any:
        """The msgspec type for a pydantic annotation with its field's constraints."""
        origin = get_origin(annotation)
        if origin is Annotated:
            inner, *extra = get_args(annotation)
            return self.type_of(inner, [*extra, *metadata], where)
        if origin in (typing.Union, types.UnionType):
            members = get_args(annotation)
            if type(None) not in members or len(members) != 2:
                raise TypeError(f"{where}: only X | None unions are translated")
            (inner,) = (m for m in members if m is not type(None))
            # constraints on an optional field bind its value (pydantic applies them so)
            return self.type_of(inner, metadata, where) | None
        if origin in (list, tuple):
            args = get_args(annotation)
            if origin is tuple and (not args or Ellipsis in args):
                raise TypeError(f"{where}: only fixed-length tuples are translated")
            items = [self.type_of(arg, [], f"{where}[]") for arg in args]
            # types made at run time: typing's subscription, which mypy cannot follow
            shaped: Any = (
                list.__class_getitem__(items[0])
                if origin is list
                else tuple.__class_getitem__(tuple(items))
            )
            return self._constrained(shaped, metadata, where)
        if origin is dict:
            key, value = get_args(annotation)
            made: Any = dict.__class_getitem__(
                (self.type_of(key, [], f"{where}{{}}"), self.type_of(value, [], f"{where}[]"))
            )
            return self._constrained(made, metadata, where)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if metadata:
                raise TypeError(f"{where}: constraints on a message")
            return self.struct(annotation)
        if annotation is AwareDatetime:
            return self._constrained(datetime, metadata, where, tz=True)
        if annotation in (int, float, str, bool, uuid.UUID) or (
            isinstance(annotation, type) and issubclass(annotation, Enum)
        ):
            return self._constrained(annotation, metadata, where)
        raise TypeError(f"{where}: no msgspec equal for {annotation!r}")

    @staticmethod
    def _constrained(kind: Any, metadata: list[Any], where: str, **fixed: Any) -> Any:
        meta = {**_meta(metadata, where), **fixed}
        return Annotated[kind, msgspec.Meta(**meta)] if meta else kind

    def struct(self, model: type[BaseModel]) -> type[msgspec.Struct]:
        if model in self.structs:
            return self.structs[model]
        config = model.model_config
        if config.get("extra") != "forbid" or config.get("allow_inf_nan", True):
            raise TypeError(f"{model.__name__}: only strict input models are translated")
        decorators = model.__pydantic_decorators__
        if decorators.field_validators or decorators.validators or decorators.root_validators:
            raise TypeError(f"{model.__name__}: field validators have no msgspec equal")
        checks: list[Callable[[Any], Any]] = []
        deferring = False
        for name, decorator in decorators.model_validators.items():
            mode = decorator.info.mode
            if mode == "after" and decorator.func in self.deferred:
                self.found.add(decorator.func)
                deferring = True
                continue
            if mode == "after":
                checks.append(decorator.func)
            elif not (mode == "before" and name == InputModel._no_nul_anywhere.__name__):
                # the NUL walk is done on the raw document (FastDecoder), nothing else is
                raise TypeError(f"{model.__name__}.{name}: a {mode}-validator is not translated")
        fields: list[tuple[str, Any, Any]] = []
        for name, info in model.model_fields.items():
            if info.alias not in (None, name):
                raise TypeError(f"{model.__name__}.{name}: aliases are not translated")
            kind = self.type_of(info.annotation, list(info.metadata), f"{model.__name__}.{name}")
            factory: Any = info.default_factory
            if (model, name) in self.raw:
                # its JSON, valid but undecoded: the check that runs in place of the model's
                # deferred validator answers for everything its annotation says, too
                if not deferring:
                    raise TypeError(f"{model.__name__}.{name}: raw, but no validator deferred")
                if factory not in (None, list) or (factory is None and not info.is_required()):
                    raise TypeError(f"{model.__name__}.{name}: a raw field defaults to [] or none")
                self.raw_found.add((model, name))
                if factory is list:
                    fields.append((name, msgspec.Raw, msgspec.Raw(b"[]")))
                else:
                    fields.append((name, msgspec.Raw, msgspec.NODEFAULT))
                continue
            if isinstance(factory, type) and issubclass(factory, BaseModel):
                factory = self.struct(factory)  # a message's defaults, as its struct
            elif factory is not None and factory not in (list, dict):
                raise TypeError(f"{model.__name__}.{name}: default_factory {factory!r}")
            if factory is not None:
                fields.append((name, kind, msgspec.field(default_factory=factory)))
            elif info.is_required():
                fields.append((name, kind, msgspec.NODEFAULT))
            elif isinstance(info.default, BaseModel | list | dict | set):
                raise TypeError(f"{model.__name__}.{name}: a mutable default")
            else:
                fields.append((name, kind, info.default))

        def post_init(self: Any) -> None:
            # ValueError raised here reaches the caller as msgspec.ValidationError
            for check in checks:
                check(self)

        namespace = {"__post_init__": post_init} if checks else {}
        made = msgspec.defstruct(
            model.__name__,
            [(n, k) if d is msgspec.NODEFAULT else (n, k, d) for n, k, d in fields],
            namespace=namespace,
            module=__name__,
            forbid_unknown_fields=True,
            frozen=True,
            kw_only=True,  # a required field may follow one with a default, as in pydantic
            # never in a reference cycle (a decoded document is a tree of values): untracked
            # by the collector, a window is cheaper to make and to free (decode 1.57 -> 1.45
            # us a diskstats window)
            gc=False,
        )
        self.structs[model] = made
        return made


class FastDecoder(Generic[M]):
    """Decodes a JSON document as `model`'s struct, or leaves it to the model (None).

    `deferred` after-validators are not run struct by struct: `whole(document)` runs once on
    the decoded document in their place, and must be neither None nor False only where every
    one of them would pass (None or False leaves the document to the model; anything else it
    returns is kept with the document: `decode_checked`) — a check that loops in Python over
    thousands of values per document is done in a few array operations instead
    (service.telemetry.distributions). `raw` fields of the models whose validators are
    deferred are not decoded at all: they hold their JSON (msgspec.Raw, its syntax checked),
    and `whole` must also be True only where each is what its annotation says (decoding a
    histogram's pairs into tuples cost more than checking the whole window did)."""

    def __init__(
        self,
        model: type[M],
        deferred: Collection[object] = (),  # the models' after-validators, as functions
        whole: Callable[[Any], object] | None = None,
        raw: Collection[tuple[type[BaseModel], str]] = (),  # fields of the deferring models
    ) -> None:
        if bool(deferred) != (whole is not None):
            raise TypeError("deferred validators need the check that runs in their place")
        self.model = model
        builder = _Builder(frozenset(deferred), raw)
        self.struct = builder.struct(model)
        if missing := set(deferred) - builder.found:
            raise TypeError(f"{model.__name__} has no after-validator {missing}")
        if missing_fields := set(raw) - builder.raw_found:
            raise TypeError(f"{model.__name__} has no field {missing_fields}")
        self._decoder = msgspec.json.Decoder(self.struct)
        self._whole = whole

    def decode(self, raw: bytes) -> Any:
        """The document as the struct, or None: the model must judge it (msgspec refused it,
        the deferred check was not sure of it, or its bytes hold an escape only the model's
        NUL walk checks)."""
        found = self.decode_checked(raw)
        return None if found is None else found[0]

    def decode_checked(self, raw: bytes) -> tuple[Any, Any] | None:
        """decode's document with what the whole check found of it — its result, for a
        caller that reads the same values again (None without a whole check)."""
        if may_hold_unstorable(raw):
            return None
        try:
            decoded = self._decoder.decode(raw)
            if self._whole is None:
                return decoded, None
            checked = self._whole(decoded)
        except (msgspec.DecodeError, ValueError):
            # DecodeError: refused (ValidationError is one). ValueError: what msgspec raises
            # past its own errors — UnicodeDecodeError for a string that is not UTF-8, where a
            # pattern is checked — or the whole check's: the model judges it, with its 4xx
            return None
        if checked is None or checked is False:
            return None
        return decoded, checked

    def from_model(self, validated: BaseModel) -> Any:
        """What the model took, as the struct (msgspec.ValidationError if the struct cannot
        hold it: the translation is stricter than the model there)."""
        return msgspec.json.decode(validated.model_dump_json(), type=self.struct)

    def encode(self, value: Any) -> bytes:
        """The struct as JSON, its fields in the model's order."""
        return msgspec.json.encode(value)
