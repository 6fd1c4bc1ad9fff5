"""ckpt.torch and the tensor properties that DLPack does not carry (issue
28): a layout other than strided, quantization, a subclass's own dispatch,
a torch.func wrapper, negative-bit and conjugate views, overlapping
memory, the version counter. Each is saved and loaded right, or refused
with an error naming the entry, for save and load alike."""
import os

import pytest

from conftest import require

torch = require("torch")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402

torch.set_num_threads(1)


def _wrapper_subclass():
    """A tensor subclass with its own __torch_dispatch__ and no storage of
    its own (as torchao's quantized tensors are)."""
    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype,
                                                       device=elem.device)

        def __init__(self, elem):
            self.elem = elem

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            from torch.utils._pytree import tree_map
            unwrap = lambda x: x.elem if isinstance(x, Wrapper) else x  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda x: Wrapper(x) if type(x) is torch.Tensor else x, out)
    return Wrapper(torch.arange(4.0))


def _fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode().from_tensor(torch.arange(4.0))


def _mkldnn():
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch without mkldnn")
    return torch.arange(4.0).to_mkldnn()


# What each unsupported kind of tensor is, and the words its error says.
REFUSED = {
    "sparse_coo": (lambda: torch.arange(4.0).to_sparse(), "a sparse_coo tensor"),
    "sparse_csr": (lambda: torch.eye(4).to_sparse_csr(), "a sparse_csr tensor"),
    "mkldnn": (_mkldnn, "a mkldnn tensor"),
    "nested": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
               "a nested tensor"),
    "nested_jagged": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                         layout=torch.jagged),
                      "a nested tensor"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.arange(4.0), 0.5, 0, torch.qint8),
                  "a quantized tensor"),
    "fake": (_fake, "a torch.*FakeTensor, a tensor subclass with its own __torch_dispatch__"),
    "wrapper_subclass": (_wrapper_subclass,
                         "a .*Wrapper, a tensor subclass with its own __torch_dispatch__"),
    "conjugate": (lambda: torch.ones(4, dtype=torch.complex64).conj(), "a conjugate view"),
    "meta": (lambda: torch.empty(4, device="meta"), "a meta tensor"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # prototype, beta and deprecated kinds
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_tensors_whose_memory_is_not_their_elements_are_refused_naming_the_entry(
        tmp_path, kind):
    make, words = REFUSED[kind]
    t = make()
    with pytest.raises(ckpt.InvalidArgumentError, match=f"entry 'm.w': {words}"):
        ct.save({"m": {"w": t}}, str(tmp_path), 1)
    with pytest.raises(ckpt.InvalidArgumentError, match=f"entry 'm.w': {words}"):
        ct.save({"m": {"w": ct.Chunk(t, (8,), offsets=(0,))}}, str(tmp_path), 1)
    ct.save({"m": {"w": torch.zeros(4)}}, str(tmp_path), 2)
    with pytest.raises(ckpt.InvalidArgumentError, match=f"entry 'm.w': {words}"):
        ct.load({"m": {"w": t}}, str(tmp_path))
    assert [n for n in os.listdir(tmp_path) if n.startswith("step-")] == ["step-00000002"]


def test_tensors_inside_torch_func_transforms_are_refused_naming_the_entry(tmp_path):
    ct.save({"w": torch.zeros(3)}, str(tmp_path), 1)

    def save_inside(x):
        ct.save({"w": x}, str(tmp_path), 2)
        return x.sum()

    def load_inside(x):
        ct.load({"w": x}, str(tmp_path))
        return x.sum()
    for transform in (torch.func.grad, torch.func.vmap):
        for fn in (save_inside, load_inside):
            with pytest.raises(ckpt.InvalidArgumentError,
                               match="entry 'w': a tensor wrapped by a torch.func transform"):
                transform(fn)(torch.ones(3) if transform is torch.func.grad
                              else torch.ones(2, 3))


def test_dtypes_ckpt_lacks_are_refused_naming_the_entry(tmp_path):
    kinds = [torch.complex64] + [getattr(torch, n) for n in ("uint16", "float8_e4m3fnuz")
                                  if hasattr(torch, n)]
    ct.save({"w": torch.zeros(4)}, str(tmp_path), 1)
    for dtype in kinds:
        t = torch.zeros(4, dtype=dtype)
        with pytest.raises(TypeError, match=f"entry 'w': torch dtype {dtype} has no ckpt"):
            ct.save({"w": t}, str(tmp_path), 2)
        with pytest.raises(TypeError, match=f"entry 'w': torch dtype {dtype} has no ckpt"):
            ct.load({"w": t}, str(tmp_path))


def test_subclasses_that_only_override_torch_function_are_plain_tensors(tmp_path):
    class Tagged(torch.Tensor):  # e.g. a marker class; its memory holds its elements
        pass
    src = {"p": torch.nn.Parameter(torch.arange(4.0)),
           "t": torch.arange(3.0).as_subclass(Tagged)}
    ct.save(src, str(tmp_path), 1)
    dst = {"p": torch.nn.Parameter(torch.zeros(4)), "t": torch.zeros(3).as_subclass(Tagged)}
    ct.load(dst, str(tmp_path))
    assert torch.equal(dst["p"].detach(), torch.arange(4.0))
    assert torch.equal(dst["t"].as_subclass(torch.Tensor), torch.arange(3.0))


def test_storage_offsets_and_strides_of_size_one_dims_are_honoured(tmp_path):
    """A contiguous view at an offset into its storage, and a dimension of
    size 1 with any stride (torch calls both contiguous): the values, not
    the storage's start, are saved and loaded into."""
    base = torch.arange(10.0)
    odd = torch.arange(3.0).as_strided((3, 1), (1, 7))
    assert base[3:6].is_contiguous() and odd.is_contiguous()
    ct.save({"slice": base[3:6], "odd": odd}, str(tmp_path), 1)
    into, odd_into = torch.zeros(10), torch.zeros(3).as_strided((3, 1), (1, 5))
    ct.load({"slice": into[6:9], "odd": odd_into}, str(tmp_path))
    assert torch.equal(into, torch.tensor([0, 0, 0, 0, 0, 0, 3, 4, 5, 0.0]))
    assert torch.equal(odd_into.flatten(), torch.arange(3.0))


def test_load_destinations_whose_elements_share_memory_are_refused(tmp_path):
    ct.save({"w": torch.arange(4.0)}, str(tmp_path), 1)
    expanded = torch.zeros(1).expand(4)
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'w': the tensor is not contig"):
        ct.load({"w": expanded}, str(tmp_path))
    assert torch.equal(expanded, torch.zeros(4))


def test_dtensor_local_tensors_whose_elements_share_memory_are_refused(tmp_path):
    """A DTensor's non-contiguous local tensor is loaded through a buffer
    and copied in: into overlapping memory that copy would fail on an I/O
    thread; it is refused first, naming the entry."""
    dist = require("torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        ct.save({"w": torch.arange(4.0)}, str(tmp_path / "ck"), 1)
        overlapping = DTensor.from_local(torch.zeros(1).expand(4), mesh, [Shard(0)],
                                         run_check=False)
        with pytest.raises(ckpt.InvalidArgumentError,
                           match=r"entry 'w': the local tensor's elements share memory"):
            ct.load({"w": overlapping}, str(tmp_path / "ck"))
        strided = DTensor.from_local(torch.zeros(4, 2)[:, 0], mesh, [Shard(0)],
                                     run_check=False)  # the control: loaded via a buffer
        ct.load({"w": strided}, str(tmp_path / "ck"))
        assert torch.equal(strided.to_local(), torch.arange(4.0))
    finally:
        dist.destroy_process_group()


def test_a_load_moves_the_version_counter_as_copy_does(tmp_path):
    """A load writes into the tensor's memory in place: autograd must see
    it (as after copy_), so that a graph that saved the old values refuses
    to backpropagate through them rather than use the loaded ones."""
    ct.save({"w": torch.full((3,), 2.0)}, str(tmp_path), 1)
    w = torch.ones(3, requires_grad=True)
    y = (w * w).sum()  # saves w for backward
    before = w._version
    ct.load({"w": w}, str(tmp_path))
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_dcp_storage_saves_and_loads_negative_bit_views_with_their_values(tmp_path):
    """Behind DCP's API (which copies as torch.save does) a negative-bit
    view is resolved on save and loaded into through copy_: the values,
    not the memory, whichever the sign bit."""
    dcp = require("torch.distributed.checkpoint")
    import ckpt.torch.dcp as ckdcp
    neg = torch._neg_view(torch.arange(4.0))
    assert neg.is_neg() and neg.is_contiguous()
    dcp.save({"w": neg}, storage_writer=ckdcp.Writer(str(tmp_path), step=1))
    back = {"w": torch.zeros(4)}
    ct.load(back, str(tmp_path))
    assert torch.equal(back["w"], -torch.arange(4.0))
    into = torch._neg_view(torch.zeros(4))
    dcp.load({"w": into}, storage_reader=ckdcp.Reader(str(tmp_path)))
    assert torch.equal(into, -torch.arange(4.0))
