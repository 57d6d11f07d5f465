"""Loader for BEIR-format folders: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

__all__ = ["Dataset", "load_beir"]


@dataclass
class Dataset:
    """A retrieval data set held in memory.

    Attributes:
        name: folder name.
        doc_ids: corpus ids in file order; position = corpus index used by the retrievers.
        titles: passage titles (may be empty strings).
        texts: passage texts.
        query_ids: ids of the queries that have judgements in the split, in file order.
        queries: their texts.
        qrels: ``{query_id: {doc_id: relevance}}`` for the split.
        query_fields: extra fields of each query record (e.g. MuSiQue's ``answer``), by id.
    """

    name: str
    doc_ids: list[str]
    titles: list[str]
    texts: list[str]
    query_ids: list[str]
    queries: list[str]
    qrels: dict[str, dict[str, int]]
    query_fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def passages(self) -> list[str]:
        """Texts to embed: ``title + " " + text`` (as BEIR and MTEB do), stripped."""
        return [f"{t} {x}".strip() for t, x in zip(self.titles, self.texts)]

    def qrels_list(self) -> list[dict[str, int]]:
        """Judgements aligned with :attr:`query_ids`."""
        return [self.qrels[q] for q in self.query_ids]

    def subset(self, n_queries: int) -> "Dataset":
        """The same corpus with only the first ``n_queries`` queries."""
        return self.query_range(0, n_queries)

    def query_range(self, start: int, stop: int) -> "Dataset":
        """The same corpus with only the queries ``[start, stop)`` (e.g. a tuning half)."""
        keep = self.query_ids[start:stop]
        return Dataset(self.name, self.doc_ids, self.titles, self.texts, keep, self.queries[start:stop],
                       {q: self.qrels[q] for q in keep}, {q: self.query_fields.get(q, {}) for q in keep})

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, passages={len(self.doc_ids)}, queries={len(self.query_ids)})"


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_beir(path: Union[str, Path], split: str = "test") -> Dataset:
    """Load a BEIR-format folder.

    Only queries with at least one judgement in ``qrels/<split>.tsv`` are kept (as BEIR's
    evaluation does); judgements for ids missing from the corpus raise.

    Args:
        path: folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
        split: qrels file to read.

    Returns:
        a :class:`Dataset`.
    """
    root = Path(path)
    for rel in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (root / rel).is_file():
            raise FileNotFoundError(f"{root / rel} not found: {root} is not a BEIR folder with split {split!r}")
    corpus = _read_jsonl(root / "corpus.jsonl")
    doc_ids = [str(d["_id"]) for d in corpus]
    known = set(doc_ids)
    qrels: dict[str, dict[str, int]] = {}
    with (root / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or header[:2] != ["query-id", "corpus-id"]:
            raise ValueError(f"{root}/qrels/{split}.tsv must start with a query-id/corpus-id/score header")
        for row in reader:
            if not row:
                continue
            qid, did, score = row[0], row[1], int(float(row[2]))
            if did not in known:
                raise ValueError(f"qrels/{split}.tsv judges corpus id {did!r}, which corpus.jsonl lacks")
            qrels.setdefault(qid, {})[did] = score
    query_ids, queries, fields = [], [], {}
    for q in _read_jsonl(root / "queries.jsonl"):
        qid = str(q["_id"])
        if qid in qrels:
            query_ids.append(qid)
            queries.append(q["text"])
            fields[qid] = {k: v for k, v in q.items() if k not in ("_id", "text")}
    return Dataset(
        name=root.name,
        doc_ids=doc_ids,
        titles=[d.get("title", "") or "" for d in corpus],
        texts=[d.get("text", "") or "" for d in corpus],
        query_ids=query_ids,
        queries=queries,
        qrels={q: qrels[q] for q in query_ids},
        query_fields=fields,
    )
