"""Model source URIs: hf://org/name[@revision], pvc://claim[/path], file:///path; none is the embedded model.

The operator turns a source into volumes and a download step, `skiff download` fetches or checks it; both
parse it here, so they accept and reject the same URIs.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMS = "hf://org/name[@revision], pvc://claim/path or file:///path"


class SourceError(ValueError):
    """A model source URI that does not parse; the message names the URI and the expected form."""


@dataclass(frozen=True)
class ModelSource:
    scheme: str  # "hf", "pvc", "file" or "embedded"
    location: str  # org/name, claim, or absolute path
    path: str = ""  # path inside the claim (pvc)
    revision: str | None = None  # hf revision


EMBEDDED = ModelSource("embedded", "")


def parse_source(uri: str | None) -> ModelSource:
    """Split a model source URI; no URI (None or "") is the embedded model."""
    if not uri:
        return EMBEDDED
    scheme, sep, rest = uri.partition("://")
    if not sep or not rest:
        raise SourceError(f"{uri!r} is not a model source: use {FORMS}")
    if scheme == "hf":
        repo, _, revision = rest.partition("@")
        org, _, name = repo.partition("/")
        if not org or not name or "/" in name:
            raise SourceError(f"{uri!r}: hf sources are hf://org/name[@revision]")
        return ModelSource("hf", repo, revision=revision or None)
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not claim:
            raise SourceError(f"{uri!r}: pvc sources name a claim: pvc://claim/path")
        return ModelSource("pvc", claim, path=path.strip("/"))
    if scheme == "file":
        if not rest.startswith("/"):
            raise SourceError(f"{uri!r}: file sources need an absolute path (file:///path)")
        return ModelSource("file", rest)
    raise SourceError(f"{uri!r}: unsupported scheme {scheme!r} (hf, pvc, file)")
