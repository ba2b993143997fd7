"""Catalog data: accelerator systems, memory tiers and efficiency factors (YAML)."""
