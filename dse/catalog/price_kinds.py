"""The kinds of price per chip-hour a system may carry, and the default kind.

Import-light: the command line reads them at start-up, before any catalog is loaded.
"""

from __future__ import annotations

PRICE_KINDS = ("tco_hyperscaler", "tco_neocloud", "rental_3yr", "on_demand")
"""Kinds of price per chip-hour a system may carry; a comparison uses one kind only."""
DEFAULT_PRICE_KIND = "on_demand"
"""The kind studies compare at unless they say otherwise: it has the broadest sourced coverage of the
catalog (12 systems, the TPUs and the A100 among them; the TCO kinds cover 9-10, none of the TPUs)."""
