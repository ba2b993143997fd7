"""Catalogs: units, YAML loading with sourced quantities, hardware systems and model architectures."""
