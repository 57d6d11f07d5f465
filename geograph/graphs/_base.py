"""What :class:`~geograph.CorpusGraph` and :class:`~geograph.G3Graph` share: passage ids, the update
state moved with the buffers, and saving and loading as an artefact directory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

import torch
from torch import Tensor, nn

from geograph.artefacts.saved_graphs import load_graph, save_graph
from geograph.graphs.updates import PassageIds

__all__ = ["PassageGraph"]


class _KeptState(Protocol):
    def apply(self, fn: Callable[[Tensor], Tensor]) -> None: ...


class PassageGraph(nn.Module):
    """A graph over a corpus's passages, held as buffers beside their ``embeddings``.

    Subclasses set ``_artefact_layout`` (what their artefact holds: see
    :mod:`geograph.artefacts.saved_graphs`), call :meth:`_start` when they are made, and return
    the state they keep for updates from :meth:`_kept_state`.
    """

    #: the artefact layout of the subclass's saves (``"CorpusGraph"`` or ``"G3Graph"``)
    _artefact_layout: ClassVar[str]

    embeddings: Tensor
    build_info: dict[str, Any]
    passage_ids: PassageIds | None
    corpus_version: int
    manifest: dict[str, Any]  # a loaded graph's manifest, with its ``source`` directory

    @classmethod
    def _bare(cls) -> Self:
        """A graph whose constructor did not run: the caller holds its tensors as they are (the
        constructor would check and clean, that is copy, them)."""
        graph = cls.__new__(cls)
        nn.Module.__init__(graph)
        return graph

    def _start(self) -> None:
        self.build_info = {}  # how a builder made it (index, seconds per stage); saved in the manifest
        self.passage_ids = None  # the passages' ids once given or updated (geograph.graphs.updates.PassageIds)
        self.corpus_version = 0  # 0 when built, one more for each add or remove; saved in the manifest

    @property
    def num_nodes(self) -> int:
        raise NotImplementedError

    def _kept_state(self) -> _KeptState | None:
        """What the graph keeps for updates (tensors that follow the buffers), if anything."""
        return None

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Self:
        """``.to()`` / ``.cuda()``: the state kept for updates follows the buffers."""
        out: Self = super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # unannotated in torch
        state = self._kept_state()
        if state is not None:
            state.apply(fn)
        return out

    def set_ids(self, ids: Sequence[str | int]) -> None:
        """Name the passages (``str`` or ``int``, one per row, unique) for ``add`` and ``remove``
        (default: ``0 .. V-1``)."""
        ids = list(ids)
        if len(ids) != self.num_nodes:
            raise ValueError(f"ids: {len(ids)} ids for {self.num_nodes} passages")
        self.passage_ids = PassageIds(ids)

    # -- persistence --------------------------------------------------------------------
    def save_pretrained(
        self,
        directory: str | Path,
        *,
        encoder: Any = None,
        ids: Sequence[str] | None = None,
        text_keys: Sequence[str] | None = None,
    ) -> Path:
        """Write the graph as an artefact directory: ``tensors.safetensors`` and ``manifest.json``.

        The manifest records the encoder's identity (``encoder``: a :class:`geograph.data.Encoder`
        or an :class:`~geograph.artefacts.EncoderIdentity`), the corpus fingerprint (the
        embeddings' checksum and, given ``ids``, the passage ids'), the build parameters and
        :attr:`build_info`; a graph loaded by :meth:`from_pretrained` keeps what it recorded.
        Every file is written under a temporary name and renamed; the manifest is removed first
        and written last, so a save killed at any point leaves the previous graph or a directory
        that does not load, never a mix of two. See :mod:`geograph.artefacts`.

        The manifest's ``corpus.version`` is :attr:`corpus_version` (0 when built, one more for each
        ``add`` or ``remove``), with the saved corpus it was updated from as ``parent``.
        ``ids`` default to the graph's own string ids once it has them (:meth:`set_ids`, an update).
        ``text_keys`` (with ``ids``): the embedding cache's key of each passage's embedded text
        (:func:`geograph.data.cache.text_key`), written as ``passages.jsonl`` for ``geograph update``.
        """
        return save_graph(self, directory, encoder=encoder, ids=ids, text_keys=text_keys)

    @classmethod
    def from_pretrained(
        cls,
        source: str | Path,
        *,
        corpus: Any = None,
        encoder: Any = None,
        device: str | torch.device | None = None,
        corpus_shape: tuple[int, int] | None = None,
    ) -> Self:
        """Load a graph saved by :meth:`save_pretrained`, its tensors memory-mapped (shared between processes).

        Args:
            source: the directory, or a Hugging Face Hub repository id (needs ``huggingface_hub``).
            corpus: the corpus in use: ``(V, D)`` embeddings, an ``(ids, embeddings)`` pair or a
                :class:`~geograph.artefacts.CorpusFingerprint`; a graph built over other passage ids
                or other embeddings (beyond re-encoding noise) is refused.
            encoder: the encoder in use (an ``Encoder`` or ``EncoderIdentity``): a graph built with
                another model, prefixes or normalisation is refused.
            device: where to put the tensors (default: CPU, memory-mapped).
            corpus_shape: ``(V, D)`` the graph must have, if known.

        Raises:
            ValueError: one line naming the file: unreadable, truncated, tensors that do not fit the
                manifest, or another size than ``corpus_shape``.
            geograph.artefacts.ArtefactMismatch: another format version, encoder or corpus (one line
                naming both sides).

        A directory in the former ``torch.save`` format loads with a ``DeprecationWarning``.
        """
        return load_graph(cls, source, corpus=corpus, encoder=encoder, device=device, shape=corpus_shape)

    def save(self, directory: str | Path) -> Path:
        """:meth:`save_pretrained` without provenance."""
        return self.save_pretrained(directory)

    @classmethod
    def load(
        cls,
        directory: str | Path,
        *,
        device: str | torch.device | None = None,
        corpus_shape: tuple[int, int] | None = None,
    ) -> Self:
        """:meth:`from_pretrained` without the encoder and corpus checks."""
        return cls.from_pretrained(directory, device=device, corpus_shape=corpus_shape)
