"""Adapters that plug AdaptiveLoad into other libraries' models (optional extras)."""
