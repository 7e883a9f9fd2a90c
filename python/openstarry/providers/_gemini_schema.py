"""Gemini's ``parameters`` schemas: a tool's JSON Schema as the OpenAPI subset Gemini accepts.

The request side of :mod:`openstarry.providers.gemini` declares each tool
with :func:`gemini_schema` (read its docstring for every rule). The rules live
apart because they are a translator of their own: a recursive walk over a
JSON Schema, with ``$ref`` inlining and a depth bound
(:data:`MAX_SCHEMA_DEPTH`), that knows nothing of requests or responses.
Import them from :mod:`openstarry.providers.gemini`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_SCHEMA_DEPTH", "gemini_schema"]


#: How deep :func:`gemini_schema` follows nested schemas and references.
MAX_SCHEMA_DEPTH: Final = 32

#: The Schema fields Gemini's ``parameters`` accept that openstarry copies as they are.
_TEXT_FIELDS: Final = frozenset({"description", "pattern"})
_NUMBER_FIELDS: Final = frozenset(
    {
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
    }
)
_FORMATS: Final = {
    "string": frozenset({"enum", "date-time"}),
    "number": frozenset({"float", "double"}),
    "integer": frozenset({"int32", "int64"}),
}
_NULLABLE_ONLY: Final = {"nullable": True}


def gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema as the OpenAPI 3.0 subset Gemini's ``parameters`` accept.

    - ``$ref`` is inlined (``#/$defs/...``, ``#/definitions/...``, any local
      pointer); a reference back into itself is cut to ``{"type": "object"}``
      with a description saying so. ``allOf`` is merged into one schema.
    - ``oneOf`` becomes ``anyOf``; a ``null`` alternative, a ``"null"`` in a
      ``type`` list or ``null`` among the ``enum`` values becomes
      ``nullable: true``; a ``type`` list of several types becomes ``anyOf``.
    - ``const`` becomes a one-value ``enum``. Gemini's ``enum`` holds strings
      only: an enum of other values is dropped and its values are listed in
      the description. ``default`` is dropped and stated in the description.
    - ``format`` is kept only where Gemini supports it (``date-time`` and
      ``enum`` for strings, ``float``/``double``, ``int32``/``int64``).
    - ``required`` keeps only names in ``properties``. An object without
      ``properties`` (a free-form map) stays ``{"type": "object"}``.
    - Everything else Gemini refuses is dropped: ``$schema``, ``$id``,
      ``$defs``, ``additionalProperties``, ``patternProperties``, ``title``,
      ``examples``, ``exclusiveMinimum``/``exclusiveMaximum``, ``multipleOf``,
      ``uniqueItems``, ``not``, ``if``/``then``/``else``, ``prefixItems`` and
      the like. The tool still validates its arguments against its full schema.
    """
    return _SchemaConverter(schema).convert(schema, 0, ())


class _SchemaConverter:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node: Any = self.root
        for token in ref[1:].split("/")[1:] if ref != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            else:
                return None
        return node

    def convert(self, node: Any, depth: int, refs: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(node, Mapping) or depth > MAX_SCHEMA_DEPTH:
            return {}
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = self.resolve(ref)
            if ref in refs:
                kind = target.get("type") if isinstance(target, Mapping) else None
                base: dict[str, Any] = {
                    "type": kind if isinstance(kind, str) and kind != "null" else "object",
                    "description": f"(a {ref.rsplit('/', 1)[-1]} again; not expanded)",
                }
            else:
                base = self.convert(target, depth + 1, (*refs, ref))
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return _merge(base, self.convert(siblings, depth + 1, refs)) if siblings else base
        all_of = node.get("allOf")
        if isinstance(all_of, list):
            merged: dict[str, Any] = {}
            for sub in all_of:
                merged = _merge(merged, self.convert(sub, depth + 1, refs))
            rest = {k: v for k, v in node.items() if k != "allOf"}
            return _merge(merged, self.convert(rest, depth + 1, refs))
        return self._plain(node, depth, refs)

    def _plain(self, node: Mapping[str, Any], depth: int, refs: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        nullable = False
        union = node.get("anyOf", node.get("oneOf"))
        if isinstance(union, list):
            subs = [self.convert(sub, depth + 1, refs) for sub in union]
            kept = [s for s in subs if s != _NULLABLE_ONLY]
            nullable = len(kept) < len(subs)
            if len(kept) == 1:
                out.update(kept[0])
            elif kept:
                out["anyOf"] = kept
        kind = node.get("type")
        if isinstance(kind, list):
            types = [t for t in kind if isinstance(t, str) and t != "null"]
            nullable = nullable or "null" in kind
            if len(types) == 1:
                out["type"] = types[0]
            elif types:
                out["anyOf"] = [{"type": t} for t in types]
        elif isinstance(kind, str):
            if kind == "null":
                nullable = True
            else:
                out["type"] = kind
        for key in _TEXT_FIELDS:
            value = node.get(key)
            if isinstance(value, str):
                out[key] = value
        for key in _NUMBER_FIELDS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = value
        values: Any = [node["const"]] if "const" in node else node.get("enum")
        if isinstance(values, list):
            if None in values:
                nullable = True
                values = [v for v in values if v is not None]
            if values and all(isinstance(v, str) for v in values):
                out["enum"] = values
                out.setdefault("type", "string")
            elif values:
                listed = ", ".join(json.dumps(v, ensure_ascii=False) for v in values)
                _describe(out, f"One of: {listed}.")
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            out["properties"] = {
                str(name): self.convert(sub, depth + 1, refs) for name, sub in properties.items()
            }
            required = node.get("required")
            if isinstance(required, list):
                present = [r for r in required if r in out["properties"]]
                if present:
                    out["required"] = present
        items = node.get("items")
        if isinstance(items, list):  # the tuple form of older drafts
            items = {"anyOf": items} if len(items) > 1 else (items[0] if items else None)
        if items is None and isinstance(node.get("prefixItems"), list):
            prefix = node["prefixItems"]
            items = {"anyOf": prefix} if len(prefix) > 1 else (prefix[0] if prefix else None)
        if isinstance(items, Mapping):
            out["items"] = self.convert(items, depth + 1, refs)
        fmt = node.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS.get(out.get("type", ""), ()):
            out["format"] = fmt
        default = node.get("default")
        if default is not None:
            _describe(out, f"Default: {json.dumps(default, ensure_ascii=False, default=str)}.")
        if nullable:
            out["nullable"] = True
        return out


def _describe(out: dict[str, Any], sentence: str) -> None:
    description = out.get("description")
    out["description"] = f"{description} {sentence}" if description else sentence


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``; properties and required lists are united."""
    merged = dict(base)
    for key, value in over.items():
        if key == "properties" and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(merged.get(key), list):
            merged[key] = merged[key] + [r for r in value if r not in merged[key]]
        else:
            merged[key] = value
    return merged
