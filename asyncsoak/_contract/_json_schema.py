"""TypedDicts to JSON Schema (draft 2020-12): how ``artifact.schema.json`` is generated.

A TypedDict is an object whose docstring and ``#:`` field comments are its descriptions; a key
that is not ``NotRequired`` is required; ``Annotated`` adds keywords (:class:`Keywords`) or
gives the shape the schema checks where readers index a plain dict (a type).
"""

import re
from enum import Enum
from functools import cache
from pathlib import Path
from types import NoneType, UnionType
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    is_typeddict,
)


class Keywords:
    """``Annotated`` metadata: JSON Schema keywords added to the annotated type's."""

    __slots__ = ("keywords",)

    def __init__(self, **keywords: Any) -> None:
        self.keywords = keywords


NonNegativeInt = Annotated[int, Keywords(minimum=0)]
NonNegative = Annotated[float, Keywords(minimum=0)]
Timestamp = Annotated[
    str, Keywords(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
]

_HERE = Path(__file__).parent
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", NoneType: "null"}


def json_schema(tp: Any, named: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The schema of the annotation ``tp``, and the ``$defs`` of the shapes of ``named`` (name
    -> shape) it uses, each named once and referred to elsewhere."""
    defs: dict[str, Any] = {}
    node = _node(tp, named, defs)
    return node, {name: defs[name] for name in named if name in defs}


def _node(tp: Any, named: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The schema of ``tp``; a shape of ``named`` as a reference."""
    name = next((name for name, shape in named.items() if shape == tp), None)
    if name is not None:
        if name not in defs:
            defs[name] = {}  # claimed before its own shape is built
            defs[name] = _shape(tp, named, defs)
        return {"$ref": f"#/$defs/{name}"}
    return _shape(tp, named, defs)


def _shape(tp: Any, named: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        shapes = [m for m in tp.__metadata__ if not isinstance(m, Keywords)]
        node = _node(shapes[0] if shapes else tp.__origin__, named, defs)
        for extra in tp.__metadata__:
            node = {**node, **extra.keywords} if isinstance(extra, Keywords) else node
        return node
    if origin in (Required, NotRequired):
        return _node(args[0], named, defs)
    if origin in (Union, UnionType):
        options = [_node(a, named, defs) for a in args if a is not NoneType]
        return _union(options, NoneType in args)
    if origin is Literal:
        return {"enum": [a.value if isinstance(a, Enum) else a for a in args]}
    if origin is list:
        items = _node(args[0], named, defs)
        return {"type": "array", **({"items": items} if items else {})}
    if origin is dict:
        values = _node(args[1], named, defs)
        return {"type": "object", **({"additionalProperties": values} if values else {})}
    if is_typeddict(tp):
        return _object(tp, named, defs)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return {"enum": [member.value for member in tp]}
    return {"type": _JSON_TYPES[tp]} if tp in _JSON_TYPES else {}  # Any: anything


def _union(options: list[dict[str, Any]], nullable: bool) -> dict[str, Any]:
    """Types that are only a ``type`` merge into one list; a nullable one takes null in its
    ``type`` and ``enum``; any other union is an ``anyOf``."""
    if all(set(o) == {"type"} for o in options):
        types = [o["type"] for o in options] + ["null"] * nullable
        return {"type": types[0] if len(types) == 1 else types}
    if len(options) > 1 or not ({"type", "enum"} & set(options[0])):
        return {"anyOf": options + [{"type": "null"}] * nullable}
    node = dict(options[0])
    if "type" in node:
        node["type"] = [node["type"], "null"]
    if "enum" in node:
        node["enum"] = [*node["enum"], None]
    return node


def _object(cls: Any, named: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A TypedDict as an object: its docstring and ``#:`` comments are the descriptions."""
    classes = [c for c in (cls, *getattr(cls, "__orig_bases__", ())) if is_typeddict(c)]
    node: dict[str, Any] = {"type": "object"}
    if cls.__doc__:
        node["description"] = _prose(cls.__doc__)
    required = [key for key in cls.__annotations__ if key in cls.__required_keys__]
    if required:
        node["required"] = required
    node["properties"] = {}
    for key, tp in cls.__annotations__.items():
        notes = [_comments()[c.__name__, key] for c in classes if (c.__name__, key) in _comments()]
        node["properties"][key] = {
            **({"description": notes[0]} if notes else {}),
            **_node(tp, named, defs),
        }
    return node


@cache
def _comments() -> dict[tuple[str, str], str]:
    """Each field's ``#:`` comment in the schema's files (``_schema*.py``), by class and field."""
    found: dict[tuple[str, str], str] = {}
    comment: list[str] = []
    cls = ""
    lines = [
        line for path in sorted(_HERE.glob("_schema*.py")) for line in path.read_text().splitlines()
    ]
    for line in lines:
        cls = line[6:].partition("(")[0] if line.startswith("class ") else cls
        line = line.strip()
        if line.startswith("#:"):
            comment.append(line[2:].strip())
        elif comment:
            found[cls, line.partition(":")[0]] = _prose(" ".join(comment))
            comment = []
    return found


def _prose(text: str) -> str:
    """Docstring prose as plain text: one line, without reST's markup."""
    text = re.sub(r":\w+:`~?\.?(?:\w+\.)*(\w+)`", r"\1", " ".join(text.split()))
    return text.replace("``", "")


def dump(value: Any, pad: str = "", key: str = "") -> str:
    """``value`` as JSON text: an object or list on one line where it fits."""
    import json  # the generator's alone
    import textwrap

    flat = json.dumps(value)
    if len(pad + key + flat) < 96 or not isinstance(value, dict | list) or not value:
        return flat
    if isinstance(value, dict):
        inner = [f"{json.dumps(k)}: {dump(v, pad + '  ', k)}" for k, v in value.items()]
        return f"{{\n{pad}  " + f",\n{pad}  ".join(inner) + f"\n{pad}}}"
    if any(isinstance(v, dict | list) for v in value):
        return f"[\n{pad}  " + f",\n{pad}  ".join(dump(v, pad + "  ") for v in value) + f"\n{pad}]"
    words = textwrap.fill(flat[1:-1], 100, initial_indent=pad + "  ", subsequent_indent=pad + "  ")
    return f"[\n{words}\n{pad}]"  # words: as many to a line as fit
