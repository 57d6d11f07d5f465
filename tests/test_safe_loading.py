"""Files geograph reads cannot run code: checkpoints go through ``torch.load(weights_only=True)``."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from geograph import PoincareProjection

ROOT = Path(__file__).resolve().parents[1]


class Planted:
    """Unpickling this writes a marker file: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_no_torch_load_without_weights_only_true_in_the_package():
    """Every torch.load call in geograph passes weights_only=True (never False, never left to the default)."""
    calls = []
    for path in (ROOT / "geograph").rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"torch\.load\(", text):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):  # the call's closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            calls.append((path.relative_to(ROOT), text[match.start() : end + 1]))
    assert calls, "no torch.load found: the scan is broken"
    bad = [(p, c) for p, c in calls if "weights_only=True" not in c.replace(" ", "")]
    assert not bad, bad


def export(tmp_path: Path, ckpt: Path) -> Path:
    """ExportProjection.on_fit_end on a stand-in trainer whose best checkpoint is ``ckpt``."""
    pytest.importorskip("lightning")
    from geograph.train.module import ExportProjection

    module = SimpleNamespace(projection=PoincareProjection(8, 4, hidden=6))
    trainer = SimpleNamespace(
        log_dir=str(tmp_path / "run"),
        is_global_zero=True,
        default_root_dir=str(tmp_path),
        checkpoint_callback=SimpleNamespace(best_model_path=str(ckpt)),
    )
    callback = ExportProjection()
    callback.on_fit_end(trainer, module)
    return callback.exported


def test_export_reads_the_best_checkpoints_weights(tmp_path):
    torch.manual_seed(0)
    best = PoincareProjection(8, 4, hidden=6)
    ckpt = tmp_path / "best.ckpt"
    state = {f"projection.{k}": v for k, v in best.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3, "hyper_parameters": {"lr": 1e-3}}, ckpt)
    got = PoincareProjection.load(export(tmp_path, ckpt))
    x = torch.randn(5, 8)
    torch.testing.assert_close(got(x), best.eval()(x))


def test_export_refuses_a_checkpoint_that_would_run_code(tmp_path):
    marker = tmp_path / "marker"
    ckpt = tmp_path / "hostile.ckpt"
    state = {f"projection.{k}": v for k, v in PoincareProjection(8, 4, hidden=6).state_dict().items()}
    torch.save({"state_dict": state, "extra": Planted(marker)}, ckpt)
    with pytest.raises(ValueError, match=r"checkpoint .*hostile\.ckpt: holds more than tensors and plain data"):
        export(tmp_path, ckpt)
    assert not marker.exists(), "the checkpoint's code ran"
    assert not (tmp_path / "run" / "projection.pt").exists()
