"""`skiff router`: the in-cluster OpenAI endpoint that routes by model to InferenceServices (no torch here)."""
