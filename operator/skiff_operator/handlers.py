"""Thin kopf handlers: reconcile an InferenceService (render -> server-side apply -> prune -> status) and
recompute its status whenever its Deployment or Pods change. No timers or daemons: kopf would put a finalizer
on every InferenceService for them, and deletion must not depend on the operator running.

Importing this module registers every handler, the autoscaling package's too. `ISVC` (the resource
selector) and `STATE` (the API connection and settings) live in state.py, which other handler modules
import; `sync_status(ns, name)` and `reconcile(ns, name)` are safe to call from any handler."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from skiff_contract import GROUP, ROTATE_KEY_ANNOTATION, internal_key_secret_name

from . import access, render
from .autoscaling import handlers as autoscaling_handlers
from .kube import owned_by
from .metadata import FIELD_MANAGER, LABEL_HASH, LABEL_ISVC
from .metrics import METRICS
from .spec import parse_spec
from .state import ISVC, STATE
from .status import Observed, compute_status, status_changed
from .validation import validate_spec

__all__ = ["ISVC", "STATE", "autoscaling_handlers", "reconcile", "sync_status"]
log = logging.getLogger("skiff_operator")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _backoff(retry: int) -> float:
    return float(min(300, 2 * 2 ** min(retry, 8)))


def sync_status(namespace: str, name: str) -> dict[str, Any] | None:
    """Recompute and write the status of one InferenceService from what the API shows now."""
    cluster = STATE.api()
    with STATE.lock((namespace, name)):
        isvc = cluster.get_isvc(namespace, name)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            METRICS.forget(namespace, name)
            return None
        error = STATE.errors.get((namespace, name))
        try:
            desired = render.deployment(isvc, parse_spec(isvc.get("spec")), STATE.settings)
            desired_hash = desired["metadata"]["annotations"][LABEL_HASH]
            STATE.desired_hashes[(namespace, name)] = desired_hash
        except (ValidationError, ValueError):
            desired_hash = ""
        dep, pods = cluster.observe(namespace, name)
        new, events = compute_status(isvc, Observed(dep, pods, desired_hash, error), _now(), STATE.settings)
        METRICS.record_status(isvc, new)
        if status_changed(isvc.get("status"), new):
            try:
                cluster.write_status(namespace, name, new)
            except ApiException as e:
                if e.status == 404:
                    return None  # deleted meanwhile: its children's last events are no failure
                raise
        for ev in events:
            kopf.event(isvc, type=ev.type, reason=ev.reason, message=ev.message[:1000])
        return new


class RotationDeferred(kopf.TemporaryError):
    """A rotation asked for too soon after the last one; everything else was reconciled."""


def sync_internal_key(cluster: Any, isvc: dict[str, Any]) -> float:
    """Create, keep or rotate the InferenceService's internal-key Secret (or remove it when the spec names
    its own key); returns the seconds a requested rotation must still wait (0: none)."""
    meta = isvc["metadata"]
    namespace, uid = meta["namespace"], meta["uid"]
    secret_name = internal_key_secret_name(meta["name"])
    settings = STATE.settings
    if not access.wants_internal_key(parse_spec(isvc.get("spec")), settings.internal_api_keys):
        if cluster.delete_owned("v1", "Secret", namespace, secret_name, uid):
            log.info("%s/%s: removed Secret/%s", namespace, meta["name"], secret_name)
        return 0.0
    existing = cluster.read("v1", "Secret", namespace, secret_name)
    if existing is not None and not owned_by(existing, uid):
        raise LookupError(
            f"Secret {secret_name} exists and is not this InferenceService's: rename or delete it"
        )
    current = access.read_internal_key(existing)
    key, wait = access.next_internal_key(
        current, access.requested_rotation(isvc), time.time(), settings.key_rotation_min_seconds
    )
    if current is not None and key != current:
        kopf.event(isvc, type="Normal", reason="KeyRotated", message=f"Secret {secret_name}: a new key")
    cluster.apply(access.internal_key_secret(isvc, key))
    STATE.rotations[(namespace, meta["name"])] = key.rotation
    return wait


@METRICS.reconciled
def reconcile(namespace: str, name: str, retry: int = 0) -> None:
    """Bring the children of one InferenceService to the desired state, then write its status."""
    cluster = STATE.api()
    isvc = cluster.get_isvc(namespace, name)
    if isvc is None or isvc["metadata"].get("deletionTimestamp"):
        return  # deletion is garbage collection's job: every child has a controller owner reference
    key = (namespace, name)
    problems = validate_spec(isvc.get("spec"))
    if problems:
        STATE.errors[key] = "invalid spec: " + "; ".join(problems)
        sync_status(namespace, name)
        raise kopf.PermanentError(STATE.errors[key])  # retried when the spec changes
    children = render.desired_children(isvc, STATE.settings)
    try:
        wait = sync_internal_key(cluster, isvc)  # before the Deployment: its pods mount the Secret
        for child in children:
            cluster.apply(child)
        keep = {(c["kind"], c["metadata"]["name"]) for c in children}
        removed = cluster.prune(namespace, name, isvc["metadata"]["uid"], keep)
    except (ApiException, LookupError) as e:
        reason = getattr(e, "reason", None) or str(e)
        body = getattr(e, "body", None)
        STATE.errors[key] = f"applying children failed: {reason} {body or ''}".strip()[:800]
        sync_status(namespace, name)
        raise kopf.TemporaryError(STATE.errors[key], delay=_backoff(retry)) from e
    STATE.errors.pop(key, None)
    if removed:
        log.info("%s/%s: removed %s", namespace, name, ", ".join(removed))
    sync_status(namespace, name)
    if wait > 0:  # retried then; the previous key must reach every pod before it can be dropped
        raise RotationDeferred(f"internal key rotation waits {wait:.0f} s after the last one", delay=wait)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    cluster = STATE.api()
    if not cluster.serves("policy/v1", "PodDisruptionBudget"):  # Kubernetes < 1.21
        STATE.settings = dataclasses.replace(STATE.settings, pdb_api_version="policy/v1beta1")
    if not cluster.serves("autoscaling/v2", "HorizontalPodAutoscaler"):  # Kubernetes < 1.23
        STATE.settings = dataclasses.replace(STATE.settings, hpa_api_version="autoscaling/v2beta2")
    # Handler progress in annotations, never in status: status is the public API (conditions).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own events describe transitions; kopf posts failures
    settings.posting.reporting_component = FIELD_MANAGER  # "From" in kubectl describe: the operator's name
    settings.posting.reporting_instance = os.environ.get("POD_ID") or socket.gethostname()
    settings.execution.max_workers = 8


@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
@kopf.on.resume(*ISVC)
def on_isvc(namespace: str, name: str, retry: int, **_: Any) -> None:
    reconcile(namespace, name, retry)


@kopf.on.event(*ISVC, annotations={ROTATE_KEY_ANNOTATION: kopf.PRESENT})
def on_rotation_request(body: Mapping[str, Any], namespace: str, name: str, **_: Any) -> None:
    """kopf leaves annotations under its storage prefix (skiff.dev/) out of update diffs, so a rotation
    request is noticed here, on any event of the object, and handled once per new value."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    if STATE.rotations.get((namespace, name)) == access.requested_rotation(dict(body)):
        return
    _reconcile_rotation(namespace, name)


def _reconcile_rotation(namespace: str, name: str) -> None:
    """reconcile(); a deferred rotation is retried by a timer (event handlers are not retried by kopf)."""
    STATE.rotation_timers.pop((namespace, name), None)
    try:
        reconcile(namespace, name)
    except RotationDeferred as e:
        if (namespace, name) not in STATE.rotation_timers:
            # in a copy of this handler's context: kopf.event() and the status sync read kopf's context vars
            run = contextvars.copy_context().run
            timer = threading.Timer(e.delay or 1.0, run, (_reconcile_rotation, namespace, name))
            timer.daemon = True
            STATE.rotation_timers[(namespace, name)] = timer
            timer.start()
    except (kopf.PermanentError, kopf.TemporaryError, ApiException) as e:
        log.warning("%s/%s: key rotation: %s", namespace, name, e)


def _owner(labels: Mapping[str, str]) -> str | None:
    return labels.get(LABEL_ISVC)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ISVC: kopf.PRESENT})
@kopf.on.event("v1", "services", labels={LABEL_ISVC: kopf.PRESENT})
@kopf.on.event("v1", "pods", labels={LABEL_ISVC: kopf.PRESENT})
def on_child(
    event: Mapping[str, Any], body: Mapping[str, Any], namespace: str, labels: Mapping[str, str], **_: Any
) -> None:
    owner = _owner(labels)
    if owner is None:
        return
    if event.get("type") == "DELETED" and body.get("kind") in ("Deployment", "Service"):
        with contextlib.suppress(kopf.PermanentError, kopf.TemporaryError):
            reconcile(namespace, owner)  # someone removed a child: put it back (no-op if the owner is gone)
        return
    status = sync_status(namespace, owner)
    if body.get("kind") == "Deployment" and status is not None:
        applied = (body.get("metadata", {}).get("annotations") or {}).get(LABEL_HASH)
        if applied != STATE.desired_hashes.get((namespace, owner), applied):
            with contextlib.suppress(kopf.PermanentError, kopf.TemporaryError):
                reconcile(namespace, owner)  # the Deployment was edited behind our back: re-apply
