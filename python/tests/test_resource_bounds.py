"""ckpt.Reader on checkpoints whose every checksum is valid but whose
metadata asks for far more memory than its bytes on disk (issue 28,
SECURITY.md "Resource use"), each opened in a child whose address space is
limited to what it had + 16 bytes per byte of metadata + 512 MiB: a refusal
(ckpt.DataLossError naming the entry), never a MemoryError. The checkpoints
are written at test time by ckpt-hostile-gen (tests/tools/hostile_gen.cc),
built next to the tools."""
import os
import subprocess
import sys

import pytest


def hostile_checkpoint(tmp_path, kind: str, n: int) -> tuple:
    """Writes checkpoint `kind` of size `n`; returns its path and its bytes
    of metadata."""
    gen = os.path.join(os.environ.get("CKPT_BIN_DIR", "build/bin"), os.pardir,
                       "tests", "ckpt-hostile-gen")
    if not os.access(gen, os.X_OK):
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{gen} is not built")
        pytest.skip(f"{gen} is not built")
    path = str(tmp_path / kind)
    out = subprocess.run([gen, kind, str(n), path], check=True, capture_output=True,
                         text=True).stdout
    return path, int(out.split(": ")[1].split()[0])


def open_limited(path: str, metadata_bytes: int) -> subprocess.CompletedProcess:
    child = f"""
import re, resource, ckpt
vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
limit = (vm << 10) + 16 * {metadata_bytes} + (512 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
try:
    ckpt.Reader({path!r})
    print("opened")
except ckpt.DataLossError as e:
    print("refused:", e)
"""
    return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env={**os.environ, "MALLOC_ARENA_MAX": "1"}, timeout=120)


def test_flat_range_copies_are_refused_in_bounded_memory(tmp_path):
    # One box that is not a run, then 20,000 copies of a flat range of 63
    # boxes of 32 dims: the coverage check took 1.4 GB and 14 s.
    path, meta = hostile_checkpoint(tmp_path, "coverage", 20000)
    p = open_limited(path, meta)
    assert p.returncode == 0, p.stderr
    assert "entry 't': chunks 1 and 2 overlap in flat[1:4294967295)" in p.stdout


def test_scalar_chunks_are_refused_at_the_second_record(tmp_path):
    # 2^23 chunk records of 7 bytes in a 0-d entry (59 MB of manifest):
    # decoding them took 39 bytes of memory per byte.
    path, meta = hostile_checkpoint(tmp_path, "scalars", 1 << 23)
    p = open_limited(path, meta)
    assert p.returncode == 0, p.stderr
    assert "entry 's': chunk 1: 2 chunks hold elements of an entry of 1 elements" in p.stdout


def test_a_load_of_many_scalar_entries_takes_under_1200_bytes_a_request(tmp_path):
    # 2^17 valid scalar entries loaded by one Reader.load: the load's peak
    # RSS beyond the requests and their arrays, per request (the C++ copies
    # and plan, the binding's views, the report, the shard index read on
    # first use). It was 1441 bytes (a copy of every request, a set of
    # names, a map of pieces, a heap block per copy, vectors grown twice
    # over); 991 since.
    n = 1 << 17
    path, _ = hostile_checkpoint(tmp_path, "scalar-entries", n)
    child = f"""
import resource, numpy as np, ckpt
r = ckpt.Reader({path!r})
names = r.entry_names()
arrays = [np.zeros((), np.float32) for _ in names]
reqs = [ckpt.LoadRequest(name, ckpt.float32, [], None, a)
        for name, a in zip(names, arrays)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = r.load(reqs)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert len(report.loaded) == {n}
print((after - before) * 1024 // {n})
"""
    pytest.importorskip("numpy")
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                       env={**os.environ, "MALLOC_ARENA_MAX": "1"}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) < 1200, p.stdout
