"""Pydantic JSON Schema -> Kubernetes structural OpenAPI v3 schema (no $ref, no anyOf-null, no titles)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# Keys a CRD schema may carry (JSONSchemaProps); anything else pydantic emits is dropped.
ALLOWED = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "nullable",
    "format",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            del rest["default"]
        if len(branches) == 1:
            return _convert({**branches[0], **rest}, defs)
        if all(b.get("type") in ("integer", "string") for b in branches):  # int | str without annotation
            return _convert({**rest, "x-kubernetes-int-or-string": True}, defs)
        raise ValueError(f"cannot express anyOf {branches} in a structural schema")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in ALLOWED:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _convert(value, defs)
        else:
            out[key] = value
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exclusive), int | float) and not isinstance(out[exclusive], bool):
            out[bound], out[exclusive] = out[exclusive], True  # JSON Schema 2020 -> OpenAPI 3.0 form
    if "enum" in out and "type" not in out:
        kinds = {type(v) for v in out["enum"]}
        out["type"] = "integer" if kinds == {int} else "string"
    if "properties" in out or "x-kubernetes-preserve-unknown-fields" in out:
        out.setdefault("type", "object")
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise ValueError(f"schema node without a type: {node}")
    if "default" in out and out["default"] is None:
        del out["default"]
    if out.get("default") in ([], {}) and "properties" not in out:
        del out["default"]  # empty lists and maps: the models' default_factory covers them
    return out
