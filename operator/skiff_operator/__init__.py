"""Skiff's Kubernetes operator: reconciles InferenceService (skiff.dev) into pods running `skiff serve`."""

__version__ = "0.1.0"
