"""Maniscope: its math, its module, its registry entry (``spec.SPEC``), its slow reference and benchmark."""
