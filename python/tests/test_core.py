"""The core binding (import ckpt): numpy arrays through the buffer
protocol, regions, dtypes, inspection, exceptions and callbacks."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import ckpt
from conftest import ThreadRanks, run_ranks


def save_one(root, name, array, dtype=None, step=1, **kw):
    w = ckpt.Writer()
    w.add_tensor(name, dtype or ckpt.DType.from_name(str(array.dtype)), array.shape,
                 ckpt.Box.full(array.shape), array)
    return w.save(str(root), step, ckpt.save_options(**kw))


def test_version_is_the_library_version():
    assert ckpt.__version__.count(".") == 2


def test_round_trip_box_flat_and_object(tmp_path):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    w = ckpt.Writer()
    w.add_tensor("a", ckpt.float32, a.shape, ckpt.Box.full(a.shape), a)
    w.set_object("note", b"\x00hello")
    res = w.save(str(tmp_path), 7, ckpt.save_options(codec="zstd", metadata={"k": "v"}))
    assert res.path.endswith("step-00000007") and res.logical_bytes == 96 + 6

    r = ckpt.Reader(str(tmp_path))
    assert (r.step, r.world_size, dict(r.metadata)["k"]) == (7, 1, "v")
    assert len(r.id) == 32 and r.writer == f"ckpt {ckpt.__version__}"
    assert r.format_version.startswith("1.") and r.created_unix_ns > 0
    e = r.find("a")
    assert (e.kind, e.dtype, e.shape) == ("tensor", ckpt.float32, (4, 6))
    # The names alone, in the order of entries(), without an Entry each.
    assert r.entry_names() == [x.name for x in r.entries()] == ["a", "note"]
    assert e.chunks == [(ckpt.Box((0, 0), (4, 6)), 0)]
    assert r.find("missing") is None
    cols = np.zeros((4, 2), np.float32)
    flat = np.zeros(5, np.float32)
    note = ckpt.LoadRequest.for_object("note")
    report = r.load([ckpt.LoadRequest("a", ckpt.float32, (4, 6), ckpt.Box((0, 3), (4, 2)), cols),
                     note])
    np.testing.assert_array_equal(cols, a[:, 3:5])
    assert note.value == b"\x00hello" and report.loaded == ["a", "note"]
    r.load([ckpt.LoadRequest("a", ckpt.float32, (4, 6), ckpt.FlatRange(10, 5), flat)],
           allow_unrequested=True)
    np.testing.assert_array_equal(flat, a.reshape(-1)[10:15])
    assert r.read_object("note") == b"\x00hello"


def test_writer_borrows_arrays_without_copying(tmp_path):
    a = np.zeros(8, np.int64)
    w = ckpt.Writer()
    w.add_tensor("a", ckpt.int64, a.shape, ckpt.Box.full(a.shape), a)
    a[:] = 42  # after registration, before save: the save sees it
    w.save(str(tmp_path), 1)
    out = np.zeros(8, np.int64)
    ckpt.Reader(str(tmp_path)).load([ckpt.LoadRequest("a", ckpt.int64, (8,), None, out)])
    assert (out == 42).all()


def test_bfloat16_and_float8_through_unsigned_views(tmp_path):
    bf = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)  # 1.0, -2.0, inf
    f8 = np.array([0x38, 0x7E], np.uint8)
    w = ckpt.Writer()
    w.add_tensor("bf", ckpt.bfloat16, (3,), ckpt.Box.full((3,)), bf)
    w.add_tensor("f8", ckpt.float8_e4m3fn, (2,), ckpt.Box.full((2,)), f8)
    w.save(str(tmp_path), 1)
    r = ckpt.Reader(str(tmp_path))
    assert r.find("bf").dtype == ckpt.bfloat16
    out_bf, out_f8 = np.zeros(3, np.uint16), np.zeros(2, np.uint8)
    r.load([ckpt.LoadRequest("bf", ckpt.bfloat16, (3,), None, out_bf),
            ckpt.LoadRequest("f8", ckpt.float8_e4m3fn, (2,), None, out_f8)])
    np.testing.assert_array_equal(out_bf, bf)
    np.testing.assert_array_equal(out_f8, f8)


def test_buffer_of_another_type_is_refused_naming_the_entry():
    w = ckpt.Writer()
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'x'.*float32.*int32"):
        w.add_tensor("x", ckpt.int32, (4,), ckpt.Box.full((4,)), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="entry 'y'.*4 elements, the region has 5"):
        w.add_tensor("y", ckpt.float32, (5,), ckpt.Box.full((5,)), np.zeros(4, np.float32))


def test_non_contiguous_array_is_refused_not_copied():
    a = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'w': .*not C-contiguous"):
        ckpt.Writer().add_tensor("w", ckpt.float32, (4, 2), ckpt.Box.full((4, 2)), a)


def test_unsupported_object_is_refused():
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'w': a list is neither"):
        ckpt.Writer().add_tensor("w", ckpt.float32, (1,), ckpt.Box.full((1,)), [1.0])


def test_read_only_destination_is_refused(tmp_path):
    save_one(tmp_path, "a", np.ones(3, np.float32))
    ro = np.zeros(3, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'a': cannot write"):
        ckpt.Reader(str(tmp_path)).load([ckpt.LoadRequest("a", ckpt.float32, (3,), None, ro)])


def test_region_outside_shape_is_refused_naming_the_entry():
    with pytest.raises(ckpt.InvalidArgumentError, match="entry 'w'"):
        ckpt.Writer().add_tensor("w", ckpt.float32, (4,), ckpt.Box((2,), (4,)),
                                 np.zeros(4, np.float32))


def test_status_codes_map_to_exception_classes(tmp_path):
    save_one(tmp_path, "a", np.ones(3, np.float32))
    r = ckpt.Reader(str(tmp_path))
    with pytest.raises(ckpt.NotFoundError) as e:
        r.load([ckpt.LoadRequest("b", ckpt.float32, (3,), None, np.zeros(3, np.float32))])
    assert isinstance(e.value, KeyError) and isinstance(e.value, FileNotFoundError)
    assert "'b'" in str(e.value)
    with pytest.raises(ckpt.InvalidArgumentError,
                       match=r"a: global shape \[3\] in checkpoint, \[4\]"):
        r.load([ckpt.LoadRequest("a", ckpt.float32, (4,), None, np.zeros(4, np.float32))])
    with pytest.raises(ckpt.InvalidArgumentError,
                       match="a: .*float32.*float64|a: .*float64.*float32"):
        r.load([ckpt.LoadRequest("a", ckpt.float64, (3,), None, np.zeros(3, np.float64))])
    with pytest.raises(FileNotFoundError):
        ckpt.Reader(str(tmp_path / "nothing"))
    with pytest.raises(ckpt.AlreadyExistsError):
        save_one(tmp_path, "a", np.ones(3, np.float32))


def test_failed_allocation_is_resource_exhausted_not_a_bare_memory_error(tmp_path):
    # A 64 MiB object read under an address-space limit 32 MiB above the
    # process's size: the library's allocation fails (std::bad_alloc), which
    # reaches Python as ckpt.ResourceExhaustedError (a MemoryError), not as
    # pybind11's bare "MemoryError: std::bad_alloc".
    w = ckpt.Writer()
    w.set_object("big", b"\1" * (64 << 20))
    w.save(str(tmp_path), 1, ckpt.save_options(codec="zstd"))
    child = f"""
import re, resource, ckpt
r = ckpt.Reader({str(tmp_path)!r})
vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
resource.setrlimit(resource.RLIMIT_AS, ((vm << 10) + (32 << 20), resource.RLIM_INFINITY))
try:
    r.read_object("big")
except ckpt.ResourceExhaustedError as e:
    assert isinstance(e, MemoryError)
    print("refused:", e)
"""
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "refused: out of memory: an allocation failed (std::bad_alloc)\n"


def test_corrupt_shard_is_data_loss_naming_the_file(tmp_path):
    res = save_one(tmp_path, "a", np.arange(1000, dtype=np.float64))
    shard = os.path.join(res.path, "shard-00000.ckpt")
    with open(shard, "r+b") as f:  # flip a byte in the middle of the data
        f.seek(os.path.getsize(shard) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    out = np.zeros(1000, np.float64)
    with pytest.raises(ckpt.DataLossError, match="shard-00000.ckpt"):
        ckpt.Reader(res.path).load([ckpt.LoadRequest("a", ckpt.float64, (1000,), None, out)])


def test_callback_exception_fails_the_load_with_its_message(tmp_path):
    save_one(tmp_path, "a", np.ones(3, np.float32))

    def boom():
        raise RuntimeError("refresh failed")
    req = ckpt.LoadRequest("a", ckpt.float32, (3,), None, np.zeros(3, np.float32),
                           on_complete=boom)
    with pytest.raises(RuntimeError, match="refresh failed") as e:
        ckpt.Reader(str(tmp_path)).load([req])
    assert "on_complete callback of 'a'" in e.value.__notes__[0]


def test_filter_skips_entries_and_its_exception_fails_the_load(tmp_path):
    w = ckpt.Writer()
    a, b = np.ones(2, np.float32), np.ones(2, np.float32)
    w.add_tensor("a", ckpt.float32, (2,), ckpt.Box.full((2,)), a)
    w.add_tensor("b", ckpt.float32, (2,), ckpt.Box.full((2,)), b)
    w.save(str(tmp_path), 1)
    r = ckpt.Reader(str(tmp_path))
    out = np.zeros(2, np.float32)
    report = r.load([ckpt.LoadRequest("a", ckpt.float32, (2,), None, out)],
                    filter=lambda n: n != "b")
    assert report.not_loaded == [("b", "excluded by filter")] and (out == 1).all()
    quiet = r.load([ckpt.LoadRequest("a", ckpt.float32, (2,), None, out)],
                   filter=lambda n: n != "b", report_not_loaded=False)
    assert quiet.not_loaded == [] and quiet.loaded == ["a"]

    def bad(name):
        raise KeyError("filter broke")
    with pytest.raises(KeyError, match="filter broke"):
        r.load([ckpt.LoadRequest("a", ckpt.float32, (2,), None, out)], filter=bad)


def test_load_with_callbacks_on_io_threads_does_not_deadlock(tmp_path):
    """Completion callbacks run on the load's I/O threads (when it starts
    several) and take the GIL back: had the load kept the GIL on the
    calling thread, they would deadlock (caught by the join timeout)."""
    w = ckpt.Writer()
    arrays = {f"t{i}": np.full(1000, i, np.float32) for i in range(8)}
    for name, a in arrays.items():
        w.add_tensor(name, ckpt.float32, a.shape, ckpt.Box.full(a.shape), a)
    w.save(str(tmp_path), 1)
    threads, outs = set(), {n: np.zeros(1000, np.float32) for n in arrays}
    reqs = [ckpt.LoadRequest(n, ckpt.float32, (1000,), None, outs[n],
                             on_complete=lambda: threads.add(threading.get_ident()))
            for n in arrays]
    caller = []
    loader = threading.Thread(target=lambda: (caller.append(threading.get_ident()),
                                              ckpt.Reader(str(tmp_path), io_threads=4).load(reqs)))
    loader.start()
    loader.join(120)
    assert not loader.is_alive(), "load deadlocked: the GIL was not released"
    assert len(threads) >= 1
    for n, a in arrays.items():
        np.testing.assert_array_equal(outs[n], a)


def test_python_communicator_drives_a_two_rank_save(tmp_path):
    full = np.arange(10, dtype=np.float32)

    def rank(comm):
        w = ckpt.Writer(comm)
        piece = full[comm.rank * 5:(comm.rank + 1) * 5].copy()
        w.add_tensor("w", ckpt.float32, (10,), ckpt.FlatRange(comm.rank * 5, 5), piece)
        return w.save(str(tmp_path), 3)
    results = run_ranks(2, rank)
    assert results[0].path == results[1].path
    r = ckpt.Reader(str(tmp_path))
    assert r.world_size == 2 and len(r.find("w").chunks) == 2
    out = np.zeros(10, np.float32)
    r.load([ckpt.LoadRequest("w", ckpt.float32, (10,), None, out)])
    np.testing.assert_array_equal(out, full)


def test_communicator_without_a_method_is_refused():
    class Half:
        rank, size = 0, 1
    with pytest.raises(ckpt.InvalidArgumentError, match="no 'all_gather'"):
        ckpt.Writer(Half())


def test_reader_max_open_files_bounds_open_shards_and_must_be_positive(tmp_path):
    a = np.arange(12, dtype=np.int32)
    w = ckpt.Writer()
    w.add_tensor("a", ckpt.int32, a.shape, ckpt.Box.full(a.shape), a)
    res = w.save(str(tmp_path), 1)
    out = np.zeros(12, np.int32)
    ckpt.Reader(res.path, max_open_files=1).load(
        [ckpt.LoadRequest("a", ckpt.int32, (12,), None, out)])
    np.testing.assert_array_equal(out, a)
    with pytest.raises(ckpt.InvalidArgumentError,
                       match="ReaderOptions::max_open_files is 0, must be at least 1"):
        ckpt.Reader(res.path, max_open_files=0)
