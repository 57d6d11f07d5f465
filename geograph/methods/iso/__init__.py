"""ISO-RAG: its math (with personalised PageRank), its module, its in-place updates, its registry entry
(``spec.SPEC``), its slow reference and benchmark."""
