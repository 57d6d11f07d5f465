"""The registry entry of the dense baseline: its parameters and bounds, how it is built, its score range, its
bench reference and the hand-written part of its page (``docs/methods/dense.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from geograph.methods.dense.module import DenseRetriever
from geograph.spec import POS_INT, MethodSpec, Param


def _build_dense(
    corpus: Tensor, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return DenseRetriever(corpus, **params)


def _dense_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return 1, num_docs, "the corpus size"


SPEC = MethodSpec(
    name="dense",
    label="dense",
    kind="retriever",
    module=DenseRetriever,
    functional=None,
    paper=None,
    params=(
        Param("chunk_size", int, **POS_INT, doc="corpus rows scored at a time"),
        Param("index", str, choices=("exact", "ivf", "auto"), doc="exact scan or an IVF-Flat index"),
        Param("nlist", int, **POS_INT, optional=True, doc="IVF lists (null: by corpus size)"),
        Param("nprobe", int, **POS_INT, choices=("auto",), doc="IVF lists searched (auto: for recall_target)"),
        Param("sample", int, **POS_INT, optional=True, doc="passages the IVF cells are trained on"),
        Param("seed", int, low=0, doc="seed of the IVF training sample"),
        Param("recall_target", float, low=0.0, high=1.0, low_open=True, doc="recall nprobe='auto' reaches"),
        Param("recall_k", int, **POS_INT, doc="the k of that recall"),
    ),
    not_params=("persistent",),
    build=_build_dense,
    k_range=_dense_k,
    baseline=True,
    about="""The baseline every benchmark row is compared with: exact top-k cosine by a tiled matmul on the
device, or an IVF-Flat index (faiss, optional extra) re-scored exactly for corpora past memory.""",
    example='passages = geograph.Retriever("dense", corpus=texts).retrieve(query, k=5)',
    order=4,
)
