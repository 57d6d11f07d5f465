import pytest

from geograph.cli import main
from geograph.testing import has_package


def test_help(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["nope"]) == 2


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
def test_demo_prints_tables(tmp_path, capsys):
    assert main(["demo", "--cache", str(tmp_path), "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "Maniscope (k=5, alpha=0.3)" in out and "dense (cosine)" in out
    assert "nDCG@10" in out and out.count("Query q") == 2
