"""Example CRs (valid and invalid) against the generated schema, CEL rules included (cel-python)."""

from __future__ import annotations

import pytest
import yaml
from op_helpers import INVALID, example_crs
from skiff_operator.render import desired_children
from skiff_operator.spec import parse_spec
from skiff_operator.validation import _cel_errors, _root_schema, validate_spec

INVALID_CASES = sorted(p.name for p in INVALID.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(example_crs()))
def test_examples_are_valid(name: str) -> None:
    cr = example_crs()[name]
    assert validate_spec(cr["spec"]) == []
    parse_spec(cr["spec"])  # the typed view accepts what the schema accepts


@pytest.mark.parametrize("name", INVALID_CASES)
def test_invalid_crs_are_rejected_with_a_clear_message(name: str) -> None:
    text = (INVALID / name).read_text()
    expected = text.splitlines()[0].removeprefix("# expect:").strip()
    errors = validate_spec(yaml.safe_load(text)["spec"])
    assert errors, f"{name} was accepted"
    assert any(expected in e for e in errors), errors


def test_every_cel_rule_is_exercised_by_an_invalid_case() -> None:
    """Each rule's message appears for some invalid example: no rule is dead or untested."""
    messages = set()
    for name in INVALID_CASES:
        messages.update(validate_spec(yaml.safe_load((INVALID / name).read_text())["spec"]))

    def rules(node: dict):
        for rule in node.get("x-kubernetes-validations", []):
            yield rule["message"]
        for sub in (node.get("properties") or {}).values():
            yield from rules(sub)
        if isinstance(node.get("items"), dict):
            yield from rules(node["items"])

    for message in rules(_root_schema()["properties"]["spec"]):
        assert any(message in m for m in messages), f"no invalid example triggers: {message}"


def test_cel_rules_accept_edges() -> None:
    ok = [
        {"runtime": {"tensorParallel": 4}, "resources": {"gpus": 0}},
        {"runtime": {"tensorParallel": 4}, "resources": {"gpus": 4}},
        {"runtime": {"extraArgs": ["--enable-metrics", "--portal", "--model-path-hint"]}},
        {"autoscaling": {"mode": "keda", "minReplicas": 0, "prometheusAddress": "http://prom:9090"}},
        {"autoscaling": {"minReplicas": 3, "maxReplicas": 3}},
        {"model": {"source": "hf://a/b"}, "modelCache": {"pvc": "cache"}},
    ]
    for spec in ok:
        assert validate_spec(spec) == [], spec


def test_cel_evaluation_is_not_vacuous() -> None:
    schema = _root_schema()["properties"]["spec"]
    assert _cel_errors(schema, {"resources": {"gpus": 1}, "runtime": {"tensorParallel": 2}}, "spec")
    assert not _cel_errors(schema, {"resources": {"gpus": 2}, "runtime": {"tensorParallel": 2}}, "spec")


def test_defaults_from_the_schema_match_the_typed_models() -> None:
    from skiff_operator.validation import apply_defaults

    defaulted = apply_defaults(_root_schema()["properties"]["spec"], {})
    typed = parse_spec({}).model_dump(by_alias=True, exclude_none=True)
    for section in ("runtime", "routing", "rollout", "service", "disruption", "resources"):
        for key, value in defaulted[section].items():
            assert typed[section][key] == value, (section, key)
    assert desired_children({"metadata": {"name": "x", "namespace": "y", "uid": "z"}, "spec": defaulted})
