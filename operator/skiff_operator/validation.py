"""Checks a CR against the generated schema: OpenAPI structure (jsonschema) and the CEL rules
(`x-kubernetes-validations`, evaluated with cel-python). The API server does the same at admission on
Kubernetes >= 1.25; the operator runs it too, so older servers (which ignore CEL) still reject bad specs."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import celpy
import jsonschema

from .crd import crd_manifest


@cache
def _root_schema() -> dict[str, Any]:
    return crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _jsonschema_view(node: Any) -> Any:
    """OpenAPI v3 -> JSON Schema: int-or-string becomes a type union; Kubernetes extensions are dropped."""
    if isinstance(node, list):
        return [_jsonschema_view(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _jsonschema_view(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        pattern = out.pop("pattern", None)
        if pattern:  # the pattern only constrains the string form
            out["if"] = {"type": "string"}
            out["then"] = {"pattern": pattern}
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(exclusive) is True:
            out[exclusive] = out.pop(bound)  # OpenAPI 3.0 boolean form -> JSON Schema 2020 number
    out.pop("default", None)
    return out


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it (defaults of absent fields, recursively)."""
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in node:
        return [apply_defaults(node["items"], v) for v in value]
    return value


def _cel_errors(node: dict[str, Any], value: Any, path: str) -> list[str]:
    errors: list[str] = []
    for rule in node.get("x-kubernetes-validations", []):
        result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, Exception) or not bool(result):
            errors.append(f"{path}: {rule['message']}")
    if isinstance(value, dict):
        for name, sub in node.get("properties", {}).items():
            if name in value:
                errors += _cel_errors(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for i, item in enumerate(value):
            errors += _cel_errors(node["items"], item, f"{path}[{i}]")
    return errors


def validate_spec(spec: dict[str, Any] | None) -> list[str]:
    """Messages for everything wrong with `spec` (empty when valid), after schema defaulting."""
    schema = _root_schema()["properties"]["spec"]
    value = apply_defaults(schema, copy.deepcopy(spec if spec is not None else {}))
    validator = jsonschema.Draft202012Validator(_jsonschema_view(schema))
    errors = [
        f"spec{''.join(f'.{p}' if isinstance(p, str) else f'[{p}]' for p in e.absolute_path)}: {e.message}"
        for e in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if errors:
        return errors  # CEL rules assume a structurally valid object
    return _cel_errors(schema, value, "spec")
