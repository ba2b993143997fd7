"""dse: a design-space optimizer for the economics of training and serving large language models."""

from __future__ import annotations

__version__ = "0.1.0"
