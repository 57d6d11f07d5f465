"""The dense baseline: its module, its in-place updates, its registry entry (``spec.SPEC``)."""
