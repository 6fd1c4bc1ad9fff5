"""safetensors and Hugging Face against the real libraries (issue 22, item 5).

ckpt's safetensors writer and reader (ckpt-convert --to/--from safetensors,
interop/io/safetensors_*) were written from the format's specification;
here the reference implementation (the `safetensors` package), huggingface_hub
and transformers read what ckpt writes and write what ckpt reads, and every
value is compared bit for bit:

- export: every dtype both have, one file and Hugging Face shards, read by
  safetensors (raw bytes, torch and numpy); the index is the one
  transformers writes, with huggingface_hub's shard plan;
- import: files written by safetensors.torch / safetensors.numpy (every
  dtype, metadata, scalars, empty tensors); the dtypes ckpt lacks are
  refused by name;
- a tiny transformers model: save_pretrained shards import exactly, and
  ckpt's export of them loads with from_pretrained and gives bit-identical
  logits.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import require, tool

# No network: the model is built from its config, and every load is local.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

torch = require("torch")
safetensors = require("safetensors")
require("safetensors.torch")
require("safetensors.numpy")
transformers = require("transformers")
hf_serialization = require("huggingface_hub.serialization")

import ckpt  # noqa: E402  (after the skips above)

# The dtypes of ckpt and safetensors: ckpt name -> (safetensors name, torch dtype).
DTYPES = {
    "bool": ("BOOL", torch.bool),
    "uint8": ("U8", torch.uint8),
    "int8": ("I8", torch.int8),
    "uint16": ("U16", torch.uint16),
    "int16": ("I16", torch.int16),
    "uint32": ("U32", torch.uint32),
    "int32": ("I32", torch.int32),
    "uint64": ("U64", torch.uint64),
    "int64": ("I64", torch.int64),
    "float16": ("F16", torch.float16),
    "bfloat16": ("BF16", torch.bfloat16),
    "float32": ("F32", torch.float32),
    "float64": ("F64", torch.float64),
    "float8_e4m3fn": ("F8_E4M3", torch.float8_e4m3fn),
    "float8_e5m2": ("F8_E5M2", torch.float8_e5m2),
}
# numpy's own dtype where it has one (safetensors.numpy reads these).
NUMPY = {"bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "uint16": np.uint16,
         "int16": np.int16, "uint32": np.uint32, "int32": np.int32, "uint64": np.uint64,
         "int64": np.int64, "float16": np.float16, "float32": np.float32,
         "float64": np.float64}
RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def run(*args, expect=0):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    assert r.returncode == expect, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def random_bits(name, shape, rng):
    """An array of `shape` whose bytes are random (any bit pattern: NaN
    payloads, -0, infinities) as a raw unsigned view; bools are 0 or 1."""
    n = int(np.prod(shape, dtype=np.int64))
    if name == "bool":
        return rng.integers(0, 2, n, dtype=np.uint8).astype(np.bool_).reshape(shape)
    size = ckpt.DType.from_name(name).itemsize
    return np.frombuffer(rng.bytes(n * size), RAW[size]).copy().reshape(shape)


def raw_bytes(t):
    """The bytes of a torch tensor (any dtype, 0-d and empty too)."""
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def load_raw(reader, name):
    """Entry `name` of a ckpt.Reader as (dtype name, shape, bytes)."""
    e = reader.find(name)
    out = np.empty(e.shape, RAW[e.dtype.itemsize])
    reader.load([ckpt.LoadRequest(name, e.dtype, e.shape, None, out)], allow_unrequested=True)
    return e.dtype.name, tuple(e.shape), out.tobytes()


# --- ckpt writes, safetensors reads -----------------------------------------

@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A ckpt checkpoint with every dtype (random bits), a scalar, empty
    tensors, an object and user metadata; returns (root, {name: (ckpt dtype
    name, shape, bytes)}, metadata)."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(22)
    w = ckpt.Writer()
    tensors, keep = {}, []
    shapes = {"float64": (6, 7)}  # 336 bytes: larger than the shard limit below
    for name in DTYPES:
        shape = shapes.get(name, (3, 5))
        a = random_bits(name, shape, rng)
        keep.append(a)
        dt = ckpt.DType.from_name(name)
        w.add_tensor(f"t.{name}", dt, shape, ckpt.Box.full(shape), a)
        tensors[f"t.{name}"] = (name, shape, a.tobytes())
    for entry, name, shape in [("scalar.f32", "float32", ()), ("scalar.bf16", "bfloat16", ()),
                               ("empty.i64", "int64", (0, 4)), ("empty.bf16", "bfloat16", (2, 0))]:
        a = random_bits(name, shape, rng)
        keep.append(a)
        w.add_tensor(entry, ckpt.DType.from_name(name), shape, ckpt.Box.full(shape), a)
        tensors[entry] = (name, shape, a.tobytes())
    w.set_object("rng.state", b"\x00\x01opaque\xff")
    metadata = {"note": "h\u00e9llo", "run": "issue-22"}
    w.save(str(root), 7, ckpt.save_options(metadata=metadata))
    return root, tensors, metadata


def check_file_with_reference(path, expected):
    """Reads `path` three ways with the reference implementation and checks
    every tensor in `expected` ({name: (ckpt dtype, shape, bytes)}) that it
    holds; returns the names it holds and its __metadata__."""
    with open(path, "rb") as f:
        image = f.read()
    raw = dict(safetensors.deserialize(image))
    for name, info in raw.items():
        dt, shape, data = expected[name]
        assert info["dtype"] == DTYPES[dt][0], name
        assert tuple(info["shape"]) == shape, name
        assert bytes(info["data"]) == data, name
    # Typed, through torch (safe_open and load_file).
    loaded = safetensors.torch.load_file(str(path))
    with safetensors.safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        assert sorted(f.keys()) == sorted(raw)
        for name in f.keys():
            dt, shape, data = expected[name]
            for t in (f.get_tensor(name), loaded[name]):
                assert t.dtype == DTYPES[dt][1] and tuple(t.shape) == shape, name
                assert raw_bytes(t) == data, name
    # Typed, through numpy, for the dtypes numpy has.
    with safetensors.safe_open(str(path), framework="numpy") as f:
        for name in f.keys():
            dt, shape, data = expected[name]
            if dt in NUMPY:
                a = f.get_tensor(name)
                assert a.dtype == NUMPY[dt] and a.shape == shape and a.tobytes() == data, name
    return set(raw), metadata


def expected_with_object(source):
    root, tensors, metadata = source
    expected = dict(tensors)
    expected["rng.state"] = ("uint8", (9,), b"\x00\x01opaque\xff")
    return expected


def test_reference_reads_one_file_exactly(source, tmp_path):
    root, tensors, metadata = source
    out = tmp_path / "m.safetensors"
    run(tool("ckpt-convert"), root, out, "--to", "safetensors")
    expected = expected_with_object(source)
    names, meta = check_file_with_reference(out, expected)
    assert names == set(expected)
    # transformers refuses a file without "format"; the user metadata is
    # there as itself, and exactly in ckpt.user_metadata.
    assert meta["format"] == "pt" and meta["ckpt.step"] == "7"
    assert {k: meta[k] for k in metadata} == metadata
    assert json.loads(meta["ckpt.objects"]) == ["rng.state"]
    # The header as the reference writes it: padded with spaces to 8 bytes.
    image = out.read_bytes()
    n = int.from_bytes(image[:8], "little")
    assert n % 8 == 0 and image[8:9] == b"{"


def test_reference_reads_shards_exactly_and_index_is_transformers(source, tmp_path):
    root, tensors, metadata = source
    out = tmp_path / "hf"
    limit = 256
    run(tool("ckpt-convert"), root, out, "--to", "safetensors", "--max-shard-size", limit)
    expected = expected_with_object(source)
    index_path = out / "model.safetensors.index.json"
    text = index_path.read_text()
    index = json.loads(text)
    # Written as transformers writes it (json.dumps, indent 2, sorted keys).
    assert text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    assert set(index) == {"metadata", "weight_map"}
    weight_map = index["weight_map"]
    assert set(weight_map) == set(expected)
    assert index["metadata"]["total_size"] == sum(len(v[2]) for v in expected.values())
    files = sorted(set(weight_map.values()))
    assert len(files) >= 3
    assert sorted(p.name for p in out.iterdir()) == sorted(files + [index_path.name])
    seen = set()
    for f in files:
        names, meta = check_file_with_reference(out / f, expected)
        assert names == {t for t, g in weight_map.items() if g == f}
        assert meta["format"] == "pt"
        seen |= names
    assert seen == set(expected)
    # transformers finds the shards and keys through the index.
    shard_files, sharded = transformers.utils.hub.get_checkpoint_shard_files(
        str(out), str(index_path))
    assert shard_files == [str(out / f) for f in files]
    assert sorted(sharded["all_checkpoint_keys"]) == sorted(expected)
    # The shards are huggingface_hub's (what save_pretrained uses) for the
    # same tensors in the checkpoint's order and the same limit.
    order = [e.name for e in ckpt.Reader(str(root)).entries()]
    arrays = {n: np.zeros(len(expected[n][2]), np.uint8) for n in order}
    split = hf_serialization.split_state_dict_into_shards_factory(
        arrays, get_storage_size=lambda a: a.nbytes, max_shard_size=limit,
        filename_pattern="model{suffix}.safetensors")
    assert split.tensor_to_filename == weight_map
    assert split.metadata["total_size"] == index["metadata"]["total_size"]


# --- safetensors writes, ckpt reads -----------------------------------------

def import_and_compare(path, expected, tmp_path, metadata=None):
    """ckpt-convert --from safetensors, then every entry's bytes."""
    root = tmp_path / "ck"
    run(tool("ckpt-convert"), path, root, "--from", "safetensors")
    run(tool("ckpt-validate"), path)
    r = ckpt.Reader(str(root))
    assert sorted(e.name for e in r.entries()) == sorted(expected)
    for name, (dt, shape, data) in expected.items():
        assert load_raw(r, name) == (dt, shape, data), name
    if metadata is not None:
        assert dict(r.metadata) == metadata
    run(tool("ckpt-diff"), path, root)
    return r


def test_ckpt_imports_torch_save_file_exactly(tmp_path):
    rng = np.random.default_rng(5)
    tensors, expected = {}, {}
    for name, (_, tdt) in DTYPES.items():
        for suffix, shape in (("", (4, 3)), (".scalar", ()), (".empty", (0, 3))):
            bits = random_bits(name, shape, rng)
            t = torch.from_numpy(bits.copy()).view(tdt) if name != "bool" else \
                torch.from_numpy(bits.copy())
            tensors[name + suffix] = t
            expected[name + suffix] = (name, shape, bits.tobytes())
    path = tmp_path / "torch.safetensors"
    metadata = {"format": "pt", "origin": "safetensors.torch", "\u00fcml": "\u2603"}
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    import_and_compare(path, expected, tmp_path, metadata)


def test_ckpt_imports_numpy_save_file_exactly(tmp_path):
    rng = np.random.default_rng(6)
    arrays, expected = {}, {}
    for name, npdt in NUMPY.items():
        for suffix, shape in (("", (2, 3, 2)), (".scalar", ()), (".empty", (3, 0))):
            bits = random_bits(name, shape, rng)
            arrays[name + suffix] = bits.view(npdt)
            expected[name + suffix] = (name, shape, bits.tobytes())
    path = tmp_path / "np.safetensors"
    safetensors.numpy.save_file(arrays, str(path), metadata={"k": "v"})
    import_and_compare(path, expected, tmp_path, {"k": "v"})
    # And without any metadata.
    (tmp_path / "b").mkdir()
    safetensors.numpy.save_file({"a": np.arange(3, dtype=np.int16)}, str(tmp_path / "b.safetensors"))
    import_and_compare(tmp_path / "b.safetensors",
                       {"a": ("int16", (3,), np.arange(3, dtype=np.int16).tobytes())},
                       tmp_path / "b", {})


FOREIGN_ONLY = [("C64", "complex64"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
                ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("F8_E8M0", "float8_e8m0fnu")]


@pytest.mark.parametrize("st_name,torch_name", FOREIGN_ONLY)
def test_dtype_ckpt_lacks_is_refused_by_name(tmp_path, st_name, torch_name):
    if not hasattr(torch, torch_name):
        pytest.skip(f"torch has no {torch_name}")
    path = tmp_path / "x.safetensors"
    t = torch.zeros(4, dtype=torch.uint8 if "float8" in torch_name else torch.float32)
    t = t.view(getattr(torch, torch_name)) if "float8" in torch_name else t.to(torch.complex64)
    safetensors.torch.save_file({"x": t}, str(path))
    assert dict(safetensors.deserialize(path.read_bytes()))["x"]["dtype"] == st_name
    r = run(tool("ckpt-convert"), path, tmp_path / "ck", "--from", "safetensors", expect=2)
    assert f"tensor 'x': dtype {st_name} has no ckpt equivalent" in r.stderr


# Headers the reference accepts or refuses; ckpt-validate must agree, except
# where ckpt is stricter on purpose (STRICTER).
_X = b'"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
HEADERS = {
    "padded with spaces": b"{" + _X + b"}   ",
    "unpadded": b"{" + _X + b"}",
    "trailing newlines, tabs, CRs": b"{" + _X + b"}\n\t\r",
    "metadata null": b'{"__metadata__":null,' + _X + b"}",
    "metadata empty": b'{"__metadata__":{},' + _X + b"}",
    "unknown field ignored": b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"z":1}}',
    "escaped name": b'{"a\\/b\\u00e9":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "padded with NULs": b"{" + _X + b"}\0\0\0\0\0",
    "NUL then garbage": b"{" + _X + b"}\0garbage",
    "form feed after": b"{" + _X + b"}\x0c",
    "byte order mark": b"\xef\xbb\xbf{" + _X + b"}",
    "top-level array": b"[" + _X[4:] + b"]",
    "dim 1.0": b'{"x":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}',
    "dim -1": b'{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}',
    "three offsets": b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}',
    "offset 2^64": b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551616]}}',
    "dtype u8": b'{"x":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}',
    "dtype null": b'{"x":{"dtype":null,"shape":[1],"data_offsets":[0,1]}}',
    "no offsets": b'{"x":{"dtype":"U8","shape":[1]}}',
    "metadata value 1": b'{"__metadata__":{"k":1},' + _X + b"}",
    "metadata a string": b'{"__metadata__":"k",' + _X + b"}",
    "lone surrogate": b'{"x\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "invalid UTF-8": b'{"x\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "two bytes for one": b'{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}',
    "offset not 0": b'{"x":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}}',
    "leading space": b" {" + _X + b"}",
    "same key twice": b"{" + _X + b"," + _X + b"}",
}
# The specification says the header MUST begin with '{', which the reference
# does not check; a repeated key is ambiguous (the reference keeps the last).
STRICTER = {"leading space", "same key twice"}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_validation_agrees_with_reference(tmp_path, case):
    header = HEADERS[case]
    image = len(header).to_bytes(8, "little") + header + b"\x01"
    try:
        safetensors.deserialize(image)
        reference_ok = True
    except Exception:
        reference_ok = False
    path = tmp_path / "x.safetensors"
    path.write_bytes(image)
    r = subprocess.run([tool("ckpt-validate"), str(path)], capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    if case in STRICTER:
        assert reference_ok and r.returncode == 1, r.stdout
    else:
        assert (r.returncode == 0) == reference_ok, r.stdout


# --- a Hugging Face model ---------------------------------------------------

@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
        tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    saved = tmp_path_factory.mktemp("hf") / "saved"
    model.save_pretrained(str(saved), max_shard_size="20KB")
    return model, saved


def logits(model):
    ids = torch.tensor([[1, 7, 42, 99, 3, 127, 0, 64], [5, 5, 5, 120, 17, 2, 88, 31]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_save_pretrained_imports_exactly(hf_model, tmp_path):
    model, saved = hf_model
    shards = sorted(p.name for p in saved.glob("model-*.safetensors"))
    assert len(shards) >= 3
    run(tool("ckpt-validate"), saved)
    inspect = run(tool("ckpt-inspect"), saved).stdout
    assert f"Hugging Face safetensors index ({len(shards)} shards)" in inspect
    ck = tmp_path / "ck"
    run(tool("ckpt-convert"), saved, ck, "--from", "safetensors")
    run(tool("ckpt-diff"), saved, ck)
    r = ckpt.Reader(str(ck))
    state = model.state_dict()
    names = {e.name for e in r.entries()}
    # The tied lm_head is not saved: it is the embedding.
    assert names == set(state) - {"lm_head.weight"}
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    for name in names:
        t = state[name]
        dt = next(k for k, v in DTYPES.items() if v[1] == t.dtype)
        assert load_raw(r, name) == (dt, tuple(t.shape), raw_bytes(t)), name
    assert dict(r.metadata) == {"format": "pt"}


def test_ckpt_export_loads_with_from_pretrained_bit_identically(hf_model, tmp_path):
    model, saved = hf_model
    ck = tmp_path / "ck"
    run(tool("ckpt-convert"), saved, ck, "--from", "safetensors")
    out = tmp_path / "out"
    run(tool("ckpt-convert"), ck, out, "--to", "safetensors", "--max-shard-size", "20KB")
    assert len(list(out.glob("model-*.safetensors"))) >= 3
    for f in ("config.json", "generation_config.json"):
        shutil.copy(saved / f, out / f)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    loaded.eval()
    assert type(loaded) is type(model) and loaded.dtype == torch.float32
    state, back = model.state_dict(), loaded.state_dict()
    assert set(back) == set(state)
    for name, t in state.items():
        assert raw_bytes(back[name]) == raw_bytes(t), name
    assert torch.equal(logits(loaded), logits(model))
    run(tool("ckpt-validate"), out)
