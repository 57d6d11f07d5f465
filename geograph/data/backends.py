"""Runtimes of the text encoder: torch (sentence-transformers), ONNX Runtime, ONNX Runtime int8.

``torch`` runs the sentence-transformers model as it is. ``onnx`` exports the same model (its
transformer, pooling and normalisation: the whole ``SentenceTransformer`` forward) with torch's
exporter to an ONNX graph and runs it with ONNX Runtime; ``onnx-int8`` runs that graph after
ONNX Runtime's dynamic quantisation (int8 weights of the matrix products, activations quantised
per batch). Nothing is fetched: the export is made locally from the model's files and kept on
disk under the cache root (:func:`~geograph.data.cache.cache_dir`), in ``onnx/<weights key>/``,
next to the embedding cache, so a second start loads it.

The export is made with torch's exporter and run with ``onnxruntime`` alone: sentence-transformers'
own ``backend="onnx"`` needs ``optimum``, whose releases pin a ``transformers`` older than the one
this package is tested with. The ``onnx`` extra installs ``onnxruntime`` and ``onnx`` (the latter
for the quantiser); nothing here imports them unless an ONNX backend is asked for.

:class:`OnnxSentenceModel` answers the part of ``SentenceTransformer``'s interface that geograph
uses (``encode``, a forward on tokenized features, ``tokenizer``, ``max_seq_length``, ``device``),
so the rest of the package runs it unchanged. Its ONNX Runtime session runs as many intra-op
threads as torch has at the call (``torch.get_num_threads()``), one session per thread count, so
the server's one-thread encoding of request texts (:func:`geograph.serve.corpus.one_thread`) holds
for it too.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geograph.artefacts.identity import BACKEND_AGREEMENT

__all__ = [
    "AGREEMENT",
    "BACKENDS",
    "PROBE_TEXTS",
    "OnnxSentenceModel",
    "OnnxUnavailable",
    "check_available",
    "check_backend",
    "export_dir",
    "load_backend",
    "quantization",
]

#: the encoder runtimes, as ``--encoder-backend`` takes them
BACKENDS = ("torch", "onnx", "onnx-int8")

#: the least cosine between two backends' vectors of every probe text for artefacts made with one
#: to be accepted with the other
AGREEMENT = BACKEND_AGREEMENT

#: the fixed texts two backends' vectors are compared on (short and long, questions and passages)
PROBE_TEXTS = (
    "what is the capital of france",
    "Paris is the capital and most populous city of France.",
    "how do vaccines train the immune system",
    "Vaccines expose the immune system to an antigen so that it can respond faster to a later infection.",
    "who wrote the theory of general relativity",
    "Albert Einstein published the general theory of relativity in 1915, describing gravity as curved spacetime.",
    "ocean acidification coral reefs",
    "Rising carbon dioxide lowers the pH of seawater, which makes it harder for corals to build their skeletons "
    "and slows the growth of reefs across the tropics.",
    "graph based reranking of retrieved passages",
    "A transformer encodes each token in the context of every other token through self-attention layers.",
    "mitochondria",
    "The mitochondrion produces most of the chemical energy of the cell in the form of adenosine triphosphate, "
    "through oxidative phosphorylation along the inner membrane; it has its own small circular genome, "
    "inherited from the mother, and divides independently of the cell.",
    "1923 treaty of lausanne",
    "Which river flows through Budapest and Vienna?",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
)

#: the quantisation each backend applies (recorded in the encoder's identity)
_QUANTIZATION = {"torch": None, "onnx": None, "onnx-int8": "int8-dynamic"}
#: the opset of the exported graph
_OPSET = 17
_lock = threading.Lock()


class OnnxUnavailable(ImportError):
    """An ONNX backend asked for without the ``onnx`` extra installed (its message is one line)."""


def check_backend(value: object, name: str = "encoder_backend") -> str:
    """``value`` as a backend name, or one line naming the bad value.

    Example:
        >>> check_backend("onnx-int8")
        'onnx-int8'
        >>> check_backend("tensorrt")
        Traceback (most recent call last):
        ...
        ValueError: encoder_backend must be one of torch, onnx, onnx-int8, got 'tensorrt'
    """
    if value not in BACKENDS:
        raise ValueError(f"{name} must be one of {', '.join(BACKENDS)}, got {value!r}")
    return str(value)


def quantization(backend: str) -> str | None:
    """The quantisation ``backend`` applies to the weights (``None``: float32 as trained).

    Example:
        >>> quantization("onnx-int8"), quantization("torch")
        ('int8-dynamic', None)
    """
    return _QUANTIZATION[check_backend(backend)]


def check_available(backend: str) -> str:
    """``backend`` when it can run here, else :class:`OnnxUnavailable` (one line) for an ONNX
    backend without the ``onnx`` extra: checked without importing ONNX Runtime, so that a command
    or a server refuses at once, before it reads a corpus or starts a worker (and also when every
    vector it needs happens to be cached already).

    Example:
        >>> check_available("torch")
        'torch'
    """
    if check_backend(backend) != "torch" and not _onnx_installed():
        raise OnnxUnavailable(ONNX_MISSING)
    return backend


def _onnx_installed() -> bool:
    import importlib.util
    import sys

    if "onnxruntime" in sys.modules:  # imported already, or blocked (None)
        return sys.modules["onnxruntime"] is not None
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except (ImportError, ValueError):
        return False


#: the one line of :class:`OnnxUnavailable`
ONNX_MISSING = "the onnx encoder backends need the 'onnx' extra: pip install 'geograph-rag[onnx]'"


def _require_onnx() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise OnnxUnavailable(ONNX_MISSING) from e
    return onnxruntime


def export_dir(weights: str, root: str | Path | None = None) -> Path:
    """Where the ONNX exports of the model whose weights are ``weights`` (its identity's
    :attr:`~geograph.artefacts.EncoderIdentity.weights`) are kept: ``<cache root>/onnx/<key>``."""
    from geograph.data.cache import cache_dir

    return cache_dir(root) / "onnx" / hashlib.sha256(weights.encode()).hexdigest()[:16]


def _atomic(target: Path, write: Any) -> Path:
    """``write(tmp)`` then rename ``tmp`` to ``target``: a killed export never leaves a torn file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{uuid.uuid4().hex}.{target.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


class _Forward(torch.nn.Module):
    """The whole ``SentenceTransformer`` forward (transformer, pooling, normalisation) on three tensors."""

    def __init__(self, model: Any, names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.names = model, list(names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(dict(zip(self.names, inputs)))["sentence_embedding"]
        assert isinstance(out, torch.Tensor)
        return out


def _export(model: Any, path: Path) -> list[str]:
    """Export a sentence-transformers ``model`` to ``path`` (an ONNX graph); its input names."""
    import warnings

    features = model.tokenizer(["export", "an onnx graph of the encoder"], padding=True, return_tensors="pt")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]
    axes = {n: {0: "batch", 1: "tokens"} for n in names}
    module = _Forward(model, names).eval()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            tuple(features[n].to(model.device) for n in names),
            str(path),
            input_names=names,
            output_names=["sentence_embedding"],
            dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
            opset_version=_OPSET,
            dynamo=False,
        )
    return names


def exported(model: Any, weights: str, backend: str, root: str | Path | None = None) -> Path:
    """The ONNX graph of ``model`` for ``backend`` (``onnx`` or ``onnx-int8``), exported (and
    quantised) on first use and kept under :func:`export_dir`."""
    _require_onnx()
    directory = export_dir(weights, root)
    plain = directory / "model.onnx"
    with _lock:
        if not plain.is_file():
            _atomic(plain, lambda tmp: _export(model, tmp))
        if backend == "onnx":
            return plain
        int8 = directory / "model-int8.onnx"
        if not int8.is_file():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            def quantize(tmp: Path) -> None:
                import logging

                logging.getLogger().disabled, before = True, logging.getLogger().disabled
                try:  # the quantiser logs a hint about pre-processing on the root logger
                    quantize_dynamic(plain, tmp, weight_type=QuantType.QInt8, per_channel=True)
                finally:
                    logging.getLogger().disabled = before

            _atomic(int8, quantize)
        return int8


class OnnxSentenceModel:
    """An exported sentence-transformers model run by ONNX Runtime, behind the part of
    ``SentenceTransformer``'s interface geograph uses.

    Args:
        path: the ONNX graph (:func:`exported`).
        tokenizer: the model's tokenizer (the sentence-transformers model's).
        max_seq_length: texts are cut to this many tokens.
    """

    def __init__(self, path: str | Path, tokenizer: Any, max_seq_length: int) -> None:
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.device = torch.device("cpu")
        self._ort = _require_onnx()
        self._sessions: dict[int, Any] = {}
        self._session_lock = threading.Lock()
        self.input_names = [i.name for i in self._session().get_inputs()]

    def _session(self) -> Any:
        """The session for torch's current intra-op thread count (made once per count)."""
        threads = max(1, torch.get_num_threads())
        session = self._sessions.get(threads)
        if session is None:
            with self._session_lock:
                session = self._sessions.get(threads)
                if session is None:
                    options = self._ort.SessionOptions()
                    options.intra_op_num_threads = threads
                    options.inter_op_num_threads = 1
                    session = self._ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
                    self._sessions[threads] = session
        return session

    def run(self, features: dict[str, Any]) -> np.ndarray:
        """``(B, D)`` float32 sentence embeddings of tokenized ``features`` (tensors or arrays)."""
        feeds = {n: np.ascontiguousarray(np.asarray(features[n]), dtype=np.int64) for n in self.input_names}
        out = self._session().run(["sentence_embedding"], feeds)[0]
        return np.asarray(out, dtype=np.float32)

    def __call__(self, features: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The forward of tokenized ``features``, as ``SentenceTransformer``'s: ``{"sentence_embedding": (B, D)}``."""
        return {"sentence_embedding": torch.from_numpy(self.run(features))}

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        normalize_embeddings: bool = True,
        convert_to_numpy: bool = True,
        show_progress_bar: bool = False,
    ) -> np.ndarray:
        """``(len(texts), D)`` float32 embeddings, ``batch_size`` texts a forward (sorted by length,
        as sentence-transformers does, and put back in order)."""
        texts = list(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), 0), dtype=np.float32)
        parts = []
        for start in range(0, len(texts), max(1, int(batch_size))):
            chunk = [texts[i] for i in order[start : start + batch_size]]
            features = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=self.max_seq_length, return_tensors="np"
            )
            parts.append(self.run(features))
        if parts:
            out = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
            out[order] = np.concatenate(parts)
        if normalize_embeddings and len(out):
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def load_backend(model: Any, backend: str, weights: str, root: str | Path | None = None) -> Any:
    """The model to encode with: the sentence-transformers ``model`` itself for ``torch``, else
    its ONNX export (:func:`exported`) in an :class:`OnnxSentenceModel`."""
    if check_backend(backend) == "torch":
        return model
    if getattr(model, "device", torch.device("cpu")).type != "cpu":
        raise ValueError(f"encoder_backend: {backend} runs on the CPU only, the model is on {model.device}")
    path = exported(model, weights, backend, root)
    return OnnxSentenceModel(path, model.tokenizer, model.max_seq_length)
