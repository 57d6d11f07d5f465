"""In-process components for RAG frameworks, each a thin wrapper over :class:`geograph.Ranker` or
:class:`geograph.Retriever` (one batched module call per query list).

Import the one you use; nothing here imports a framework until then, and each needs its extra:

* :mod:`geograph.integrations.langchain` (``pip install 'geograph-rag[langchain]'``, ``langchain-core``):
  ``GeographCompressor`` (a ``BaseDocumentCompressor`` for Maniscope / Ricci-Filtration, sync and
  async) and ``GeographRetriever`` (a ``BaseRetriever`` for ISO-RAG / G3RAG / dense over a corpus);
* :mod:`geograph.integrations.llamaindex` (``geograph-rag[llamaindex]``, ``llama-index-core``):
  ``GeographPostprocessor`` (a ``BaseNodePostprocessor``) and ``GeographRetriever``;
* :mod:`geograph.integrations.haystack` (``geograph-rag[haystack]``, ``haystack-ai``): the components
  ``GeographRanker`` and ``GeographRetriever`` (with ``to_dict`` / ``from_dict``).

Each takes the method by its registered name (``"maniscope"``, ``"ricci"``, ``"iso"``, ``"g3"``,
``"dense"``) with its ``params``, or a built module. A query's documents are reranked in one
module call (padded, masked), never one per document. Texts are embedded by ``encoder``
(default: the offline all-MiniLM-L6-v2 of the ``text`` extra, :func:`geograph.text.default_encoder`),
which must be the model the corpus of a retriever was embedded with. Scores handed to the
frameworks are the method's own; rerankers add the relevance in [0, 1] where the framework has a field for it.
"""
