"""What the operator, the router and the runtime must agree on: the InferenceService's API coordinates, the
labels they share, the served-name rule and the model-source URI grammar. No dependencies beyond the
standard library, so every image can import it."""

from skiff_contract.model_source import ModelSource, SourceError, parse_source
from skiff_contract.resource import (
    API_KEY_LABEL,
    API_PORT_NAME,
    API_VERSION,
    GROUP,
    INTERNAL_KEY_FIELD,
    INTERNAL_KEY_LABEL,
    ISVC_LABEL,
    KIND,
    METRICS_PORT_NAME,
    PLURAL,
    ROTATE_KEY_ANNOTATION,
    SINGULAR,
    VERSION,
    internal_key_secret_name,
    isvc_served_name,
    served_name,
)

__all__ = [
    "API_KEY_LABEL",
    "API_PORT_NAME",
    "API_VERSION",
    "GROUP",
    "INTERNAL_KEY_FIELD",
    "INTERNAL_KEY_LABEL",
    "ISVC_LABEL",
    "KIND",
    "METRICS_PORT_NAME",
    "PLURAL",
    "ROTATE_KEY_ANNOTATION",
    "SINGULAR",
    "VERSION",
    "ModelSource",
    "SourceError",
    "internal_key_secret_name",
    "isvc_served_name",
    "parse_source",
    "served_name",
]
