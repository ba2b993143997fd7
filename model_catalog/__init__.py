"""Catalog data: model architectures (YAML)."""
