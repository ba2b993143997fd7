"""Study kinds: one module each (spec, run, tables, plots), found through ``registry.KINDS``."""
