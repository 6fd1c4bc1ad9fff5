"""CUDA tensors through DLPack (label `gpu`): saved from and loaded into
device memory, mixed with CPU tensors, synchronously and with save_async
while the device keeps modifying the tensors. Skipped where torch has no
CUDA device or the package was built without CUDA support (ckpt_gpu)."""
import pytest

from conftest import require

torch = require("torch")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device for torch"),
    pytest.mark.skipif(not ckpt._ckpt.has_cuda, reason="ckpt built without CUDA support"),
]


def _state():
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(1024, 257, generator=g).cuda(),
            "b": torch.randn(3, generator=g).bfloat16().cuda(),
            "cpu": torch.randn(100, generator=g),
            "step": 3}


def test_cuda_tensors_save_and_load_byte_exactly_mixed_with_cpu_ones(tmp_path):
    src = _state()
    ct.save(src, str(tmp_path), 1)
    dst = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
           for k, v in src.items()}
    ct.load(dst, str(tmp_path))
    assert dst["w"].is_cuda and torch.equal(dst["w"], src["w"])
    assert torch.equal(dst["b"], src["b"]) and torch.equal(dst["cpu"], src["cpu"])
    assert dst["step"] == 3


def test_save_async_of_cuda_tensors_keeps_the_values_at_the_call(tmp_path):
    src = _state()
    saved = {k: v.clone() for k, v in src.items() if isinstance(v, torch.Tensor)}
    handle = ct.save_async(src, str(tmp_path), 1)
    for _ in range(10):  # kernels keep modifying the tensors
        src["w"].mul_(1.5).add_(1)
    src["b"].zero_()
    src["cpu"].zero_()
    handle.wait()
    dst = {k: torch.zeros_like(v) for k, v in saved.items()}
    dst["step"] = None
    ct.load(dst, str(tmp_path))
    for k, v in saved.items():
        assert torch.equal(dst[k], v), k


def test_save_async_snapshot_to_device_copies_on_the_device_and_keeps_the_values(tmp_path):
    src = _state()
    saved = {k: v.clone() for k, v in src.items() if isinstance(v, torch.Tensor)}
    r = ct.save_async(src, str(tmp_path), 1, snapshot_to_device=True)
    src["w"].mul_(2).add_(1)  # on the device, after the call returned
    src["b"].zero_()
    result = r.wait()
    cuda_bytes = sum(saved[k].numel() * saved[k].element_size() for k in ("w", "b"))
    assert result.device_snapshot_bytes == cuda_bytes
    dst = {k: torch.zeros_like(v) for k, v in saved.items()}
    dst["step"] = None
    ct.load(dst, str(tmp_path))
    for k, v in saved.items():
        assert torch.equal(dst[k], v), k
    ct.release()
