"""Regenerate scifact_candidates.npz: real MiniLM candidate sets for the Maniscope parity test.

The first 24 SciFact test queries and their dense top-100 candidates (all-MiniLM-L6-v2),
stored as float16 to keep the file small. Run from the repository root:
    .venv/bin/python tests/data/make_scifact_candidates.py [$GEOGRAPH_DATA/scifact]
"""

import os
import sys
from pathlib import Path

import numpy as np

from geograph.data import Encoder, load_beir
from geograph.pipeline import dense_candidates, embed


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else str(Path(os.environ.get("GEOGRAPH_DATA") or "data") / "scifact")
    ds = load_beir(root, "test").subset(24)
    corpus, query = embed(ds, Encoder())
    c = dense_candidates(corpus, query, 100)
    np.savez_compressed(
        Path(__file__).with_name("scifact_candidates.npz"),
        query=query.numpy().astype(np.float16),
        docs=c.docs(slice(None)).numpy().astype(np.float16),
    )


if __name__ == "__main__":
    main()
