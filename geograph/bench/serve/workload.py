"""The requests of ``geograph bench serve``: distinct query texts, vectors and ``/retrieve`` / ``/rerank``
bodies made from the corpus (seeded)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from geograph import registry

if TYPE_CHECKING:
    import torch

    from geograph.data import Dataset

KINDS = ("retrieve_text", "retrieve_vector", "rerank_texts", "rerank_ids")


class Workload:
    """Distinct request texts and bodies made from the corpus (seeded)."""

    def __init__(self, dataset: Dataset, emb: torch.Tensor, method: str, seed: int, candidates: int) -> None:
        self.ids, self.passages, self.emb = list(dataset.doc_ids), dataset.passages(), emb
        self.words = " ".join(self.passages).split()
        self.rng = random.Random(seed)
        self.method, self.candidates = method, min(candidates, len(self.ids))
        self.reranker = method in registry.RERANKERS
        self.serial = 0

    def text(self) -> str:
        """A query text no earlier call returned (a window of corpus words and a serial number)."""
        self.serial += 1
        n = self.rng.randint(4, 16)
        i = self.rng.randrange(max(1, len(self.words) - n))
        return f"{' '.join(self.words[i : i + n])} {self.serial}"

    def vector(self) -> list[float]:
        import torch

        v = self.emb[self.rng.randrange(len(self.ids))] + 0.3 * torch.randn(self.emb.shape[1], generator=self._gen())
        return torch.nn.functional.normalize(v, dim=0).tolist()

    def _gen(self) -> torch.Generator:
        import torch

        return torch.Generator().manual_seed(self.rng.randrange(2**31))

    def k(self) -> int:
        return {"g3": 5, "iso": 5}.get(self.method, 10)

    def make(self, kind: str) -> tuple[str, dict[str, Any]]:
        if kind == "retrieve_text":
            return "/retrieve", {"query": self.text(), "k": self.k()}
        if kind == "retrieve_vector":
            return "/retrieve", {"query_embedding": self.vector(), "k": self.k()}
        picks = self.rng.sample(range(len(self.ids)), self.candidates)
        if kind == "rerank_texts":
            # corpus passages cut at a random word: candidate texts the server has not seen yet
            docs = [" ".join(self.passages[j].split()[: self.rng.randint(8, 40)]) for j in picks]
            return "/rerank", {"query": self.text(), "candidates": docs}
        return "/rerank", {"query": self.text(), "candidate_ids": [self.ids[j] for j in picks]}

    def v2_rerank(self, documents: int, fresh: bool, every: bool = False) -> tuple[str, dict[str, Any]]:
        """A ``/v2/rerank`` body of a distinct query and ``documents`` documents: passages cut at a
        random word and numbered (``fresh``: texts the server has not seen), else whole corpus
        passages (the same texts recur; ``every``: all of them, to fill the server's text cache)."""
        if every:
            picks = list(range(len(self.ids)))
        else:
            picks = self.rng.sample(range(len(self.ids)), min(documents, len(self.ids)))
        if fresh:
            self.serial += 1
            docs = [f"{' '.join(self.passages[j].split()[: self.rng.randint(8, 40)])} {self.serial}" for j in picks]
        else:
            docs = [self.passages[j] for j in picks]
        return "/v2/rerank", {"query": self.text(), "documents": docs}

    def kinds(self) -> tuple[str, ...]:
        return KINDS if self.reranker else KINDS[:2]

    def mixed(self, n: int) -> list[tuple[str, str, dict[str, Any]]]:
        kinds = self.kinds()
        return [(kind, *self.make(kind)) for kind in (kinds[i % len(kinds)] for i in range(n))]
