"""Maniscope: its math, its module, its registry entry (``spec.SPEC``)."""
