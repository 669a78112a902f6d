"""`skiff-router`: the in-cluster OpenAI endpoint that routes by model to InferenceServices.

Ships in the operator image: it imports neither torch nor the runtime (`skiff`), only skiff_contract."""
