"""Texts to tensors for the text-first API and the framework components: encoders, rows, padding.

An *encoder* is anything that turns texts into ``(N, D)`` embeddings:

* ``None``: the offline all-MiniLM-L6-v2 of the ``text`` extra (:class:`geograph.data.Encoder`
  without an on-disk cache), made on first use;
* a model directory or name (``str``): a :class:`geograph.data.Encoder` of that model;
* a :class:`geograph.data.Encoder` or anything with ``encode(texts)``;
* a LangChain ``Embeddings`` (``embed_query`` / ``embed_documents``);
* a callable ``texts -> (N, D)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["default_encoder", "make_encoder", "LazyEncoder", "embed", "as_rows", "module_device", "pad", "check_top"]


@functools.cache
def default_encoder() -> Any:
    """The offline all-MiniLM-L6-v2 (``text`` extra), without an on-disk cache.

    One instance per process, made on first use and shared by every component that was given no
    encoder (loading the model takes seconds; it holds no per-call state).
    """
    from geograph.data import Encoder

    return Encoder(cache=False)


def make_encoder(encoder: Any) -> Any:
    """``encoder`` as an object :func:`embed` takes: ``None`` the default, a ``str`` that model."""
    if encoder is None:
        return default_encoder()
    if isinstance(encoder, str):
        from geograph.data import Encoder

        return Encoder(encoder, cache=False)
    if not (hasattr(encoder, "encode") or hasattr(encoder, "embed_documents") or callable(encoder)):
        raise ValueError(
            f"encoder must be None, a model name, an object with encode(texts) or embed_documents(texts), "
            f"or a callable, got {type(encoder).__name__}"
        )
    return encoder


class LazyEncoder:
    """An encoder made on first use (a default model is loaded only when a text needs embedding).

    ``spec`` is what was given (``None``, a model name, or an encoder object); :attr:`name` is
    what a configuration can store to make the same encoder again (``None`` for the default,
    the model name, or ``None`` for an object that has no ``model_path``).
    """

    def __init__(self, spec: Any = None) -> None:
        if spec is not None and not isinstance(spec, str):
            make_encoder(spec)  # an object of the wrong kind fails here, not at the first text
        self.spec = spec
        self._made: Any = None

    @property
    def name(self) -> str | None:
        if self.spec is None or isinstance(self.spec, str):
            return self.spec
        return getattr(self.spec, "model_path", None)

    def get(self) -> Any:
        if self._made is None:
            self._made = make_encoder(self.spec)
        return self._made

    def __call__(self, texts: Sequence[str], *, query: bool = False) -> Tensor:
        return embed(self.get(), texts, query=query)


def embed(encoder: Any, texts: Sequence[str], *, query: bool = False) -> Tensor:
    """``(len(texts), D)`` floating embeddings of ``texts`` by ``encoder`` (see the module docstring)."""
    texts = list(texts)
    if hasattr(encoder, "embed_documents"):
        rows = [encoder.embed_query(t) for t in texts] if query else encoder.embed_documents(texts)
        return torch.as_tensor(rows, dtype=torch.float32)
    out = encoder.encode(texts) if hasattr(encoder, "encode") else encoder(texts)
    out = torch.as_tensor(np.asarray(out) if not isinstance(out, Tensor) else out)
    if out.ndim != 2 or out.shape[0] != len(texts):
        raise ValueError(f"encoder: returned shape {tuple(out.shape)} for {len(texts)} texts, expected (N, D)")
    return out if out.is_floating_point() else out.float()


def as_rows(items: Any, what: str) -> tuple[list[str | None], list[Tensor | None]]:
    """``items`` (texts, vectors, or a ``(N, D)`` tensor / ndarray) as per-item ``(texts, vectors)``:
    each position holds a text or a 1-D vector, the other list ``None`` there."""
    if isinstance(items, (Tensor, np.ndarray)):
        t = torch.as_tensor(items)
        if t.ndim != 2:
            raise ValueError(f"{what}: embeddings must have shape (N, D), got {tuple(t.shape)}")
        return [None] * t.shape[0], list(t)
    if isinstance(items, str):
        raise ValueError(f"{what} must be a list of texts or embeddings, got a single string")
    texts: list[str | None] = []
    vecs: list[Tensor | None] = []
    for i, x in enumerate(items):
        if isinstance(x, str):
            texts.append(x)
            vecs.append(None)
            continue
        try:
            v = torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x)
        except (TypeError, ValueError):
            v = None
        if v is None or v.ndim != 1 or not (v.is_floating_point() or v.dtype in (torch.int32, torch.int64)):
            raise ValueError(f"{what}[{i}] must be a text or a 1-D embedding, got {type(x).__name__}")
        texts.append(None)
        vecs.append(v)
    return texts, vecs


def module_device(module: nn.Module) -> torch.device | None:
    """The device of a module's registered state (``None``: it holds none, inputs decide)."""
    for t in module.state_dict().values():
        device: torch.device = t.device
        return device
    return None


def pad(rows: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``B`` tensors ``(n_i, D)`` as a zero-padded ``(B, max n_i, D)`` batch and its ``(B, N)`` mask."""
    sizes = [int(r.shape[0]) for r in rows]
    first = rows[0]
    out = first.new_zeros(len(rows), max(sizes), first.shape[1])
    mask = torch.zeros(len(rows), max(sizes), dtype=torch.bool, device=first.device)
    for i, r in enumerate(rows):
        out[i, : sizes[i]] = r
        mask[i, : sizes[i]] = True
    return out, mask


@overload
def check_top(value: int, name: str) -> int: ...
@overload
def check_top(value: int | None, name: str) -> int | None: ...
def check_top(value: int | None, name: str) -> int | None:
    """``value`` if ``None`` or a positive integer, else a ``ValueError`` naming ``name``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


def check_artefacts(module: Any, encoder: Any, num_passages: int | None = None) -> None:
    """Refuse a module holding a loaded artefact (``from_pretrained``) whose manifest records another
    encoder than ``encoder`` (when it has an :class:`~geograph.artefacts.EncoderIdentity`) or another
    number of passages than the corpus in use; one line naming both sides."""
    from geograph.artefacts import ArtefactMismatch, EncoderIdentity, check_encoder

    if not isinstance(module, nn.Module):
        return
    for sub in module.modules():
        manifest = getattr(sub, "manifest", None)
        if not manifest:
            continue
        where = manifest.get("source", type(sub).__name__)
        if isinstance(getattr(encoder, "identity", None), EncoderIdentity):
            check_encoder(manifest, encoder, where)
        saved = (manifest.get("corpus") or {}).get("num_passages")
        if num_passages is not None and saved is not None and saved != num_passages:
            raise ArtefactMismatch(f"{where}: built over {saved} passages; the corpus given has {num_passages}")
