"""The workload spec's front door: text or mapping → `WorkloadSpec`, with errors naming fields as users wrote them.

The models and their rules live in `models`; durations in `durations`; both are re-exported here.

YAML is read with a YAML 1.2-style loader: only true/false are booleans (so `retry: {on: [...]}` keeps its
key, and `yes`, `off` stay strings), no base-60 numbers (`1:30` stays text), no timestamps, no aliases or
merge keys (a small text cannot expand into a huge document), and a repeated key is an error, not a silent
overwrite.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from suanli.workloads.durations import brief, format_duration, parse_duration
from suanli.workloads.models import ModelSpec, Retry, WorkloadSpec
from suanli.workloads.resources import FieldError, GpuRange, Resources

__all__ = [
    "MAX_SPEC_BYTES",
    "FieldError",
    "GpuRange",
    "ModelSpec",
    "Resources",
    "Retry",
    "SpecError",
    "WorkloadSpec",
    "format_duration",
    "load_yaml",
    "parse_duration",
    "parse_spec",
    "spec_errors",
]

MAX_SPEC_BYTES = 256 * 1024
_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): WorkloadSpec,
    ("resources",): Resources,
    ("resources", "gpus"): GpuRange,
    ("retry",): Retry,
    ("model",): ModelSpec,
}
_SHOULD = re.compile(r"^(?:Input|String|Value|Decimal input|Decimal|List|Tuple|Dictionary|Number) should ")


class SpecError(ValueError):
    """A spec that does not validate. `errors` holds {"field", "message"} dicts; str() joins them."""

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))


class _Loader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not supported", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool):
                continue  # the base class refuses unhashable keys; others fail validation by name
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"key {brief(key)} appears twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {}
for _tag, _rx, _first in (
    ("tag:yaml.org,2002:null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"true|True|TRUE|false|False|FALSE", list("tTfF")),
    ("tag:yaml.org,2002:int", r"[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        list("-+0123456789."),
    ),
):
    _Loader.add_implicit_resolver(_tag, re.compile(rf"^(?:{_rx})$"), _first)


def load_yaml(text: str) -> Any:
    """Parse spec text (YAML, or JSON, which is YAML) with the loader above; raises SpecError on bad syntax."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError:
            pass  # YAML flow style, or broken: the YAML parser says where
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = " ".join(x for x in (e.context, e.problem) if x) or "syntax error"
        raise SpecError([{"field": "spec", "message": f"not valid YAML: {problem}{where}"}]) from None
    except yaml.YAMLError as e:
        raise SpecError([{"field": "spec", "message": f"not valid YAML: {e}"}]) from None
    except ValueError as e:  # e.g. an integer literal longer than Python converts
        raise SpecError([{"field": "spec", "message": f"not valid YAML: {e}"}]) from None
    except RecursionError:
        raise SpecError([{"field": "spec", "message": "nested too deeply"}]) from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def parse_spec(source: str | bytes | Mapping[str, Any]) -> WorkloadSpec:
    """Validate a workload spec from YAML/JSON text or an already-parsed mapping; raises SpecError."""
    data: Any = source
    if isinstance(source, bytes | str):
        size = len(source) if isinstance(source, bytes) else len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_SPEC_BYTES:
            raise SpecError(
                [{"field": "spec", "message": f"is {size} bytes; the limit is {MAX_SPEC_BYTES // 1024} KiB"}]
            )
        if isinstance(source, bytes):
            try:
                source = source.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SpecError([{"field": "spec", "message": f"is not UTF-8 text (byte {e.start})"}]) from None
        data = load_yaml(source)
    if data is None:
        raise SpecError([{"field": "spec", "message": "is empty; a workload spec needs at least name and command"}])
    if not isinstance(data, Mapping):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        raise SpecError([{"field": "spec", "message": f"must be a mapping (name: …, command: …), not {kind}"}])
    where = unencodable(data)
    if where is not None:
        field, at = where
        raise SpecError([{"field": field, "message": f"is not UTF-8 text: a lone surrogate at character {at}"}])
    try:
        return WorkloadSpec.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(spec_errors(e)) from None


def unencodable(data: Any) -> tuple[str, int] | None:
    """The field (dotted, as `spec_errors` names them) and character of the first text in a parsed spec that has no
    UTF-8 form: JSON's `\\ud800` escape parses to a lone surrogate, which no argv, path or database takes. A key
    names its parent (`spec` at the top). Iterative: a spec nested 10,000 deep is refused, not a RecursionError."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return path or "spec", e.start
        elif isinstance(v, Mapping):
            for k, x in v.items():
                key = str(k)
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError as e:
                    return path or "spec", e.start
                stack.append((f"{path}.{key}" if path else key, x))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}.{i}" if path else str(i), x) for i, x in enumerate(v))
    return None


MAX_ERRORS = 20  # reported per spec: enough to fix a spec by, and bounded for a spec of 10⁵ unknown keys


def spec_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic's errors as {"field": "resources.gpus", "message": "…"}, worded for people writing specs (the
    first `MAX_ERRORS` different ones, then how many more there were)."""
    out: list[dict[str, str]] = []
    errors = exc.errors(include_url=False)
    for n, err in enumerate(errors):
        if len(out) == MAX_ERRORS:
            out.append({"field": "spec", "message": f"…and up to {len(errors) - n} more errors"})
            break
        loc = tuple(x[:59] + "…" if isinstance(x, str) and len(x) > 60 else str(x) for x in err.get("loc", ()))
        cause = (err.get("ctx") or {}).get("error")
        kind = err.get("type", "")
        if isinstance(cause, FieldError):
            loc, message = (*loc, *cause.field.split(".")), cause.message
        elif kind == "value_error" and cause is not None:
            message = str(cause)
        elif kind == "extra_forbidden":
            message = _unknown_field(loc)
        elif kind == "missing":
            message = "is required"
        else:
            message = _SHOULD.sub("must ", str(err.get("msg", "is not valid")))
        item = {"field": ".".join(loc) or "spec", "message": message}
        if item not in out:
            out.append(item)
    return out


def _unknown_field(loc: tuple[str, ...]) -> str:
    model = _MODELS.get(loc[:-1])
    if model is None:
        return "unknown field"
    known = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field; {hint}known: {', '.join(known)}"
