"""What the operator, the router and the runtime must agree on: the InferenceService's API coordinates, the
labels they share, the served-name rule and the model-source URI grammar. No dependencies beyond the
standard library, so every image can import it."""

from skiff_contract.model_source import ModelSource, SourceError, parse_source
from skiff_contract.resource import (
    API_KEY_LABEL,
    API_VERSION,
    GROUP,
    ISVC_LABEL,
    KIND,
    PLURAL,
    SINGULAR,
    VERSION,
    isvc_served_name,
    served_name,
)

__all__ = [
    "API_KEY_LABEL",
    "API_VERSION",
    "GROUP",
    "ISVC_LABEL",
    "KIND",
    "PLURAL",
    "SINGULAR",
    "VERSION",
    "ModelSource",
    "SourceError",
    "isvc_served_name",
    "parse_source",
    "served_name",
]
