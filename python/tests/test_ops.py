"""ckpt.validate, ckpt.diff and ckpt.reshard (ckpt/ops.py over ops/): the
operations the tools run, on checkpoints written here, with their reports
checked against what was written and damaged."""
import json
import os
import subprocess

import numpy as np
import pytest

import ckpt
from conftest import run_ranks

W = np.arange(96 * 64, dtype=np.float32).reshape(96, 64) * 0.25
B = np.linspace(-1, 1, 40).astype(np.float32)


def save_two_ranks(root, step=5, w=W):
    """W split in rows over 2 ranks, B in two flat halves, an object on
    rank 0: a checkpoint saved on 2 ranks."""

    def rank(comm):
        r = comm.rank
        wr = ckpt.Writer(comm)
        rows = w[r * 48:(r + 1) * 48].copy()
        wr.add_tensor("w", ckpt.float32, w.shape, ckpt.Box((r * 48, 0), (48, 64)), rows)
        half = B[r * 20:(r + 1) * 20].copy()
        wr.add_tensor("b", ckpt.float32, B.shape, ckpt.FlatRange(r * 20, 20), half)
        if r == 0:
            wr.set_object("note", b"two ranks")
        return wr.save(str(root), step)
    return run_ranks(2, rank)[0].path


def load_all(root):
    r = ckpt.Reader(str(root))
    w = np.zeros(W.shape, np.float32)
    b = np.zeros(B.shape, np.float32)
    note = ckpt.LoadRequest.for_object("note")
    r.load([ckpt.LoadRequest("w", ckpt.float32, W.shape, None, w),
            ckpt.LoadRequest("b", ckpt.float32, B.shape, None, b), note])
    return r, w, b, note.value


def test_validate_finds_nothing_in_a_good_checkpoint(tmp_path):
    path = save_two_ranks(tmp_path / "run")
    report = ckpt.validate(str(tmp_path / "run"))
    assert isinstance(report, ckpt.ValidateReport)
    assert report.valid and report.findings == [] and report.errors == 0
    assert report.checkpoint == path and report.root == str(tmp_path / "run")
    assert (report.step, report.world_size, report.shards, report.shards_ok) == (5, 2, 2, 2)
    assert report.entries == 3 and report.blocks_verified > 0
    assert report.bytes_verified == report.payload_bytes


def test_validate_finds_a_flipped_byte_with_file_entry_chunk_and_block(tmp_path):
    path = save_two_ranks(tmp_path / "run")
    shard = os.path.join(path, "shard-00001.ckpt")
    # Rank 1's shard holds rows 48..95 of "w" (12 KiB) and 80 bytes of "b":
    # its middle byte lies in "w".
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    report = ckpt.validate(path, threads=2)
    assert not report.valid and report.errors == 1
    (f,) = report.findings
    assert isinstance(f, ckpt.Finding)
    assert (f.severity, f.file, f.entry) == ("error", shard, "w")
    assert f.chunk is not None and f.block is not None and f.block >= 0
    assert f.region == "[48:96, 0:64]"
    assert "checksum" in f.message and f.text.startswith(shard)
    # The same finding as ckpt-validate --json reports, field for field.
    tool = os.path.join(os.environ.get("CKPT_BIN_DIR", ""), "ckpt-validate")
    if os.path.exists(tool):
        out = subprocess.run([tool, path, "--json"], capture_output=True, text=True)
        assert out.returncode == 1
        doc = json.loads(out.stdout)
        assert doc["findings"] == [f.__dict__]
        assert doc["errors"] == report.errors and doc["valid"] is False


def test_validate_quick_and_check_finite_are_refused_together(tmp_path):
    save_two_ranks(tmp_path / "run")
    with pytest.raises(ckpt.InvalidArgumentError, match="--quick"):
        ckpt.validate(str(tmp_path / "run"), quick=True, check_finite=True)


def test_validate_of_a_missing_path_raises_not_found(tmp_path):
    with pytest.raises(ckpt.NotFoundError):
        ckpt.validate(str(tmp_path / "nothing"))


def test_diff_finds_a_changed_value(tmp_path):
    save_two_ranks(tmp_path / "a")
    w2 = W.copy()
    w2[70, 3] = -7.5
    save_two_ranks(tmp_path / "b", w=w2)
    d = ckpt.diff(str(tmp_path / "a"), str(tmp_path / "b"))
    assert isinstance(d, ckpt.DiffReport)
    assert not d.equal and d.structural == [] and d.entries_compared == 3
    assert d.loads == 1  # the three small entries are read together
    (v,) = d.values
    assert (v.entry, v.kind, v.differing, v.total) == ("w", "tensor", 1, W.size)
    assert v.first_at == [70, 3]
    assert (float(v.first_a), float(v.first_b)) == (float(W[70, 3]), -7.5)
    assert v.max_abs_diff == pytest.approx(float(W[70, 3]) + 7.5)
    # Within a tolerance that covers the change, the two are equal.
    assert ckpt.diff(str(tmp_path / "a"), str(tmp_path / "b"), atol=2000).equal


def test_diff_reports_structure_and_notes(tmp_path):
    save_two_ranks(tmp_path / "a", step=5)
    w = ckpt.Writer()
    w.add_tensor("w", ckpt.float64, (2,), ckpt.Box.full((2,)), np.zeros(2))
    w.save(str(tmp_path / "b"), 6)
    d = ckpt.diff(str(tmp_path / "a"), str(tmp_path / "b"))
    assert not d.equal
    changes = {(s.entry, s.change): (s.a, s.b) for s in d.structural}
    assert changes[("b", "removed")] == (None, None)
    assert changes[("note", "removed")] == (None, None)
    assert changes[("w", "dtype")] == ("float32", "float64")
    assert changes[("w", "shape")] == ("[96, 64]", "[2]")
    notes = {n.what: (n.a, n.b) for n in d.notes}
    assert notes["step"] == ("5", "6") and notes["world size"] == ("2", "1")
    assert (d.a.step, d.a.world_size, d.b.entries) == (5, 2, 1)


def test_reshard_two_to_three_then_load_equals_the_original(tmp_path):
    save_two_ranks(tmp_path / "run")
    r = ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "three"), to=3, from_=2,
                     verify=True)
    assert isinstance(r, ckpt.ReshardReport)
    assert (r.src.world_size, r.dst.world_size, r.step) == (2, 3, 5)
    assert r.dst.path == str(tmp_path / "three" / "step-00000005")
    layouts = {e.name: (e.layout, e.source) for e in r.entries}
    assert layouts["w"][0] == "dim0" and layouts["b"][0] == "flat"
    assert layouts["note"][0] == "object"
    assert r.tensor_bytes == W.nbytes + B.nbytes and r.object_bytes == len(b"two ranks")
    assert r.verify is not None and r.verify.equal
    reader, w, b, note = load_all(tmp_path / "three")
    assert reader.world_size == 3
    np.testing.assert_array_equal(w, W)
    np.testing.assert_array_equal(b, B)
    assert note == b"two ranks"
    assert ckpt.validate(str(tmp_path / "three")).valid
    assert ckpt.diff(str(tmp_path / "run"), str(tmp_path / "three")).equal


def test_reshard_takes_layouts_by_pattern(tmp_path):
    save_two_ranks(tmp_path / "run")
    r = ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2,
                     layout={"w": "dim1", "b*": "replicated"}, codec="zstd")
    layouts = {e.name: (e.layout, e.override) for e in r.entries}
    assert layouts["w"] == ("dim1", True) and layouts["b"] == ("replicated", True)
    assert r.codec == "zstd"
    _, w, b, _ = load_all(tmp_path / "out")
    np.testing.assert_array_equal(w, W)
    np.testing.assert_array_equal(b, B)


def test_reshard_errors_are_the_package_exceptions(tmp_path):
    save_two_ranks(tmp_path / "run")
    with pytest.raises(ckpt.InvalidArgumentError, match="saved on 2 ranks, --from 3 given"):
        ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2, from_=3)
    with pytest.raises(ckpt.InvalidArgumentError, match="matches no entry"):
        ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2,
                     layout={"nothing.*": "flat"})
    with pytest.raises(ckpt.InvalidArgumentError, match="expected"):
        ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2, layout={"w": "dim"})
    with pytest.raises(ckpt.NotFoundError):
        ckpt.reshard(str(tmp_path / "none"), str(tmp_path / "out"), to=2)
    ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2)
    with pytest.raises(ckpt.AlreadyExistsError):
        ckpt.reshard(str(tmp_path / "run"), str(tmp_path / "out"), to=2)


def test_copy_for_later_gives_the_source_bytes_at_every_size_and_alignment():
    """ckpt._ckpt._copy_for_later (the snapshot's copy; bench/peers times
    its bound with it): the bytes of src, at sizes on both sides of the
    streaming threshold (256 KiB) and misaligned views, nothing around dst
    touched; torch tensors (DLPack) as well as buffers."""
    from ckpt import _ckpt
    rng = np.random.default_rng(7)
    for n in (0, 1, (256 << 10) - 1, 256 << 10, (256 << 10) + 129, (1 << 20) + 3):
        for shift in (0, 1, 63):
            src = rng.integers(0, 256, n + 64, dtype=np.uint8)
            dst = np.zeros(n + 128, dtype=np.uint8)
            _ckpt._copy_for_later(dst[shift:shift + n], src[64 - shift:64 - shift + n])
            assert np.array_equal(dst[shift:shift + n], src[64 - shift:64 - shift + n]), (n, shift)
            assert not dst[:shift].any() and not dst[shift + n:].any(), (n, shift)
    torch = pytest.importorskip("torch")
    t = torch.arange(1 << 18, dtype=torch.float32)
    out = torch.zeros_like(t)
    _ckpt._copy_for_later(out, t)
    assert torch.equal(out, t)


def test_copy_for_later_refuses_sizes_that_differ_and_a_read_only_destination():
    from ckpt import _ckpt
    with pytest.raises(ckpt.InvalidArgumentError, match="dst has 8 bytes, src 9"):
        _ckpt._copy_for_later(bytearray(8), bytes(9))
    with pytest.raises(ckpt.InvalidArgumentError, match="dst"):
        _ckpt._copy_for_later(bytes(8), bytes(8))
