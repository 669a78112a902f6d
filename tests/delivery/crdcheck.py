"""Validate custom resources against a CRD the way the API server does: the structural OpenAPI schema
(unknown fields rejected, as `kubectl apply` does with its default strict field validation) and the CEL
`x-kubernetes-validations` rules at every node where they are declared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy
import jsonschema


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3 structural schema -> JSON Schema (x-kubernetes-* folded into plain keywords)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)) or key == "not":
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = value
    for bound in ("Minimum", "Maximum"):  # OpenAPI 3.0 booleans -> JSON Schema numbers
        flag, limit = f"exclusive{bound}", bound.lower()
        if isinstance(node.get(flag), bool):
            out.pop(flag)
            if node[flag] and limit in node:
                out[flag] = out.pop(limit)
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    if "properties" in node and "additionalProperties" not in node and not preserve:
        out["additionalProperties"] = False
    return out


def version_schema(crd: dict[str, Any], api_version: str) -> dict[str, Any]:
    group, _, version = api_version.partition("/")
    if group != crd["spec"]["group"]:
        raise ValueError(f"{api_version} is not served by {crd['metadata']['name']}")
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            if not v.get("served", True):
                raise ValueError(f"{api_version} is not served")
            return v["schema"]["openAPIV3Schema"]
    raise ValueError(f"{crd['metadata']['name']} has no version {version}")


_env = celpy.Environment()
_programs: dict[str, Any] = {}


def _cel(rule: str) -> Any:
    if rule not in _programs:
        _programs[rule] = _env.program(_env.compile(rule))
    return _programs[rule]


def _cel_problems(schema: dict[str, Any], value: Any, path: str) -> list[Problem]:
    problems = []
    for v in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in v["rule"]:
            continue  # transition rules need the stored object; a create has none
        try:
            ok = _cel(v["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as e:
            problems.append(Problem(path, f"rule {v['rule']!r} did not evaluate: {e}"))
            continue
        if isinstance(ok, celpy.CELEvalError):
            problems.append(Problem(path, f"rule {v['rule']!r} did not evaluate: {ok}"))
        elif not bool(ok):
            problems.append(Problem(path, v.get("message") or f"failed rule {v['rule']}"))
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value:
                problems += _cel_problems(sub, value[name], f"{path}.{name}" if path else name)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name, item in value.items():
                problems += _cel_problems(extra, item, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems += _cel_problems(schema["items"], item, f"{path}[{i}]")
    return problems


def validate(crd: dict[str, Any], obj: dict[str, Any]) -> list[Problem]:
    """Everything the API server would reject in `obj` (metadata checked by kind and name only)."""
    if obj.get("kind") != crd["spec"]["names"]["kind"]:
        return [Problem("kind", f"expected {crd['spec']['names']['kind']}, got {obj.get('kind')}")]
    try:
        schema = version_schema(crd, obj.get("apiVersion", ""))
    except ValueError as e:
        return [Problem("apiVersion", str(e))]
    meta = obj.get("metadata") or {}
    problems = [] if meta.get("name") else [Problem("metadata.name", "required")]
    if crd["spec"]["scope"] == "Cluster" and meta.get("namespace"):
        problems.append(Problem("metadata.namespace", "cluster-scoped kind has no namespace"))
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    js = to_json_schema(
        {
            **schema,
            "properties": {
                k: v
                for k, v in (schema.get("properties") or {}).items()
                if k not in ("apiVersion", "kind", "metadata")
            },
        }
    )
    for err in jsonschema.Draft202012Validator(js).iter_errors(body):
        problems.append(Problem(".".join(str(p) for p in err.absolute_path), err.message))
    if not problems:  # CEL runs on objects that passed the schema, as in the API server
        problems += _cel_problems(schema, body, "")
    return problems
