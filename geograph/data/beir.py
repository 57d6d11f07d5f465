"""Loader for BEIR-format folders: corpus.jsonl, queries.jsonl, qrels/<split>.tsv."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Dataset", "load_beir", "check_beir", "BEIRError"]


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

    def subset(self, n_queries: int) -> Dataset:
        """The same corpus with only the first ``n_queries`` queries."""
        return self.query_range(0, n_queries)

    def query_range(self, start: int, stop: int) -> Dataset:
        """The same corpus with only the queries ``[start, stop)`` (e.g. a tuning half)."""
        keep = self.query_ids[start:stop]
        return Dataset(
            self.name,
            self.doc_ids,
            self.titles,
            self.texts,
            keep,
            self.queries[start:stop],
            {q: self.qrels[q] for q in keep},
            {q: self.query_fields.get(q, {}) for q in keep},
        )

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, passages={len(self.doc_ids)}, queries={len(self.query_ids)})"


class BEIRError(ValueError):
    """A folder that cannot be read as a BEIR data set.

    Attributes:
        argument: what was wrong: ``"path"`` (the folder) or ``"split"`` (the qrels split), so
            that a command line can name its own option.
    """

    def __init__(self, message: str, argument: str = "path") -> None:
        super().__init__(message)
        self.argument = argument


class BEIRFileError(BEIRError, FileNotFoundError):
    """A :class:`BEIRError` for a folder or file that does not exist."""


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise BEIRError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from None
    return out


def check_beir(path: str | Path, split: str = "test") -> Path:
    """Check that ``path`` is a BEIR-format folder with ``qrels/<split>.tsv``, without reading it.

    Cheap (file system only), so a command can reject a wrong folder or split before any slow
    work.

    Args:
        path: the folder.
        split: the qrels split that will be read.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        BEIRError: one line saying what is missing; ``argument`` is ``"path"`` or ``"split"``.

    Example:
        >>> from geograph.data import DEMO_PATH
        >>> check_beir(DEMO_PATH, "test").name
        'demo'
        >>> try:
        ...     check_beir(DEMO_PATH, "dev")
        ... except BEIRError as e:
        ...     print(e.argument)
        split
    """
    root = Path(path)
    if not root.exists():
        raise BEIRFileError(f"{root}: no such folder")
    if not root.is_dir():
        raise BEIRError(f"{root} is a file, not a folder")
    missing = [name for name in ("corpus.jsonl", "queries.jsonl") if not (root / name).is_file()]
    if missing:
        raise BEIRFileError(f"{root} is not a BEIR folder: no {' and no '.join(missing)}")
    if not (root / "qrels" / f"{split}.tsv").is_file():
        found = sorted(q.stem for q in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
        have = f"splits here: {', '.join(found)}" if found else "it has no qrels/*.tsv at all"
        raise BEIRFileError(f"{root} is not a BEIR folder with split {split!r}: no qrels/{split}.tsv ({have})", "split")
    if (root / "corpus.jsonl").stat().st_size == 0:
        raise BEIRError(f"{root}/corpus.jsonl is empty: no passages")
    return root


def load_corpus(path: str | Path) -> Dataset:
    """The passages of a BEIR-format folder (its ``corpus.jsonl``) or of one JSONL file of passages,
    without queries or judgements.

    Args:
        path: folder with ``corpus.jsonl``, or a JSONL file of BEIR corpus records
            (``_id``, ``title``, ``text``).

    Returns:
        a :class:`Dataset` named after the folder (or the file's stem) with ``doc_ids``, ``titles``
        and ``texts`` (a missing or null title or text is ``""``) and no queries.

    Raises:
        BEIRError: for a missing or empty ``corpus.jsonl``, a malformed line or a record
            without ``_id``.

    Example:
        >>> from geograph.data import DEMO_PATH
        >>> len(load_corpus(DEMO_PATH).doc_ids), len(load_corpus(DEMO_PATH / "corpus.jsonl").doc_ids)
        (111, 111)
    """
    root = Path(path)
    file = root if root.is_file() else root / "corpus.jsonl"
    if not file.is_file():
        raise BEIRFileError(f"{root} is not a BEIR folder: no corpus.jsonl")
    corpus = _read_jsonl(file)
    if not corpus:
        raise BEIRError(f"{file} is empty: no passages")
    if any("_id" not in d for d in corpus):
        raise BEIRError(f"{file}: every record needs an '_id'")
    return Dataset(
        name=root.stem if root.is_file() else root.name,
        doc_ids=[str(d["_id"]) for d in corpus],
        titles=[d.get("title", "") or "" for d in corpus],
        texts=[d.get("text", "") or "" for d in corpus],
        query_ids=[],
        queries=[],
        qrels={},
    )


def load_beir(path: str | Path, split: str = "test") -> Dataset:
    """Load a BEIR-format folder.

    Only queries with at least one judgement in ``qrels/<split>.tsv`` are kept (as BEIR's
    evaluation does); judgements for ids missing from the corpus raise.

    Args:
        path: folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
        split: qrels file to read.

    Returns:
        a :class:`Dataset`.

    Raises:
        BEIRError: (a ``ValueError``; a ``FileNotFoundError`` too when something is missing)
            with a one-line message, for a missing folder or split, an empty corpus, or a
            malformed file.
    """
    root = check_beir(path, split)
    passages = load_corpus(root)
    doc_ids = passages.doc_ids
    known = set(doc_ids)
    qrels: dict[str, dict[str, int]] = {}
    with (root / "qrels" / f"{split}.tsv").open(encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or header[:2] != ["query-id", "corpus-id"]:
            raise BEIRError(f"{root}/qrels/{split}.tsv must start with a query-id/corpus-id/score header", "split")
        for row in reader:
            if not row:
                continue
            qid, did, score = row[0], row[1], int(float(row[2]))
            if did not in known:
                raise BEIRError(f"qrels/{split}.tsv judges corpus id {did!r}, which corpus.jsonl lacks", "split")
            qrels.setdefault(qid, {})[did] = score
    query_ids, queries, fields = [], [], {}
    for q in _read_jsonl(root / "queries.jsonl"):
        qid = str(q["_id"])
        if qid in qrels:
            query_ids.append(qid)
            queries.append(q["text"])
            fields[qid] = {k: v for k, v in q.items() if k not in ("_id", "text")}
    if not query_ids:
        raise BEIRError(f"{root}: no query of queries.jsonl has a judgement in qrels/{split}.tsv", "split")
    return Dataset(
        name=root.name,
        doc_ids=doc_ids,
        titles=passages.titles,
        texts=passages.texts,
        query_ids=query_ids,
        queries=queries,
        qrels={q: qrels[q] for q in query_ids},
        query_fields=fields,
    )
