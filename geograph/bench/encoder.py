"""``geograph bench encoder``: the encoder's backends side by side, in one run on one machine.

For each backend (``torch``, ``onnx``, ``onnx-int8``: :mod:`geograph.data.backends`) it measures

* **rate**: texts/s at batch 1, 32 and 128 (``--batches``), distinct texts (corpus passages
  and queries of the data sets, cut at random words), this process's threads (``--threads``,
  default every usable CPU), median of ``--repeat`` passes after one untimed pass;
* **agreement**: the least cosine between the backend's vectors and torch's on the fixed probe
  texts (:data:`~geograph.data.backends.PROBE_TEXTS`), what an artefact built with one is
  accepted with the other by (at least :data:`~geograph.data.backends.AGREEMENT`);
* **quality**: nDCG@10 of dense retrieval (cosine over the whole corpus) on each data set
  (``--data``: the demo corpus, and SciFact when ``$GEOGRAPH_DATA`` or ``./data`` holds it), and
  its difference from torch's.

It prints a table and writes ``<out>/encoder-backends.json`` and ``.md`` (with the commit and the
date). The corpora's vectors go through the embedding cache (one key per backend).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "measure_rate", "quality", "write"]

PROG = "geograph bench encoder"


def parser() -> argparse.ArgumentParser:
    from geograph.console import ENCODER_BACKENDS, make_parser

    p = make_parser(PROG, __doc__)
    p.add_argument("--backends", nargs="+", default=list(ENCODER_BACKENDS), choices=ENCODER_BACKENDS)
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32, 128], help="batch sizes of the rate (1 32 128)")
    p.add_argument("--texts", type=int, default=512, help="distinct texts a pass of the rate encodes (512)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes of the rate (median; 3)")
    p.add_argument("--threads", type=int, help="torch and ONNX Runtime intra-op threads (default: the usable CPUs)")
    p.add_argument(
        "--data",
        nargs="*",
        help="BEIR folders (or shipped corpora) for nDCG@10 (default: demo, and scifact where found)",
    )
    p.add_argument("--split", default="test", help="qrels split (test)")
    p.add_argument("--encoder", help="local sentence-transformers directory (default: all-MiniLM-L6-v2)")
    p.add_argument("--cache", help="embedding cache root (default: $GEOGRAPH_CACHE or ~/.cache/geograph)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results", help="folder of encoder-backends.json and .md")
    return p


def _texts(passages: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` distinct texts: windows of 4-64 words of ``passages``, numbered."""
    rng = random.Random(seed)
    words = " ".join(passages).split()
    out = []
    for i in range(n):
        k = rng.randint(4, 64)
        j = rng.randrange(max(1, len(words) - k))
        out.append(f"{' '.join(words[j : j + k])} {i}")
    return out


def measure_rate(model: Any, texts: list[str], batch: int, repeat: int) -> dict[str, Any]:
    """texts/s of ``model.encode`` (a sentence-transformers model or an ONNX one) at ``batch``:
    median and spread of ``repeat`` passes after one untimed pass over part of ``texts``."""
    model.encode(texts[: max(batch, 8)], batch_size=batch, normalize_embeddings=True)
    seconds = []
    for _ in range(repeat):
        t = time.perf_counter()
        model.encode(texts, batch_size=batch, normalize_embeddings=True)
        seconds.append(time.perf_counter() - t)
    return {
        "texts_per_s": len(texts) / statistics.median(seconds),
        "spread": [len(texts) / max(seconds), len(texts) / min(seconds)],
    }


def quality(encoder: Any, dataset: Any) -> float:
    """nDCG@10 of dense retrieval (cosine over the whole corpus) of ``dataset`` with ``encoder``."""
    import torch

    from geograph.evaluation import evaluate

    corpus = encoder.encode_passages(dataset.passages())
    queries = encoder.encode([encoder.query_prefix + q for q in dataset.queries])
    top = torch.topk(queries @ corpus.T, min(10, corpus.shape[0]), dim=1).indices
    run = [[dataset.doc_ids[int(j)] for j in row] for row in top]
    return evaluate(run, dataset.qrels_list(), ["nDCG@10"])["nDCG@10"]


def _datasets(paths: Sequence[str] | None, split: str) -> list[Any]:
    from geograph.bench.common import resolve_data
    from geograph.data import corpus_path, load_beir

    if paths is None:
        found = [str(corpus_path("demo"))]
        scifact = resolve_data(None, "scifact")
        if (scifact / "corpus.jsonl").is_file():
            found.append(str(scifact))
        paths = found
    return [load_beir(corpus_path(p), split) for p in paths]


def write(result: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """``encoder-backends.json`` and ``encoder-backends.md`` of ``result`` in ``out``."""
    from geograph.bench.common import write_json

    path = write_json("encoder-backends", result, out)
    batches = result["batches"]
    lines = [
        "# Encoder backends: rate, agreement with torch, retrieval quality",
        "",
        f"Commit {result['commit']}, {result['date']}, {result['cpus']} usable CPUs, {result['threads']} threads; "
        f"{result['texts']} distinct texts a pass, median of {result['repeat']} passes. "
        "Produced by `geograph bench encoder`.",
        "",
        "| backend | quantisation | " + " | ".join(f"texts/s @{b}" for b in batches) + " | least cosine to torch | "
        "" + " | ".join(f"nDCG@10 {name}" for name in result["datasets"]) + " |",
        "|---|---|" + "---:|" * len(batches) + "---:|" + "---:|" * len(result["datasets"]),
    ]
    torch_row = result["backends"].get("torch")
    for name, row in result["backends"].items():
        rates = []
        for b in batches:
            r = row["rate"][str(b)]["texts_per_s"]
            ratio = (
                ""
                if torch_row is None or name == "torch"
                else f" ({r / torch_row['rate'][str(b)]['texts_per_s']:.2f}x)"
            )
            rates.append(f"{r:.0f}{ratio}")
        scores = []
        for ds in result["datasets"]:
            s = row["ndcg@10"][ds]
            diff = "" if torch_row is None or name == "torch" else f" ({s - torch_row['ndcg@10'][ds]:+.4f})"
            scores.append(f"{s:.4f}{diff}")
        lines.append(
            f"| {name} | {row['quantization'] or '-'} | "
            + " | ".join(rates)
            + f" | {row['agreement']:.6f} | "
            + " | ".join(scores)
            + " |"
        )
    md = Path(out) / "encoder-backends.md"
    md.write_text("\n".join(lines) + "\n")
    return path, md


def main(argv: Sequence[str] | None = None) -> int:
    from geograph.console import UsageError

    args = parser().parse_args(argv)
    try:
        for name in ("texts", "repeat"):
            if getattr(args, name) < 1:
                raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
        if any(b < 1 for b in args.batches):
            raise UsageError(f"--batches must be >= 1, got {args.batches}")
        if args.threads is not None and args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        try:
            datasets = _datasets(args.data, args.split)
        except (OSError, ValueError) as e:
            raise UsageError(f"--data: {str(e).splitlines()[0]}") from None
    except UsageError as e:
        return e.exit(PROG)

    import torch

    from geograph.bench.common import provenance
    from geograph.data import Encoder
    from geograph.data.backends import quantization

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)  # the ONNX Runtime sessions take the same count
    texts = _texts([p for d in datasets for p in d.passages()], args.texts, args.seed)
    result: dict[str, Any] = {
        **provenance(),
        "cpus": len(os.sched_getaffinity(0)),
        "threads": threads,
        "texts": len(texts),
        "repeat": args.repeat,
        "batches": args.batches,
        "datasets": [d.name for d in datasets],
        "backends": {},
    }
    reference = Encoder(args.encoder, cache=args.cache, progress=False)
    for backend in args.backends:
        try:
            encoder = Encoder(args.encoder, cache=args.cache, progress=False, backend=backend, batch_size=64)
            model = encoder.model
        except ImportError as e:
            print(f"{backend}: skipped ({str(e).splitlines()[0]})", flush=True)
            continue
        row: dict[str, Any] = {
            "quantization": quantization(backend),
            "rate": {},
            "agreement": reference.agreement(backend),
            "ndcg@10": {},
        }
        for b in args.batches:
            row["rate"][str(b)] = measure_rate(model, texts, b, args.repeat)
        for d in datasets:
            row["ndcg@10"][d.name] = quality(encoder, d)
        result["backends"][backend] = row
        rates = ", ".join(f"@{b} {row['rate'][str(b)]['texts_per_s']:.0f}" for b in args.batches)
        scores = ", ".join(f"{n} {s:.4f}" for n, s in row["ndcg@10"].items())
        print(
            f"{backend}: texts/s {rates}; least cosine to torch {row['agreement']:.6f}; nDCG@10 {scores}",
            flush=True,
        )
    paths = write(result, args.out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
