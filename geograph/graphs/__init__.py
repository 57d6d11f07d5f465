"""Corpus-wide graphs: the ISO-RAG corpus graph and G3RAG's gain graph, built, saved and loaded the same way."""

from geograph.graphs.corpus_graph import CorpusGraph
from geograph.graphs.g3_graph import G3Graph

__all__ = ["CorpusGraph", "G3Graph"]
