"""In-process components for RAG frameworks, each a thin wrapper over one batched module call.

Import the one you use; nothing here imports a framework until then, and each needs its extra:

* :mod:`geograph.integrations.langchain` (``pip install 'geograph-rag[langchain]'``, ``langchain-core``):
  ``GeographCompressor`` (a ``BaseDocumentCompressor`` for Maniscope / Ricci-Filtration, sync and
  async) and ``GeographRetriever`` (a ``BaseRetriever`` for ISO-RAG / G3RAG over a corpus);
* :mod:`geograph.integrations.llamaindex` (``geograph-rag[llamaindex]``, ``llama-index-core``):
  ``GeographPostprocessor`` (a ``BaseNodePostprocessor``) and ``GeographRetriever``;
* :mod:`geograph.integrations.haystack` (``geograph-rag[haystack]``, ``haystack-ai``): the components
  ``GeographRanker`` and ``GeographRetriever``.

A query's documents are reranked in one module call (padded, masked), never one per document.
Texts are embedded by ``encoder`` (default: the offline all-MiniLM-L6-v2 of the ``text`` extra,
:class:`geograph.data.Encoder` without an on-disk cache), which must be the model the corpus of
a retriever was embedded with. Scores handed to the frameworks are the method's own.
"""
