"""CorpusGraph: passage embeddings plus an undirected sparse passage graph, with builders."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from geograph._checks import check_positive_int, check_tensor
from geograph._io import atomic_torch_save, atomic_write_json, check_file_size, one_line, read_json, read_torch
from geograph.functional.graphs import clean_edge_index, csr_rowptr
from geograph.functional.knn_build import self_topk
from geograph.functional.knn_policy import DEFAULT_RECALL_TARGET, IVFOptions, resolve_index
from geograph.functional.similarity import normalize, unit_rows
from geograph.outputs import true_first

__all__ = ["CorpusGraph"]

_FORMAT = 1
_META = "graph.json"


class CorpusGraph(nn.Module):
    """Passage embeddings ``(V, D)`` and an undirected graph over the passages, stored sparse.

    The graph is kept as a clean ``edge_index (2, E)`` (both directions, sorted by source, no
    duplicates, no self loops: those are dropped by every builder) and its CSR row pointer;
    nothing ``V x V`` is ever materialised. Isolated passages are allowed.

    A :class:`torch.nn.Module` whose tensors are buffers (``embeddings``, ``edge_index``,
    ``rowptr``): ``.to(device)``, ``.to(dtype)``, ``.cuda()`` and ``state_dict()`` carry the
    whole graph, and a module holding it (:class:`~geograph.ISORetriever`) moves it along.
    ``.to(dtype)`` casts only the embeddings; the integer index buffers keep their dtype.

    Builders: :meth:`from_knn`, :meth:`from_groups`, :meth:`from_mentions`,
    :meth:`from_edge_index`; :meth:`save` / :meth:`load` a directory.

    Args:
        embeddings: ``(V, D)`` floating passage embeddings (finite).
        edge_index: ``(2, E)`` integer node pairs, either direction.
        name: how the graph was built (kept in :meth:`save`).

    Example:
        >>> g = CorpusGraph(torch.eye(3), torch.tensor([[0, 1], [1, 1]]))
        >>> g.num_edges, g.degree().tolist()
        (1, [1, 1, 0])
    """

    embeddings: Tensor
    edge_index: Tensor
    rowptr: Tensor

    def __init__(self, embeddings: Tensor, edge_index: Tensor, *, name: str = "edge_index") -> None:
        super().__init__()
        check_tensor(embeddings, "embeddings", 2)
        if embeddings.shape[0] < 1:
            raise ValueError("embeddings must hold at least one passage")
        if isinstance(edge_index, Tensor):
            edge_index = edge_index.to(embeddings.device)
        clean = clean_edge_index(edge_index, embeddings.shape[0])
        self.name = name
        self.build_info: dict = {}  # how a builder made it (index, seconds per stage); saved in graph.json
        self.register_buffer("embeddings", embeddings)
        self.register_buffer("edge_index", clean)
        self.register_buffer("rowptr", csr_rowptr(clean[0], embeddings.shape[0]))

    # -- properties ---------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.rowptr.shape[0]) - 1  # (a shape: no read of the embeddings in a traced forward)

    @property
    def num_edges(self) -> int:
        """Undirected edges (each stored in both directions)."""
        return int(self.edge_index.shape[1]) // 2

    @property
    def col(self) -> Tensor:
        """CSR column indices (the targets of :attr:`edge_index`, grouped by source)."""
        return self.edge_index[1]

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    def degree(self) -> Tensor:
        """``(V,)`` long node degrees."""
        return self.rowptr[1:] - self.rowptr[:-1]

    def extra_repr(self) -> str:
        return f"nodes={self.num_nodes}, edges={self.num_edges}, dim={self.embeddings.shape[1]}, name={self.name!r}"

    # -- builders -----------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, embeddings: Tensor, edge_index: Tensor) -> CorpusGraph:
        """A graph from given node pairs ``(2, E)`` (either direction; moved to the embeddings' device)."""
        return cls(embeddings, edge_index, name="edge_index")

    @classmethod
    def from_knn(
        cls,
        embeddings: Tensor,
        k: int,
        *,
        chunk_size: int = 4096,
        faiss: bool = False,
        index: str = "exact",
        nlist: int | None = None,
        nprobe: int | None = None,
        sample: int | None = None,
        seed: int = 0,
        recall_target: float | None = DEFAULT_RECALL_TARGET,
        progress: bool = False,
    ) -> CorpusGraph:
        """Each passage links to its ``k`` most cosine-similar other passages (union, undirected).

        ``index="exact"`` (default) scans every pair with the tiled all-pairs routine
        (:func:`~geograph.functional.allpairs.tiled_topk`, tiles of ``chunk_size``: memory
        ``O(chunk_size^2 + V k)``, time ``O(V^2 D)``). ``index="ivf"`` joins IVF cells instead
        (:func:`~geograph.functional.ivf_join.ivf_self_topk`: ``nlist`` cells trained on ``sample``
        passages, each joined with its ``nprobe`` nearest; the scores are exact, a pair whose
        cells never meet is missed; with ``nprobe`` left out, it is chosen on sampled rows so
        that the join finds ``recall_target`` of each row's exact neighbours, or the build falls
        back to the exact scan, and the recall is measured on other sampled rows: see
        :func:`~geograph.functional.ivf_join.ivf_self_topk`; ``None`` skips both); ``index="auto"`` is exact up to
        :data:`~geograph.functional.knn_policy.AUTO_EXACT_MAX` passages and IVF above, and logs its
        choice. ``faiss=True`` uses an exact FAISS inner-product index when ``faiss`` is
        installed (the same neighbours up to ties). ``k`` clamps to ``V - 1``. Ties: lowest
        index first. ``progress`` shows a bar with ETA. :attr:`build_info` records the index,
        the seconds of each stage and, for IVF, ``nprobe`` and the measured recall.
        """
        check_tensor(embeddings, "embeddings", 2)
        k = check_positive_int(k, "k")
        check_positive_int(chunk_size, "chunk_size")
        v = embeddings.shape[0]
        k = min(k, v - 1)
        if k < 1:
            return cls(embeddings, torch.zeros(2, 0, dtype=torch.long, device=embeddings.device), name="knn")
        if embeddings.dtype in (torch.float16, torch.bfloat16) and embeddings.device.type == "cpu":
            z = normalize(embeddings.float())  # CPU matrix products of half floats are slow and round the scores
        else:
            z = unit_rows(embeddings)  # in the embeddings' dtype (float64 stays float64); unit rows: no copy
        seconds: dict = {}
        report: dict = {}
        index = "faiss-flat" if faiss else resolve_index(index, v, "CorpusGraph.from_knn")
        if faiss:
            idx = _faiss_knn(z, k + 1)
        else:
            lists = self_topk(
                z,
                k,
                index=index,
                ivf=IVFOptions(nlist=nlist, nprobe=nprobe, sample=sample, seed=seed, recall_target=recall_target),
                block=chunk_size,
                progress="k-NN graph" if progress else False,
            )
            idx, seconds = lists.indices, lists.seconds
            report = {} if lists.ivf is None else lists.ivf.as_dict()
            del lists
        del z
        if idx.shape[1] > k:  # FAISS returns the passage itself among the k + 1
            self_hit = idx == torch.arange(v, device=idx.device).unsqueeze(1)
            idx = idx.gather(1, true_first(~self_hit, k))
        src = torch.arange(v, device=idx.device).repeat_interleave(k)
        dst = idx.reshape(-1)
        ok = dst >= 0  # an IVF row with fewer than k candidates
        graph = cls(embeddings, torch.stack([src[ok], dst[ok]]), name=f"knn{k}")
        graph.build_info = {"index": index, "seconds": seconds, **report}
        return graph

    @classmethod
    def from_groups(cls, embeddings: Tensor, groups: Iterable[Sequence[int]]) -> CorpusGraph:
        """Co-occurrence: passages listed in the same group are all linked (a clique per group).

        ``groups`` is any iterable of lists of passage indices (e.g. the passages of one
        training instance); singletons add nothing.
        """
        src, dst = [], []
        v = embeddings.shape[0]
        for group in groups:
            g = torch.as_tensor(list(group), dtype=torch.long)
            if g.numel() and (int(g.min()) < 0 or int(g.max()) >= v):
                raise ValueError(f"group {list(group)[:5]} holds a passage index outside [0, {v})")
            if g.numel() > 1:
                a, b = torch.meshgrid(g, g, indexing="ij")
                src.append(a.reshape(-1))
                dst.append(b.reshape(-1))
        if not src:
            return cls(embeddings, torch.zeros(2, 0, dtype=torch.long, device=embeddings.device), name="groups")
        return cls(embeddings, torch.stack([torch.cat(src), torch.cat(dst)]).to(embeddings.device), name="groups")

    @classmethod
    def from_mentions(
        cls,
        embeddings: Tensor,
        titles: Sequence[str],
        texts: Sequence[str],
        *,
        min_title_len: int = 4,
        case_sensitive: bool = False,
    ) -> CorpusGraph:
        """Hyperlink-like graph: passage ``u`` links to ``v`` when ``u``'s text mentions ``v``'s title.

        A zero-LLM stand-in for Wikipedia hyperlinks on multi-hop corpora. All titles are
        matched in one pass over each text with an Aho-Corasick automaton (``pyahocorasick``),
        at word boundaries; titles shorter than ``min_title_len`` characters are ignored (too
        ambiguous), and a passage sharing a title with others links to all of them. A passage
        does not link to itself. Matching is case-insensitive unless ``case_sensitive``.
        """
        try:
            import ahocorasick
        except ImportError as exc:  # pragma: no cover - declared dependency
            raise ImportError(
                "from_mentions needs pyahocorasick (a dependency of geograph-rag): pip install 'pyahocorasick>=2.0'"
            ) from exc
        v = embeddings.shape[0]
        if len(titles) != v or len(texts) != v:
            raise ValueError(f"need one title and one text per passage ({v}), got {len(titles)} and {len(texts)}")
        fold = (lambda s: s) if case_sensitive else (lambda s: s.casefold())
        by_title: dict[str, list[int]] = {}
        for i, t in enumerate(titles):
            key = fold(str(t).strip())
            if len(key) >= min_title_len:
                by_title.setdefault(key, []).append(i)
        src, dst = [], []
        if by_title:
            auto = ahocorasick.Automaton()
            for key, ids in by_title.items():
                auto.add_word(key, (len(key), ids))
            auto.make_automaton()
            for u, text in enumerate(texts):
                body = fold(str(text))
                for end, (length, ids) in auto.iter(body):
                    start = end - length + 1
                    if (start > 0 and body[start - 1].isalnum()) or (end + 1 < len(body) and body[end + 1].isalnum()):
                        continue  # inside a longer word
                    for w in ids:
                        if w != u:
                            src.append(u)
                            dst.append(w)
        ei = torch.tensor([src, dst], dtype=torch.long) if src else torch.zeros(2, 0, dtype=torch.long)
        return cls(embeddings, ei.to(embeddings.device), name="mentions")

    # -- persistence --------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write ``embeddings.pt``, ``edge_index.pt`` and ``graph.json`` into ``directory``.

        Each file is written under a temporary name and renamed into place; ``graph.json`` (which
        :meth:`load` needs, and which records the other files' sizes) is removed first and
        written last, so a save killed at any point leaves either the previous graph or a
        directory that does not load, never a mix of two.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / _META).unlink(missing_ok=True)  # not loadable until the new graph.json is in place
        sizes = {
            "embeddings.pt": atomic_torch_save(self.embeddings.cpu(), path / "embeddings.pt"),
            "edge_index.pt": atomic_torch_save(self.edge_index.cpu(), path / "edge_index.pt"),
        }
        meta = {
            "format": _FORMAT,
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "dim": int(self.embeddings.shape[1]),
            "files": sizes,
            "build": self.build_info,
        }
        atomic_write_json(meta, path / _META)
        return path

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        device: str | torch.device | None = None,
        corpus_shape: tuple[int, int] | None = None,
    ) -> CorpusGraph:
        """Read a graph written by :meth:`save`.

        Args:
            directory: the directory :meth:`save` wrote.
            device: where to put the tensors (default CPU).
            corpus_shape: ``(V, D)`` of the corpus the graph must fit, if known.

        Raises:
            ValueError: one line naming the file: no ``graph.json``, another format version, a
                truncated or unreadable file, tensors whose sizes do not match ``graph.json``,
                or a graph whose size does not match ``corpus_shape``.
        """
        path = Path(directory)
        meta_file = path / _META
        if not meta_file.is_file():
            raise ValueError(f"{path} is not a saved CorpusGraph (no {_META})")
        meta = read_json(meta_file)
        if meta.get("format") != _FORMAT:
            raise ValueError(
                f"{meta_file}: CorpusGraph format {meta.get('format')!r}, this geograph reads format {_FORMAT}"
            )
        try:
            v, e, d = int(meta["num_nodes"]), int(meta["num_edges"]), int(meta["dim"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{meta_file}: missing or bad num_nodes / num_edges / dim ({one_line(exc)})") from None
        if corpus_shape is not None and (v, d) != tuple(corpus_shape):
            raise ValueError(
                f"{meta_file}: a graph of {v} passages x {d} dimensions, the corpus is "
                f"{corpus_shape[0]} x {corpus_shape[1]}"
            )
        files = meta.get("files") or {}  # (sizes are recorded since the atomic save)
        for name in ("embeddings.pt", "edge_index.pt"):
            check_file_size(path / name, files.get(name), meta_file)
        emb = read_torch(path / "embeddings.pt", device)
        ei = read_torch(path / "edge_index.pt", device)
        if not isinstance(emb, Tensor) or tuple(emb.shape) != (v, d) or not emb.is_floating_point():
            raise ValueError(
                f"{path / 'embeddings.pt'}: expected ({v}, {d}) floating embeddings as {_META} says, "
                f"got {_describe(emb)}"
            )
        if (
            not isinstance(ei, Tensor)
            or tuple(ei.shape) != (2, 2 * e)
            or ei.is_floating_point()
            or (ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= v))
        ):
            raise ValueError(
                f"{path / 'edge_index.pt'}: expected (2, {2 * e}) node ids in [0, {v}) as {_META} says, "
                f"got {_describe(ei)}"
            )
        try:
            graph = cls(emb, ei, name=meta.get("name", "edge_index"))
        except ValueError as exc:
            raise ValueError(f"{path}: {one_line(exc)}") from None
        if graph.num_edges != e:
            raise ValueError(f"{path / 'edge_index.pt'}: {graph.num_edges} edges after cleaning, {_META} says {e}")
        graph.build_info = meta.get("build", {})
        return graph


def _describe(x) -> str:
    if isinstance(x, Tensor):
        return f"a {tuple(x.shape)} {str(x.dtype).replace('torch.', '')} tensor"
    return f"a {type(x).__name__}"


def _faiss_knn(z: Tensor, k: int) -> Tensor:
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("faiss=True needs faiss-cpu or faiss-gpu installed") from exc
    x = z.detach().cpu().float().contiguous().numpy()
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, idx = index.search(x, k)
    return torch.from_numpy(idx).long().to(z.device)
