"""The encoder's model loading: transformers' progress bar only where someone watches."""

import pytest

from geograph.testing import has_package


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
def test_model_loading_bar_only_on_a_terminal(capsys, monkeypatch):
    """transformers' "Loading weights" bar: not in a log or a pipe, shown on a terminal (an encoder
    with progress), and transformers' own setting is left as it was."""
    import sys

    from transformers.utils import logging as hf_logging

    from geograph.data import Encoder

    assert Encoder(progress=True, cache=False).model is not None
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's stream, seen as a terminal
    assert Encoder(progress=True, cache=False).model is not None
    assert "Loading weights" in capsys.readouterr().err
