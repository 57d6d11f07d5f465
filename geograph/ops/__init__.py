"""Shared tensor ops below the engines and the methods: cosine similarity and normalisation,
batched k-NN adjacency and edge-list helpers, shortest paths, ranking metrics.

Pure functions on padded, masked batches; no state. Both engines and every method may import
them; they import nothing of geograph but the base helpers (``_checks``, ``outputs``).
"""
