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
