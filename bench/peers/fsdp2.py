#!/usr/bin/env python3
"""ckpt next to torch.distributed.checkpoint (DCP) and torch.save on an FSDP2
state, on N gloo processes.

    PYTHONPATH=build/python .venv/bin/python bench/peers/fsdp2.py same \
        --ranks 4 --gib 1 --runs 3 --dir /dev/shm/ckpt-fsdp2 [--keep DIR]
        [--leak-saves 20] [--integrity] [--bin build/bin]
    ... fsdp2.py reshard --ranks 2 --gib 1 --runs 3 --dir D --src KEEPDIR

The state (torch_state.py): a transformer-like model, FSDP2-sharded
(Shard(0) of every parameter), and its AdamW state, bf16 and fp32, about
--gib GiB in all, with values that are a function of each element's global
index, so that every load is checked bit for bit after its timing.

`same`: each run, contenders interleaved (the order rotates run by run):
  save, then load into the same layout:
    limit          the bound: one write(2) of each local tensor's bytes into
                   one file per rank + fsync, and readinto(2) of them in
                   place (no format, no checksum)
    dcp            dcp.save / dcp.load, FileSystemWriter / FileSystemReader
                   (thread_count 1: its default), get_state_dict and
                   set_state_dict included
    dcp tc=T       the same with FileSystemWriter(thread_count=T), T = 2, 4
    ckpt.torch     Checkpointer.save / Checkpointer.load of {"model", "optim"}
                   (Stateful values; every block checksummed; the load is
                   cooperative: each stored block read once in the job)
    ckpt indep.    ckpt.torch.load of the same checkpoint through a process
                   group of this rank alone: every rank reads what it needs
                   itself (strict=False: the other ranks' entries are theirs)
    dcp+ckpt       dcp.save / dcp.load with ckpt.torch.dcp.Writer / Reader
    torch.save     torch.save of each rank's local tensors to its own file
                   (+ fsync); torch.load (weights_only) and a copy into the
                   state's tensors
  async save: blocked = from the call until the trainer may modify the
  state (the call's return), durable = until the checkpoint is committed
  (future.result() / handle.wait()). After the call returns, the state is
  overwritten (as a training step would), and the checkpoint, once
  durable, is loaded (untimed) and checked against the state at the call:
    limit: memcpy    one copy_ of each local tensor into memory allocated
                     and written before: what a snapshot costs with torch's
                     copy (ordinary stores; ckpt's snapshot streams its
                     stores past the cache, util/copy.h, and can take less)
    limit: state dict + ckpt copy  get_state_dict(model, optim) (as every
                     other row calls it) and ckpt's snapshot copy
                     (util/copy.h, ckpt._ckpt._copy_for_later) of each
                     local tensor into memory written before: the bound of
                     any snapshot through DCP's state-dict API with that copy
    dcp.async        dcp.async_save, FileSystemWriter (its own stager:
                     BlockingAsyncStager, a fresh CPU copy per save)
    dcp.async cached dcp.async_save with BlockingAsyncStager(
                     cache_staged_state_dict=True), kept across saves (the
                     documented option that "decreases staging latency"; it
                     pins its memory, which a CPU-only torch refuses)
    dcp.async stager dcp.async_save with a DefaultStager(StagingOptions(
                     use_pinned_memory=False, use_shared_memory=False,
                     use_async_staging=False, use_non_blocking_copy=False))
                     kept across saves: the documented stager with every
                     CUDA-only option off; it caches its CPU copies
    dcp.async bg stager  the same with use_async_staging=True: staged on a
                     thread; blocked until its staging_completion
    ckpt.torch async Checkpointer.save_async
    dcp+ckpt async   dcp.async_save with ckpt.torch.dcp.Writer (ckpt stages)
  The async saves run over a gloo group of their own, as DCP recommends.
  Before its first timed save, each async contender saves once untimed:
  its one-time setup (ckpt's staging memory, a kept stager's CPU copies,
  DCP's threads) is paid once per job, not per checkpoint, and with a few
  runs a cold first run would decide the median.
  --leak-saves K: after the runs, K consecutive async saves of each async
  contender (each waited for, its checkpoint then removed): the sum over
  ranks of VmRSS before the first, after the first and after the last save,
  and of VmHWM (reset through /proc/self/clear_refs) over the K saves.
  --keep DIR: after the runs, the state saved once more by dcp, ckpt.torch,
  ckpt.torch of the model alone, and DCP's HuggingFaceStorageWriter
  (save_distributed=True) of the model alone, into DIR (for `reshard` and
  the consolidation of single.py).
  --integrity: every contender's checkpoint saved once more, one byte in
  the middle of the stored bytes of rank 0's piece of one tensor flipped,
  then loaded: what each does (an error, and whether it names the tensor
  or its file; wrong values loaded without an error; correct values).

`reshard`: loads KEEPDIR's dcp and ckpt.torch checkpoints (saved on
another number of ranks) into this job's layouts, interleaved per run:
  fsdp2 layout  the same model and AdamW, FSDP2 on --ranks processes
  tp layout     every 2-d tensor a DTensor Shard(1) (columns), every 1-d one
                Shard(0), on a 1-d mesh of --ranks processes
by dcp.load (FileSystemReader), ckpt.torch.load (cooperative) and
ckpt.torch.load independent; bytes read per job are the sum over the
ranks of /proc/self/io rchar (bytes through read/pread: DCP and ckpt both
read files that way; gloo's socket traffic is not counted, and /dev/shm
reads never show in read_bytes) and, for ckpt, LoadReport.bytes_read.

Times are the slowest rank's (a barrier before and after), medians over
--runs with the range; with each save and load, the CPU seconds (user +
system, every thread) of all ranks' processes. The last line printed is
one JSON object. Not a test: the figures depend on the machine.
"""
import argparse
import ctypes
import datetime
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# The ranks import torch and ckpt; the launcher (this file run as a script)
# only starts them, and spares itself the imports (seconds of CPU). A rank
# imports this file as "__mp_main__" (multiprocessing's spawn).
if __name__ != "__main__":
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import ckpt.torch as ct
    import ckpt.torch.dcp as ckpt_dcp
    from ckpt import _ckpt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_state as ts  # noqa: E402

TARGET = "model.layers.0.up.weight"  # the tensor whose byte --integrity flips
DCP_THREADS = (1, 2, 4)


# ---- measuring ---------------------------------------------------------------


def cpu_now():
    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return u.ru_utime + u.ru_stime


def timed(fn, cpu=None):
    """Seconds of fn on the slowest rank (every rank starts together); the
    CPU seconds (user + system) of all ranks' processes go to cpu.append."""
    dist.barrier()
    c0 = cpu_now()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    t = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(sum_over_ranks(cpu_now() - c0))
    return max_over_ranks(t)


def max_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def sum_over_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t)


def proc_io():
    with open("/proc/self/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines() if line)
    return int(d["rchar"])


def proc_status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def remove(path):
    """Removes a checkpoint once every rank is done with it."""
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()


def check(sd, ref, what):
    bad = ts.differences(sd, ref)
    nbad = sum_over_ranks(len(bad))
    if nbad:
        raise AssertionError(f"{what}: {int(nbad)} tensors differ from the saved state "
                             f"(rank {dist.get_rank()}: {bad[:3]})")


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the contenders ------------------------------------------------------------


class Job:
    """The state of one process and the operations of every contender."""

    def __init__(self, args, rank):
        self.args, self.rank, self.world = args, rank, args.ranks
        self.hidden, self.layers = ts.dims(args.gib)
        self.model, self.opt = ts.build_fsdp2(self.hidden, self.layers)
        self.sd = self.state_dict()
        ts.fill(self.sd)
        self.ref = ts.snapshot(self.sd)
        self.local_bytes = ts.nbytes(self.sd)
        # A group of this rank alone: ckpt.torch loads through it read
        # independently.
        groups = [dist.new_group([r], backend="gloo") for r in range(self.world)]
        self.alone = groups[rank]
        # DCP recommends a group of its own for async_save's background.
        self.async_pg = dist.new_group(backend="gloo")
        self.root = args.dir
        self.checkpointer = ct.Checkpointer(os.path.join(self.root, "ckpt"))
        self.stagers = {}  # DCP's stagers, kept across saves (their caches with them)
        self.copies = None  # the destination of the limits' copies

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def stateful(self):
        return {"model": self.model, "optim": self.opt}

    def path(self, name, step):
        return os.path.join(self.root, name.replace(" ", "_").replace("=", ""), f"step-{step}")

    # -- save / load --

    def dcp_save(self, path, threads=1):
        dcp.save(self.state_dict(), storage_writer=dcp.FileSystemWriter(path, thread_count=threads))

    def dcp_load(self, path, reader=None):
        sd = self.state_dict()
        dcp.load(sd, storage_reader=reader or dcp.FileSystemReader(path))
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])

    def ckpt_save(self, step):
        self.checkpointer.save(self.stateful(), step)

    def ckpt_load(self, step):
        self.checkpointer.load(self.stateful(), step=step)

    def ckpt_load_independent(self, step):
        ct.load(self.stateful(), os.path.join(self.root, "ckpt"), step=step,
                process_group=self.alone, strict=False)

    def dcpckpt_writer(self, step, pg=None):
        return ckpt_dcp.Writer(os.path.join(self.root, "dcp+ckpt"), step=step, process_group=pg)

    def dcpckpt_save(self, step):
        dcp.save(self.state_dict(), storage_writer=self.dcpckpt_writer(step))

    def dcpckpt_load(self, step):
        self.dcp_load(None, ckpt_dcp.Reader(os.path.join(self.root, "dcp+ckpt"), step=step))

    def torch_file(self, path):
        return os.path.join(path, f"rank{self.rank}.pt")

    def torch_save(self, path):
        os.makedirs(path, exist_ok=True)
        local = {name: ts.box(t)[0] for name, t in ts.leaves(self.sd)}
        with open(self.torch_file(path), "wb") as f:
            torch.save(local, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(path)

    def torch_load(self, path):
        loaded = torch.load(self.torch_file(path), weights_only=True)
        with torch.no_grad():
            for name, t in ts.leaves(self.sd):
                ts.box(t)[0].copy_(loaded[name])

    def raw_save(self, path):
        """The bound of any save of this rank's bytes: one write(2) of each
        local tensor into one file, fsync'd (no format, no checksum)."""
        os.makedirs(path, exist_ok=True)
        fd = os.open(self.torch_file(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _, t in ts.leaves(self.sd):
                os.write(fd, memoryview(ts.bits(ts.box(t)[0]).numpy()))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_path(path)

    def raw_load(self, path):
        """The bound of any load: readinto(2) of each local tensor, in place."""
        with open(self.torch_file(path), "rb", buffering=0) as f:
            for _, t in ts.leaves(self.sd):
                view = memoryview(ts.bits(ts.box(t)[0]).numpy())
                n = 0
                while n < len(view):
                    n += f.readinto(view[n:])

    def save_load(self):
        """name -> (save(step), load(step), remove(step)), in run order."""
        out = {"limit": (lambda s: self.raw_save(self.path("limit", s)),
                         lambda s: self.raw_load(self.path("limit", s)),
                         lambda s: remove(self.path("limit", s)))}
        for tc in DCP_THREADS:
            name = "dcp" if tc == 1 else f"dcp tc={tc}"
            out[name] = (lambda s, n=name, tc=tc: self.dcp_save(self.path(n, s), tc),
                         lambda s, n=name: self.dcp_load(self.path(n, s)),
                         lambda s, n=name: remove(self.path(n, s)))
        ck = os.path.join(self.root, "ckpt")
        out["ckpt.torch"] = (self.ckpt_save, self.ckpt_load,
                             lambda s: remove(os.path.join(ck, f"step-{s:08d}")))
        # Loads a checkpoint that ckpt.torch saves, untimed, just before.
        out["ckpt indep."] = (None, lambda s: self.ckpt_load_independent(500 + s),
                              lambda s: remove(os.path.join(ck, f"step-{500 + s:08d}")))
        out["dcp+ckpt"] = (self.dcpckpt_save, self.dcpckpt_load,
                           lambda s: remove(os.path.join(self.root, "dcp+ckpt", f"step-{s:08d}")))
        out["torch.save"] = (lambda s: self.torch_save(self.path("torch", s)),
                             lambda s: self.torch_load(self.path("torch", s)),
                             lambda s: remove(self.path("torch", s)))
        return out

    # -- async --

    def async_contenders(self):
        """name -> (start(step) -> waitable, verify(step), remove(step))."""
        dcp_path = lambda s: self.path("dcp async", s)  # noqa: E731
        ck = os.path.join(self.root, "ckpt")
        dck = os.path.join(self.root, "dcp+ckpt")

        def dcp_async(s):
            return dcp.async_save(self.state_dict(), storage_writer=dcp.FileSystemWriter(dcp_path(s)),
                                  process_group=self.async_pg)

        def dcp_async_with(kind):
            def start(s):
                from torch.distributed.checkpoint.staging import (BlockingAsyncStager,
                                                                  DefaultStager, StagingOptions)
                if kind not in self.stagers:
                    self.stagers[kind] = (
                        BlockingAsyncStager(cache_staged_state_dict=True) if kind == "cached"
                        else DefaultStager(StagingOptions(use_pinned_memory=False,
                                                          use_shared_memory=False,
                                                          use_async_staging=kind == "bg",
                                                          use_non_blocking_copy=False)))
                return dcp.async_save(self.state_dict(),
                                      storage_writer=dcp.FileSystemWriter(dcp_path(s)),
                                      process_group=self.async_pg, async_stager=self.stagers[kind])
            return start

        def dcpckpt_async(s):
            return dcp.async_save(self.state_dict(), storage_writer=self.dcpckpt_writer(s, self.async_pg),
                                  process_group=self.async_pg)

        def copies():
            """Memory for a copy of each local tensor, allocated and written
            once (a snapshot's staging memory is, after the first save)."""
            if self.copies is None:
                self.copies = {n: torch.empty_like(ts.box(t)[0]) for n, t in ts.leaves(self.sd)}
                for c in self.copies.values():
                    c.fill_(0)
            return self.copies

        def memcpy(s):
            """One copy_ of each local tensor: a snapshot with torch's copy."""
            out = copies()
            for n, t in ts.leaves(self.sd):
                out[n].copy_(ts.box(t)[0])
            return None

        def memcpy_check(s):
            with torch.no_grad():
                for n, t in ts.leaves(self.sd):
                    ts.box(t)[0].copy_(self.copies[n])

        def state_dict_ckpt_copy(s):
            """get_state_dict (as every other async row calls it) and ckpt's
            snapshot copy of each local tensor: the bound of a snapshot
            through DCP's state-dict API."""
            self.state_dict()
            out = copies()
            for n, t in ts.leaves(self.sd):
                _ckpt._copy_for_later(out[n], ts.box(t)[0])
            return None

        return {
            "limit: memcpy": (memcpy, memcpy_check, lambda s: None),
            "limit: state dict + ckpt copy": (state_dict_ckpt_copy, memcpy_check, lambda s: None),
            "dcp.async": (dcp_async, lambda s: self.dcp_load(dcp_path(s)),
                          lambda s: remove(dcp_path(s))),
            "dcp.async cached": (dcp_async_with("cached"), lambda s: self.dcp_load(dcp_path(s)),
                                 lambda s: remove(dcp_path(s))),
            "dcp.async stager": (dcp_async_with("sync"), lambda s: self.dcp_load(dcp_path(s)),
                                 lambda s: remove(dcp_path(s))),
            "dcp.async bg stager": (dcp_async_with("bg"), lambda s: self.dcp_load(dcp_path(s)),
                                    lambda s: remove(dcp_path(s))),
            "ckpt.torch async": (lambda s: self.checkpointer.save_async(self.stateful(), s),
                                 self.ckpt_load, lambda s: remove(os.path.join(ck, f"step-{s:08d}"))),
            "dcp+ckpt async": (dcpckpt_async,
                               lambda s: self.dcp_load(None, ckpt_dcp.Reader(dck, step=s)),
                               lambda s: remove(os.path.join(dck, f"step-{s:08d}"))),
        }


def wait(handle):
    if handle is None:  # a limit's copy: done when it returns
        return
    if hasattr(handle, "upload_completion"):  # AsyncSaveResponse
        handle.upload_completion.result()
    elif hasattr(handle, "wait"):
        handle.wait()
    else:
        handle.result()


def blocked_until_staged(handle):
    if handle is not None and hasattr(handle, "staging_completion"):
        handle.staging_completion.result()


def run_async(job, start, step, modify=True):
    """(blocked s, durable s) on the slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    h = start(step)
    blocked_until_staged(h)
    t_blocked = time.perf_counter() - t0
    if modify:
        ts.scramble(job.sd)  # the training step that follows
    wait(h)
    t_durable = time.perf_counter() - t0
    dist.barrier()
    return max_over_ranks(t_blocked), max_over_ranks(t_durable)


# ---- the `same` job -------------------------------------------------------------


def same_job(rank, args):
    job = Job(args, rank)
    out = {"ranks": job.world, "state_bytes": int(sum_over_ranks(job.local_bytes)),
           "hidden": job.hidden, "layers": job.layers, "tensors": len(job.ref),
           "save_s": {}, "load_s": {}, "save_cpu_s": {}, "load_cpu_s": {}, "async": {},
           "skipped": {}}
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"FSDP2 state: {ts.describe(job.hidden, job.layers)}, "
        f"{ts.fmt_gib(out['state_bytes'])} on {job.world} gloo processes, {args.dir}", flush=True)
    sl = job.save_load()
    ac = job.async_contenders()
    for run in range(args.runs):
        names = list(sl)
        k = run % len(names)
        names = names[k:] + names[:k]
        line = [f"run {run + 1}/{args.runs}:"]
        for name in names:
            save, load, cleanup = sl[name]
            if name in out["skipped"]:
                continue
            try:
                if save is not None:
                    out["save_s"].setdefault(name, []).append(
                        timed(lambda: save(run), out["save_cpu_s"].setdefault(name, [])))
                else:
                    job.ckpt_save(500 + run)
                ts.scramble(job.sd)
                out["load_s"].setdefault(name, []).append(
                    timed(lambda: load(run), out["load_cpu_s"].setdefault(name, [])))
                check(job.sd, job.ref, f"{name} load of run {run}")
            except BaseException as e:  # a peer that fails is reported, not measured
                out["skipped"][name] = f"failed: {one_line(e)}"
                say(f"{name}: failed: {one_line(e)}", flush=True)
                restore(job)
                continue
            cleanup(run)
            line.append(f"{name} {fmt(out['save_s'].get(name))}/{out['load_s'][name][-1]:.2f}")
        say(" ".join(line), flush=True)
        line = ["      async:"]
        anames = list(ac)
        k = run % len(anames)
        for name in anames[k:] + anames[:k]:
            start, verify, cleanup = ac[name]
            if name in out["skipped"]:
                continue
            step = 100 + run
            try:
                if run == 0:  # untimed: the contender's one-time setup
                    run_async(job, start, 99, modify=False)
                    cleanup(99)
                blocked, durable = run_async(job, start, step)
                verify(step)
                check(job.sd, job.ref, f"{name} of run {run}")
            except BaseException as e:  # CheckpointException is one
                out["skipped"][name] = f"failed: {one_line(e)}"
                say(f"{name}: failed: {one_line(e)}", flush=True)
                restore(job)
                continue
            cleanup(step)
            a = out["async"].setdefault(name, {"blocked_s": [], "durable_s": []})
            a["blocked_s"].append(blocked)
            a["durable_s"].append(durable)
            line.append(f"{name} {blocked:.2f}/{durable:.2f}")
        say(" ".join(line), flush=True)
    if args.leak_saves:
        out["rss"] = leak_check(job, ac, args.leak_saves, out["skipped"], say)
    if args.integrity:
        out["integrity"] = integrity(job, args, say)
    if args.keep:
        keep(job, args.keep)
    job.checkpointer.close()
    for stager in job.stagers.values():
        stager.close()
    return out


def one_line(e: BaseException) -> str:
    """The error's type and message; of a CheckpointException, the last
    line of the first failing rank's traceback (the error itself)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return f"{type(e).__name__}: {last}" if len(lines) <= 1 else f"{type(e).__name__}: ... {last}"


def restore(job):
    with torch.no_grad():
        for name, t in ts.leaves(job.sd):
            ts.box(t)[0].copy_(job.ref[name])


def fmt(v):
    return f"{v[-1]:.2f}" if v else "-"


def leak_check(job, ac, n, skipped, say):
    out = {}
    for name, (start, _, cleanup) in ac.items():
        if name in skipped or name.startswith("limit"):
            continue
        # What the contender before left freed but mapped is returned first,
        # so that it does not count as this one's.
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        dist.barrier()
        before = proc_status("VmRSS")
        reset_peak_rss()
        after_first = None
        for i in range(n):
            step = 1000 + i
            run_async(job, start, step, modify=False)
            cleanup(step)
            if i == 0:
                after_first = proc_status("VmRSS")
        after_last = proc_status("VmRSS")
        peak = proc_status("VmHWM")
        r = {k: int(sum_over_ranks(v)) for k, v in (("before", before), ("after_first", after_first),
                                                     ("after_last", after_last), ("peak", peak))}
        r["saves"] = n
        out[name] = r
        say(f"  {name}: {n} async saves, RSS (sum of ranks) {r['before'] / 2**20:.0f} MiB before, "
            f"{r['after_first'] / 2**20:.0f} after the first, {r['after_last'] / 2**20:.0f} after the "
            f"last; peak {r['peak'] / 2**20:.0f} MiB", flush=True)
    return out


# ---- integrity --------------------------------------------------------------------


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def dcp_location(path):
    """(file, offset) in the middle of rank 0's piece of TARGET in a
    FileSystemWriter checkpoint (its metadata's storage_data)."""
    md = dcp.FileSystemReader(path).read_metadata()
    for idx, info in md.storage_data.items():
        if idx.fqn == TARGET and all(o == 0 for o in idx.offset):
            return os.path.join(path, info.relative_path), info.offset + info.length // 2
    raise LookupError(f"{path}: no stored piece of {TARGET} at offset 0")


def ckpt_location(path, bin_dir):
    """(file, offset) in the middle of the stored chunk of TARGET at offset 0
    of a ckpt checkpoint (ckpt-inspect --json --entry)."""
    tool = os.path.join(bin_dir, "ckpt-inspect")
    doc = json.loads(subprocess.run([tool, "--json", "--entry", TARGET, path], check=True,
                                    capture_output=True, text=True).stdout)
    for entry in doc["entries"]:
        for c in entry.get("chunk_map", []):
            if all(o == 0 for o in c["box"]["offset"]):
                return (os.path.join(doc["path"], f"shard-{c['shard']:05d}.ckpt"),
                        c["data_offset"] + c["stored_length"] // 2)
    raise LookupError(f"{path}: no chunk of {TARGET} at offset 0")


def torch_location(path):
    """(file, offset) in the middle of TARGET's storage in rank 0's
    torch.save file (storages are numbered in the order pickle meets them:
    the order of the saved dict)."""
    import zipfile
    f = os.path.join(path, "rank0.pt")
    names = [n for n, _ in ts.leaves(torch.load(f, weights_only=True, mmap=True))]
    key = str(names.index(TARGET))
    with zipfile.ZipFile(f) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"/data/{key}"))
    with open(f, "rb") as fh:
        fh.seek(info.header_offset + 26)
        n, m = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
    return f, info.header_offset + 30 + n + m + info.file_size // 2


def classify(job, err, place_words):
    """What a load of a corrupted checkpoint did, the same on every rank."""
    bad = [] if err is not None else ts.differences(job.sd, job.ref)
    rows = [None] * job.world
    dist.all_gather_object(rows, {"error": err, "bad": bad})
    errors = [r["error"] for r in rows if r["error"]]
    wrong = sorted({b for r in rows for b in r["bad"]})
    if errors:
        # DCP's CheckpointException carries each rank's traceback: its last
        # line is the error.
        msg = [line for line in errors[0].splitlines() if line.strip()][-1]
        if msg != errors[0].splitlines()[0]:
            msg = errors[0].splitlines()[0] + " ... " + msg
        named = [w for w in place_words if w and w in msg]
        return {"outcome": "error naming the place" if named else "error without the place",
                "message": msg[:400], "names": named}
    if wrong:
        return {"outcome": "loaded wrong values silently", "wrong_tensors": wrong}
    return {"outcome": "loaded correct values (the byte was not read)"}


def integrity(job, args, say):
    """Each contender's checkpoint with one byte of TARGET flipped, loaded."""
    out = {}
    base = os.path.join(job.root, "integrity")
    ck = os.path.join(base, "ckpt")
    dck = os.path.join(base, "dcp+ckpt")
    cases = {
        "dcp": (lambda: job.dcp_save(os.path.join(base, "dcp")),
                lambda: dcp_location(os.path.join(base, "dcp")),
                lambda: job.dcp_load(os.path.join(base, "dcp"))),
        "ckpt.torch": (lambda: ct.save(job.stateful(), ck, 1),
                       lambda: ckpt_location(os.path.join(ck, "step-00000001"), args.bin),
                       lambda: ct.load(job.stateful(), ck, step=1)),
        "dcp+ckpt": (lambda: dcp.save(job.state_dict(), storage_writer=ckpt_dcp.Writer(dck, step=1)),
                     lambda: ckpt_location(os.path.join(dck, "step-00000001"), args.bin),
                     lambda: job.dcp_load(None, ckpt_dcp.Reader(dck, step=1))),
        "torch.save": (lambda: job.torch_save(os.path.join(base, "torch")),
                       lambda: torch_location(os.path.join(base, "torch")),
                       lambda: job.torch_load(os.path.join(base, "torch"))),
    }
    for name, (save, locate, load) in cases.items():
        save()
        dist.barrier()
        where = [None]
        if job.rank == 0:
            where = [locate()]
            flip(*where[0])
        dist.broadcast_object_list(where, src=0)
        ts.scramble(job.sd)
        err = None
        try:
            load()
        except BaseException as e:  # what we are after (CheckpointException is one)
            err = f"{type(e).__name__}: {e}"
        file, offset = where[0]
        r = classify(job, err, [TARGET, os.path.basename(file)])
        r.update(file=os.path.relpath(file, base), offset=offset, tensor=TARGET)
        out[name] = r
        say(f"  integrity {name}: byte {offset} of {r['file']} flipped: {r['outcome']}"
            + (f" ({r['message'][:160]})" if "message" in r else ""), flush=True)
        restore(job)
    remove(base)
    return out


# ---- keep: the checkpoints of `reshard` and single.py's consolidation -------------


def keep(job, d):
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    job.dcp_save(os.path.join(d, "dcp"))
    ct.save(job.stateful(), os.path.join(d, "ckpt"), 1)
    msd = job.state_dict()["model"]
    ct.save(msd, os.path.join(d, "ckpt-model"), 1)
    dcp.save(msd, storage_writer=HuggingFaceStorageWriter(os.path.join(d, "hf"), save_distributed=True))
    dist.barrier()
    if job.rank == 0:
        with open(os.path.join(d, "kept.json"), "w") as f:
            json.dump({"ranks": job.world, "gib": job.args.gib, "hidden": job.hidden,
                       "layers": job.layers, "ckpt_step": 1}, f)


# ---- the `reshard` job -------------------------------------------------------------


def tp_layout(sd, world):
    """sd with every 2-d DTensor as a zeroed DTensor Shard(1) and every 1-d
    one Shard(0) over a 1-d mesh of the job's processes; other values as
    they are."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    mesh = init_device_mesh("cpu", (world,))

    def conv(v):
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, torch.Tensor) and hasattr(v, "to_local"):
            pl = [Shard(1) if v.dim() >= 2 else Shard(0)]
            shape, _ = compute_local_shape_and_global_offset(v.shape, mesh, pl)
            local = torch.zeros(shape, dtype=v.dtype)
            return DTensor.from_local(local, mesh, pl, run_check=False, shape=v.shape,
                                      stride=v.stride())
        if isinstance(v, torch.Tensor):
            return torch.zeros_like(v)
        return v
    return conv(sd)


def reshard_job(rank, args):
    kept = json.load(open(os.path.join(args.src, "kept.json")))
    hidden, layers = kept["hidden"], kept["layers"]
    model, opt = ts.build_fsdp2(hidden, layers)
    groups = [dist.new_group([r], backend="gloo") for r in range(args.ranks)]
    alone = groups[rank]
    msd, osd = get_state_dict(model, opt)
    fsdp_sd = {"model": msd, "optim": osd}
    tp_sd = tp_layout(fsdp_sd, args.ranks)
    layouts = {"fsdp2": fsdp_sd, "tp": tp_sd}
    refs = {k: ts.expected(v) for k, v in layouts.items()}
    dcp_path = os.path.join(args.src, "dcp")
    ck = os.path.join(args.src, "ckpt")
    sizes = {"dcp": dir_bytes(dcp_path), "ckpt": dir_bytes(os.path.join(ck, "step-00000001"))}

    def loads(layout):
        sd = layouts[layout]
        if layout == "fsdp2":
            def dcp_load():
                m, o = get_state_dict(model, opt)
                s = {"model": m, "optim": o}
                dcp.load(s, storage_reader=dcp.FileSystemReader(dcp_path))
                set_state_dict(model, opt, model_state_dict=s["model"], optim_state_dict=s["optim"])
            stateful = {"model": model, "optim": opt}
            return {"dcp": dcp_load,
                    "ckpt.torch": lambda: ct.load(stateful, ck, step=1),
                    "ckpt indep.": lambda: ct.load(stateful, ck, step=1, process_group=alone,
                                                   strict=False)}
        return {"dcp": lambda: dcp.load(sd, storage_reader=dcp.FileSystemReader(dcp_path)),
                "ckpt.torch": lambda: ct.load(sd, ck, step=1),
                "ckpt indep.": lambda: ct.load(sd, ck, step=1, process_group=alone, strict=False)}

    out = {"ranks": args.ranks, "from_ranks": kept["ranks"], "checkpoint_bytes": sizes,
           "layouts": {}, "skipped": {}}
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"resharded load: saved on {kept['ranks']}, loaded on {args.ranks} processes "
        f"(dcp {sizes['dcp'] / 2**20:.0f} MiB, ckpt {sizes['ckpt'] / 2**20:.0f} MiB)", flush=True)
    for run in range(args.runs):
        line = [f"run {run + 1}/{args.runs}:"]
        for layout in layouts:
            fns = loads(layout)
            names = list(fns)
            k = run % len(names)
            for name in names[k:] + names[:k]:
                key = f"{layout} {name}"
                if key in out["skipped"]:
                    continue
                ts.scramble(layouts[layout])
                reports, cpu = [], []
                r0 = proc_io()
                try:
                    t = timed(lambda: reports.append(fns[name]()), cpu)
                    rchar = sum_over_ranks(proc_io() - r0)
                    if layout == "fsdp2":
                        m, o = get_state_dict(model, opt)
                        check({"model": m, "optim": o}, refs[layout], f"{key} run {run}")
                    else:
                        check(layouts[layout], refs[layout], f"{key} run {run}")
                except BaseException as e:  # CheckpointException is one
                    out["skipped"][key] = f"failed: {one_line(e)}"
                    say(f"{key}: failed: {one_line(e)}", flush=True)
                    continue
                rep = reports[0] if reports else None
                counted = sum_over_ranks(rep.bytes_read) if rep is not None else None
                e = out["layouts"].setdefault(layout, {}).setdefault(
                    name, {"load_s": [], "load_cpu_s": [], "rchar_bytes": [], "ckpt_bytes_read": []})
                e["load_s"].append(t)
                e["load_cpu_s"].append(cpu[0])
                e["rchar_bytes"].append(int(rchar))
                if counted is not None:
                    e["ckpt_bytes_read"].append(int(counted))
                line.append(f"{layout} {name} {t:.2f} ({rchar / 2**20:.0f} MiB)")
        say(" ".join(line), flush=True)
    return out


# ---- processes ---------------------------------------------------------------------


def worker(rank, args, init, result_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=args.timeout))
    out = same_job(rank, args) if args.mode == "same" else reshard_job(rank, args)
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(out, f)
    # torch 2.13's gloo teardown can race: end with a barrier and exit.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def launch(args, init, result):
    """Runs the ranks as spawned processes; when one fails (its traceback
    goes to stderr), ends the others and raises."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(r, args, init, result)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    try:
        while True:
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"rank {failed[0]} exited with status "
                                   f"{procs[failed[0]].exitcode}")
            running = [p.sentinel for p in procs if p.exitcode is None]
            if not running:
                return
            multiprocessing.connection.wait(running)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join()


def summary(out):
    def s(v):
        return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
    lines = []
    for name in out.get("load_s", {}):
        sv = out["save_s"].get(name)
        lines.append(f"  {name:17s} save {s(sv) if sv else '-':24s} load {s(out['load_s'][name])}")
    for name, a in out.get("async", {}).items():
        lines.append(f"  {name:17s} blocked {s(a['blocked_s']):21s} durable {s(a['durable_s'])}")
    for layout, by in out.get("layouts", {}).items():
        for name, e in by.items():
            lines.append(f"  {layout} {name:12s} load {s(e['load_s'])}  "
                         f"read {statistics.median(e['rchar_bytes']) / 2**20:.0f} MiB")
    for name, why in out.get("skipped", {}).items():
        lines.append(f"  {name}: skipped ({why})")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("same", "reshard"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default="/dev/shm/ckpt-fsdp2")
    p.add_argument("--keep", help="same: save the checkpoints of reshard and consolidation here")
    p.add_argument("--src", help="reshard: a --keep directory")
    p.add_argument("--leak-saves", type=int, default=0)
    p.add_argument("--integrity", action="store_true")
    p.add_argument("--bin", default="build/bin", help="where ckpt-inspect is (--integrity)")
    p.add_argument("--timeout", type=float, default=600, help="gloo timeout, s")
    args = p.parse_args()
    if args.mode == "reshard" and not args.src:
        p.error("reshard needs --src")
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        os.makedirs(args.keep)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "result.json")
            launch(args, f"file://{tmp}/store", result)
            with open(result) as f:
                out = json.load(f)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    print(summary(out))
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
