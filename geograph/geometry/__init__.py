"""Corpus-graph geometry that the method folders share with the corpus structures
(:mod:`geograph.graphs`), the saved artefacts (:mod:`geograph.artefacts`) and the projection
(:mod:`geograph.projection`): G3RAG's gain edges (``gain.py``) and ISO-RAG's isoperimetric pruning
and conformal volume (``isoperimetric.py``). It sits below the method folders because those lower
layers build on it."""
