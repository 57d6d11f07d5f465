"""The command modules behind ``geograph demo``, ``geograph build-graph`` and ``geograph embed``."""
