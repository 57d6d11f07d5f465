import numpy as np
import pytest
import torch

from geograph.functional import cosine_similarity


def test_matches_numpy(device, dtype, tol):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 5, generator=g, dtype=dtype)
    y = torch.randn(4, 3, 5, generator=g, dtype=dtype)
    ours = cosine_similarity(x.to(device), y.to(device)).cpu()
    xn = x.numpy() / np.linalg.norm(x.numpy(), axis=-1, keepdims=True)
    yn = y.numpy() / np.linalg.norm(y.numpy(), axis=-1, keepdims=True)
    torch.testing.assert_close(ours, torch.from_numpy(np.einsum("bnd,bmd->bnm", xn, yn)), **tol)
    assert ours.dtype == dtype


def test_padding_is_zero_and_invariant():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    x_junk = x.clone()
    x_junk[0, 4:] = float("nan")  # NaN in padding must not leak
    s = cosine_similarity(x_junk, mask=mask)
    assert (s[0, 4:] == 0).all() and (s[0, :, 4:] == 0).all()
    torch.testing.assert_close(s[0, :4, :4], cosine_similarity(x[:1, :4])[0])


def test_zero_vector_gives_zero():
    x = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]])
    assert not torch.isnan(cosine_similarity(x)).any()
    assert cosine_similarity(x)[0, 0, 1] == 0


def test_exception():
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        cosine_similarity(torch.rand(3, 4))
    with pytest.raises(ValueError, match="y must have shape"):
        cosine_similarity(torch.rand(2, 3, 4), torch.rand(2, 3, 5))
    with pytest.raises(ValueError, match="NaN or inf"):
        cosine_similarity(torch.tensor([[[float("nan"), 1.0]]]))
    with pytest.raises(ValueError, match="mask must have shape"):
        cosine_similarity(torch.rand(2, 3, 4), mask=torch.ones(2, 4, dtype=torch.bool))


def test_gradcheck():
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: cosine_similarity(a, b), (x, y))
