"""ckpt as a storage of torch.distributed.checkpoint (ckpt.torch.dcp): DCP's
save, async_save and load of FSDP2 (DTensor) state with AdamW, on processes
forked by torch.multiprocessing over gloo (a forked rank inherits the
imported torch: test_training.py; this process forks before it runs any
job of its own and never initialises torch.distributed), written and read as ckpt
checkpoints that every ckpt tool reads; DCP's own FileSystemWriter beside
it, untouched; the errors that name the path and the entry."""
import json
import os
import shutil
import subprocess
import warnings

import pytest

from conftest import require, tool

torch = require("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import ckpt  # noqa: E402
import ckpt.torch.dcp as ckdcp  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STEPS = 2  # training steps before the save


# --- the job: a small model sharded with FSDP2, AdamW ---------------------------

class Job:
    """One rank's model (FSDP2 over `world` ranks, or plain with world 0),
    optimizer and data. seed picks the initial weights; data are per rank."""

    def __init__(self, rank, world, seed=0):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        m.register_buffer("scale", torch.randn(4).bfloat16())  # replicated, bfloat16
        if world:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            for layer in (m[0], m[2]):  # rows 5 and 3: uneven shards on 2 and 3 ranks
                fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
        self.model = m
        self.opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        self.data = torch.Generator().manual_seed(100 + rank)

    def step(self) -> float:
        x = torch.randn(4, 8, generator=self.data)
        loss = self.model(x).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.item()

    def state(self):
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim, "extra": {"epoch": 3, "note": "dcp"}}

    def restore(self, state):
        set_state_dict(self.model, self.opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def full(value, prefix=""):
    """{flattened name: whole value}: DTensors gathered (collective), tensors
    cloned to the CPU, other values as they are."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(full(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(full(v, f"{prefix}{i}."))
        return out
    if isinstance(value, DTensor):
        value = value.full_tensor()
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().clone()
    return {prefix[:-1]: value}


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def mismatches(got, want):
    """Names whose values differ bit for bit (or are missing on one side)."""
    out = sorted(set(got) ^ set(want))
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                    and a.dtype == b.dtype and a.shape == b.shape
                    and torch.equal(bits(a), bits(b)))
        else:
            same = a == b
        if not same:
            out.append(name)
    return out


def load_and_compare(job, reader, want):
    """Loads through DCP with `reader` into `job`; its mismatches with `want`."""
    state = job.state()
    dcp.load(state, storage_reader=reader)
    job.restore(state)
    return mismatches(full(job.state()), want)


class GatedWriter(ckdcp.Writer):
    """ckpt's Writer whose write_data (on DCP's thread) waits for `gate`: the
    trainer's steps certainly run before anything is written."""

    def __init__(self, *args, gate, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def write_data(self, plan, planner):
        assert self.gate.wait(60)
        return super().write_data(plan, planner)


class UnstagedWriter(GatedWriter):
    """Control: a writer that stages nothing saves the live tensors."""

    def stage(self, state_dict):
        return state_dict


class FailOnRank1(dcp.DefaultSavePlanner):
    """Resolves nothing on rank 1: write_data fails there only."""

    def resolve_data(self, item):
        if dist.get_rank() == 1:
            raise ckpt.InvalidArgumentError(f"entry '{item.index.fqn}': refused on rank 1")
        return super().resolve_data(item)


def async_save_while_training(job, root, pg, writer_class):
    """async_save with `writer_class`, two training steps before DCP's thread
    may write; the losses."""
    import threading
    gate = threading.Event()
    writer = writer_class(root, step=STEPS, process_group=pg, gate=gate)
    future = dcp.async_save(job.state(), storage_writer=writer, process_group=pg)
    losses = [job.step() for _ in range(2)]
    gate.set()
    future.result()
    return losses


# --- the forked ranks -----------------------------------------------------------

def _init(rank, world, store):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)


def _finish(out, rank, results):
    with open(os.path.join(out, f"results-{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    os._exit(0)  # as training.py: no teardown of gloo and FSDP at exit


def save_job(rank, world, store, out):
    """Trains, saves the state with ckpt's Writer twice (roots a, b) and with
    FileSystemWriter (fs), loads a and fs back into fresh jobs, then
    async_saves (root c) and trains on while it writes; rank 0 keeps the
    state at the save (ref.pt)."""
    _init(rank, world, store)
    job = Job(rank, world)
    for _ in range(STEPS):
        job.step()
    state = job.state()
    ref = full(state)
    if rank == 0:
        torch.save(ref, os.path.join(out, "ref.pt"))
    writer = ckdcp.Writer(os.path.join(out, "a"), step=STEPS)
    returned = dcp.save(state, storage_writer=writer)
    registered_again = registrations_of(lambda: dcp.save(
        state, storage_writer=ckdcp.Writer(os.path.join(out, "b"), step=STEPS)))
    fs_returned = dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(out, "fs")))
    results = {"control_fresh": mismatches(full(Job(rank, world, seed=1).state()), ref),
               "registered_again": registered_again,
               "items_to_dcp": len(writer.prepare_local_plan(writer._local).items),
               "items_kept": len(writer._local.items),
               "metadata": [metadata_summary(returned), metadata_summary(fs_returned)]}
    results["ckpt"] = load_and_compare(Job(rank, world, seed=1),
                                       ckdcp.Reader(os.path.join(out, "a")), ref)
    results["fs"] = load_and_compare(Job(rank, world, seed=1),
                                     dcp.FileSystemReader(os.path.join(out, "fs")), ref)

    results["resolver"] = resolver_differences(state)

    # A rank failing in write_data fails the save on every rank; none hangs.
    try:
        dcp.save(state, storage_writer=ckdcp.Writer(os.path.join(out, "failed")),
                 planner=FailOnRank1())
        results["failed_save"] = "no error"
    except CheckpointException as e:
        results["failed_save"] = str(e)

    # async_save over a group of its own (DCP's thread uses it meanwhile).
    pg = dist.new_group(backend="gloo")
    results["losses_while_writing"] = async_save_while_training(
        job, os.path.join(out, "c"), pg, GatedWriter)
    after = full(job.state())
    results["async_control"] = mismatches(after, ref)
    results["async"] = load_and_compare(Job(rank, world, seed=1),
                                        ckdcp.Reader(os.path.join(out, "c")), ref)
    # Control: without ckpt's staging the checkpoint holds the later values.
    async_save_while_training(job, os.path.join(out, "d"), pg, UnstagedWriter)
    results["unstaged"] = load_and_compare(Job(rank, world, seed=1),
                                           ckdcp.Reader(os.path.join(out, "d")), after)
    results["staged_metadata"] = staged_metadata(job, os.path.join(out, "e"), pg, rank)
    _finish(out, rank, results)


def staged_metadata(job, root, pg, rank):
    """Four async_saves, rank 1 adding a key at the third: what each of this
    rank's stage() exchanges sent of the metadata ("meta": its part,
    "meta_token": the token of the last document), and the flattening map
    each checkpoint holds."""
    sent, real = [], ckdcp._exchange

    def spy(comm, info):
        sent.append([k for k in ("meta", "meta_token") if k in info])
        return real(comm, info)
    ckdcp._docs.clear()
    ckdcp._exchange = spy
    keys = []
    try:
        for step in range(1, 5):
            state = job.state()
            if step >= 3 and rank == 1:
                state["rank1_only"] = torch.ones(2)
            writer = ckdcp.Writer(root, step=step, process_group=pg)
            dcp.async_save(state, storage_writer=writer, process_group=pg).result()
            keys.append(sorted(ckdcp.Reader(root, step=step).read_metadata().planner_data))
    finally:
        ckdcp._exchange = real
    return {"sent": sent, "keys": keys}


def metadata_summary(md):
    """What dcp.save's returned Metadata says of each entry: its kind, and a
    tensor's size, dtype and chunks; the flattening map."""
    out = {}
    for fqn, m in md.state_dict_metadata.items():
        if hasattr(m, "chunks"):
            out[fqn] = [list(m.size), str(m.properties.dtype),
                        sorted([list(c.offsets), list(c.sizes)] for c in m.chunks)]
        else:
            out[fqn] = "bytes"
    return {"entries": out, "planner_data": {k: list(v) for k, v in md.planner_data.items()}}


def registrations_of(save):
    """The names save() registers with the group's ckpt Writer."""
    from ckpt.torch import _save
    names, real = [], _save._KeptWriter.add_tensor
    _save._KeptWriter.add_tensor = lambda w, name, *a, **k: (names.append(name),
                                                             real(w, name, *a, **k))[1]
    try:
        save()
    finally:
        _save._KeptWriter.add_tensor = real
    return names


def resolver_differences(state):
    """Where the Writer's resolver (dcp._resolver, which skips
    DefaultSavePlanner.resolve_data's to_local()) gives another tensor than
    resolve_data does, for every write item of this rank's DTensor state;
    and whether a planner overriding resolve_data keeps its own."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=dist.get_rank() == 0)
    resolve, out, dtensors = ckdcp._resolver(planner), [], 0
    for item in planner.create_local_plan().items:
        want, got = planner.resolve_data(item), resolve(item)
        if isinstance(want, torch.Tensor):
            dtensors += hasattr(planner.state_dict[item.index.fqn], "device_mesh")
            if (got.data_ptr(), got.shape, got.stride(), got.dtype) != (
                    want.data_ptr(), want.shape, want.stride(), want.dtype):
                out.append(item.index.fqn)
        elif got.getvalue() != want.getvalue():
            out.append(item.index.fqn)
    own = FailOnRank1()
    if ckdcp._resolver(own) != own.resolve_data:
        out.append("FailOnRank1 lost its resolve_data")
    return {"differ": out, "dtensors": dtensors}


def load_job(rank, world, store, out, root):
    """Fresh ranks load `root` and compare with ref.pt."""
    _init(rank, world, store)
    ref = torch.load(os.path.join(out, "ref.pt"))
    _finish(out, rank, {"ckpt": load_and_compare(Job(rank, world, seed=1),
                                                 ckdcp.Reader(root), ref)})


def spawn(fn, world, tmp, *args):
    store = os.path.join(tmp, f"store-{fn.__name__}-{world}")
    torch.multiprocessing.start_processes(fn, args=(world, store) + args, nprocs=world,
                                          join=True, start_method="fork")
    results = []
    for rank in range(world):
        with open(os.path.join(args[0], f"results-{rank}.json")) as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The 2-rank job's directories and each rank's results."""
    tmp = str(tmp_path_factory.mktemp("dcp"))
    out = os.path.join(tmp, "out")
    os.mkdir(out)
    results = spawn(save_job, 2, tmp, out)
    return {"tmp": tmp, "out": out, "results": results,
            "ref": torch.load(os.path.join(out, "ref.pt"))}


def run(*argv):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True)


# --- tests ----------------------------------------------------------------------

def test_fsdp2_state_round_trips_bit_exactly_on_2_ranks(saved):
    for r in saved["results"]:
        assert r["control_fresh"], "control: a fresh job differs from the saved state"
        assert r["ckpt"] == []
    ref = saved["ref"]
    assert any(n.startswith("optim.state.") and n.endswith("exp_avg_sq") for n in ref)
    # What DCP wrote is a ckpt checkpoint: entries are DCP's FQNs, DTensor
    # shards are chunks of the global tensor, bytes items are objects.
    r = ckpt.Reader(os.path.join(saved["out"], "a"))
    assert r.step == STEPS and r.world_size == 2
    w = r.find("model.0.weight")
    assert w.shape == (5, 8) and {s for _, s in w.chunks} == {0, 1}
    assert [c.size for c, _ in w.chunks] == [(3, 8), (2, 8)]  # Shard(0) of 5 rows
    assert r.find("model.scale").dtype == ckpt.bfloat16 and len(r.find("model.scale").chunks) == 1
    assert r.find("extra.epoch").kind == "object"
    assert r.find("optim.param_groups.0.lr").kind == "object"


def test_stage_sends_a_token_for_the_metadata_while_every_part_stays(saved):
    """async_save's stage() all-gathers every rank's part of the metadata
    document (tens of KB each) only when a part changed: while every rank's
    part is the one it gave the last document, the ranks send its token;
    when one rank's part changes (rank 1 adds a key), the others' parts are
    exchanged again and the checkpoint's document holds the change."""
    r0, r1 = (r["staged_metadata"] for r in saved["results"])
    assert r0["sent"] == [["meta"], ["meta_token"], ["meta_token"], ["meta"], ["meta_token"]]
    assert r1["sent"] == [["meta"], ["meta_token"], ["meta"], ["meta"], ["meta_token"]]
    for keys in (r0["keys"], r1["keys"]):
        assert "rank1_only" not in keys[0] and keys[0] == keys[1]
        assert keys[2] == keys[3] == sorted(keys[0] + ["rank1_only"])


def test_dcp_plans_without_the_items_and_save_returns_the_full_metadata(saved):
    """Under DefaultSavePlanner the Writer hands DCP's pickled gather and
    scatter its plans without their items (dcp._local_items), and keeps
    them; dcp.save still returns the Metadata FileSystemWriter's save does
    (the entries, their sizes, dtypes and chunks, the flattening map)."""
    for r in saved["results"]:
        assert r["items_to_dcp"] == 0 and r["items_kept"] > 10
        ours, fs = r["metadata"]
        assert ours == fs
        assert len(ours["entries"]) > 10 and ours["planner_data"]


def test_loads_on_1_process_and_on_3_ranks(saved, tmp_path):
    ref, a = saved["ref"], os.path.join(saved["out"], "a")
    # Three ranks: 5 and 3 rows split 2+2+1 and 1+1+1, read from 3+2 and 2+1
    # (first: forked before this process runs a job).
    out3 = str(tmp_path / "out3")
    os.mkdir(out3)
    shutil.copy(os.path.join(saved["out"], "ref.pt"), out3)
    for result in spawn(load_job, 3, str(tmp_path), out3, a):
        assert result["ckpt"] == []
    # One process, no process group: a plain model takes the whole tensors.
    assert load_and_compare(Job(0, 0, seed=1), ckdcp.Reader(a), ref) == []
    job = Job(0, 0, seed=1)
    load_and_compare(job, ckdcp.Reader(a), ref)
    with torch.no_grad():
        job.model[0].weight[4, 7] += 1  # control: one element off is caught
    assert mismatches(full(job.state()), ref) == ["model.0.weight"]


def test_a_rank_failing_in_write_data_fails_the_save_on_every_rank(saved):
    for r in saved["results"]:
        assert "rank 1 failed" in r["failed_save"] and "refused on rank 1" in r["failed_save"]
    assert not os.path.exists(os.path.join(saved["out"], "failed", "latest"))


def test_every_tool_reads_the_dcp_save(saved, tmp_path):
    a, b, c = (os.path.join(saved["out"], x) for x in "abc")
    v = run(tool("ckpt-validate"), a)
    assert v.returncode == 0 and "VALID" in v.stdout, v.stdout + v.stderr
    inspect = run(tool("ckpt-inspect"), a)
    assert inspect.returncode == 0
    for name in ("model.0.weight", "optim.state.2.bias.exp_avg", "extra.note"):
        assert name in inspect.stdout
    diff = run(tool("ckpt-diff"), a, b)
    assert diff.returncode == 0 and "equal" in diff.stdout, diff.stdout + diff.stderr
    # b, the second save of the same state by the group's Writer, kept every
    # registration of a's (ckpt.torch._registry) and holds the same values.
    assert [r["registered_again"] for r in saved["results"]] == [[], []]
    one = tmp_path / "one"
    rs = run(tool("ckpt-reshard"), a, one, "--from", "2", "--to", "1")
    assert rs.returncode == 0, rs.stdout + rs.stderr
    assert ckpt.Reader(str(one)).world_size == 1
    assert run(tool("ckpt-diff"), a, one).returncode == 0
    assert load_and_compare(Job(0, 0, seed=1), ckdcp.Reader(str(one)), saved["ref"]) == []
    # Control: a flipped byte of a tensor in a copy is found.
    bad = tmp_path / "bad"
    shutil.copytree(a, bad)
    shard = bad / f"step-{STEPS:08d}" / "shard-00000.ckpt"
    data = bytearray(shard.read_bytes())
    at = data.find(saved["ref"]["model.0.weight"][0].numpy().tobytes())  # rank 0's first row
    assert at > 0
    data[at] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert run(tool("ckpt-validate"), bad).returncode == 1


def test_writer_resolves_the_tensors_resolve_data_gives(saved):
    for r in saved["results"]:
        assert r["resolver"]["differ"] == []
        assert r["resolver"]["dtensors"] > 0


def test_async_save_holds_the_values_at_the_call(saved):
    for r in saved["results"]:
        assert len(r["losses_while_writing"]) == 2
        assert r["async_control"], "control: the steps after the call changed the state"
        assert r["async"] == []
        # Control: a writer that does not stage saves the values after the
        # steps, not those at its call.
        assert r["unstaged"] and "model.0.weight" in r["unstaged"]
    diff = run(tool("ckpt-diff"), *(os.path.join(saved["out"], x) for x in "ac"))
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_filesystem_writer_is_untouched_and_converts_to_the_same_checkpoint(saved, tmp_path):
    for r in saved["results"]:
        assert r["fs"] == []
    fs, a = os.path.join(saved["out"], "fs"), os.path.join(saved["out"], "a")
    conv = tmp_path / "conv"
    c = run(tool("ckpt-convert"), fs, conv, "--from", "dcp")
    assert c.returncode == 0, c.stdout + c.stderr
    diff = run(tool("ckpt-diff"), conv, a)
    assert diff.returncode == 0 and "equal" in diff.stdout, diff.stdout + diff.stderr
    # DCP's Metadata rebuilt from ckpt's manifest is the one DCP pickled.
    ours = ckdcp.Reader(a).read_metadata()
    theirs = dcp.FileSystemReader(fs).read_metadata()
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.planner_data == theirs.planner_data
    # Control: a later state differs.
    later = tmp_path / "later"
    job = Job(0, 0)
    job.step()
    dcp.save(job.state(), storage_writer=ckdcp.Writer(str(later)))
    assert run(tool("ckpt-diff"), conv, later).returncode == 1


def test_reader_without_checkpoint_names_the_path(saved, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ckpt.NotFoundError, match=str(empty)):
        ckdcp.Reader(empty).read_metadata()
    state = Job(0, 0).state()
    with pytest.raises(CheckpointException, match=str(empty)):
        dcp.load(state, storage_reader=ckdcp.Reader(empty))
    fs = os.path.join(saved["out"], "fs")
    with pytest.raises(ckpt.NotFoundError, match="FileSystemReader.*ckpt-convert --from dcp"):
        ckdcp.Reader(fs).read_metadata()
    assert not ckdcp.Reader.validate_checkpoint_id(fs)
    # Control: the checkpoint itself opens.
    assert ckdcp.Reader.validate_checkpoint_id(os.path.join(saved["out"], "a"))
    assert "model.0.weight" in ckdcp.Reader(os.path.join(saved["out"], "a")) \
        .read_metadata().state_dict_metadata


def test_shape_mismatch_at_load_names_the_entry(saved):
    a = os.path.join(saved["out"], "a")
    state = {"model": {"0.weight": torch.zeros(5, 9)}}
    with pytest.raises(CheckpointException, match=r"model\.0\.weight"):
        dcp.load(state, storage_reader=ckdcp.Reader(a))
    state = {"model": {"0.weight": torch.zeros(5, 8)}}  # control
    dcp.load(state, storage_reader=ckdcp.Reader(a))
    assert torch.equal(state["model"]["0.weight"], saved["ref"]["model.0.weight"])


def test_one_process_round_trip_of_every_leaf_kind(tmp_path):
    src = {"bf": torch.randn(3).bfloat16(), "flag": torch.tensor([True, False]),
           "scalar": torch.tensor(7.0), "t": torch.randn(5, 4).t(), "i64": torch.arange(6),
           "nested": {"list": [torch.ones(2), 5, "x"], "none": None}}
    writer = ckdcp.Writer(tmp_path, step=7)
    dcp.save(src, storage_writer=writer)
    dst = {"bf": torch.zeros(3).bfloat16(), "flag": torch.zeros(2, dtype=torch.bool),
           "scalar": torch.tensor(0.0), "t": torch.zeros(5, 4).t(), "i64": torch.zeros(6).long(),
           "nested": {"list": [torch.zeros(2), 0, ""], "none": 1}}
    dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path))
    assert mismatches(full(dst), full(src)) == []
    assert ckpt.Reader(str(tmp_path)).step == 7
    # A committed step is not replaced unless asked; another step is free.
    with pytest.raises(CheckpointException, match="step-00000007: a checkpoint of step 7"):
        dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=7))
    dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=7, overwrite=True))
    dcp.save(src, checkpoint_id=tmp_path, storage_writer=ckdcp.Writer("elsewhere", step=8))
    assert ckpt.Reader(str(tmp_path)).step == 8
    # async_save: stage() refuses a committed step at once, on the caller's thread.
    with pytest.raises(ckpt.AlreadyExistsError, match="step-00000008"):
        dcp.async_save(src, storage_writer=ckdcp.Writer(tmp_path, step=8))
    dcp.async_save(src, storage_writer=ckdcp.Writer(tmp_path, step=9)).result()
    reader = ckdcp.Reader(tmp_path)  # one Reader, two loads: `latest` followed anew
    assert reader.read_metadata().storage_meta.checkpoint_id.endswith("step-00000009")
    dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=10))
    assert reader.read_metadata().storage_meta.checkpoint_id.endswith("step-00000010")
    with pytest.raises(ckpt.UnimplementedError, match="use_collectives=False"):
        dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=11), use_collectives=False)


def test_metadata_json_is_cut_to_fit_and_checked():
    doc = {"version": 1, "properties": {},
           "planner_data": {f"layers.{i}.w": ["layers", f"{i}.w"] for i in range(30000)}}
    pairs = ckdcp._encode_metadata(doc)
    assert len(pairs) > 1 and all(len(v.encode()) <= 1 << 20 for v in pairs.values())
    assert ckdcp._decode_metadata(list(pairs.items())) == doc
    del pairs[f"{ckdcp.METADATA_KEY}.part1"]  # control: a lost part is found
    with pytest.raises(ckpt.DataLossError, match="ckpt.torch.dcp.*not JSON"):
        ckdcp._decode_metadata(list(pairs.items()))
    assert ckdcp._decode_metadata([("other", "x")]) is None


def test_a_checkpoint_of_ckpt_torch_save_loads_through_dcp(tmp_path):
    import ckpt.torch as ct
    src = {"w": torch.randn(4, 3), "flat": ct.Chunk(torch.arange(6.0), (2, 3), flat_start=0),
           "cfg": {"lr": 0.5, "name": "run"}}
    ct.save(src, str(tmp_path), 3)
    md = ckdcp.Reader(tmp_path).read_metadata()
    assert md.state_dict_metadata["flat"].chunks[0].sizes == torch.Size([2, 3])  # flat: one box
    dst = {"w": torch.zeros(4, 3), "flat": torch.zeros(2, 3), "cfg": {"lr": 0.0, "name": ""}}
    dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path))
    assert torch.equal(dst["w"], src["w"]) and dst["cfg"] == {"lr": 0.5, "name": "run"}
    assert torch.equal(dst["flat"], torch.arange(6.0).reshape(2, 3))
    with pytest.raises(CheckpointException, match="Size mismatch.*for w"):  # control
        dcp.load({"w": torch.zeros(3, 4)}, storage_reader=ckdcp.Reader(tmp_path))


def test_async_save_whose_staged_save_commits_before_dcp_plans_succeeds(tmp_path):
    """dcp.async_save: stage() starts ckpt's save, then DCP plans on its own
    thread. When ckpt commits first (a small state, one process), DCP's
    planning must not refuse the step as taken: it is this save's own.
    The writer below waits for the commit before DCP's global plan, which
    made this race certain; it failed with 'a checkpoint of step 5 exists'."""
    class CommitsFirst(ckdcp.Writer):
        def prepare_global_plan(self, plans):
            self._staged.handle.wait()
            return super().prepare_global_plan(plans)
    src = {"w": torch.randn(3, 2)}
    dcp.async_save(src, storage_writer=CommitsFirst(tmp_path, step=5)).result()
    dst = {"w": torch.zeros(3, 2)}
    dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path))
    assert torch.equal(dst["w"], src["w"])
    # Control: a plain save of a committed step is still refused.
    with pytest.raises(CheckpointException, match="a checkpoint of step 5 exists"):
        dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=5))


def test_async_save_reuses_its_local_plan_while_the_structure_stays(tmp_path, monkeypatch):
    """stage() plans once per structure: the next async_save of a state dict
    of the same FQNs, shapes and dtypes reuses the plan (and saves the new
    values); a changed shape or a new key makes a new plan."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    plans = []
    create = DefaultSavePlanner.create_local_plan

    def counting(self):
        plans.append(1)
        return create(self)
    monkeypatch.setattr(DefaultSavePlanner, "create_local_plan", counting)
    ckdcp._plans.clear()

    def save_and_check(src, step):
        n = len(plans)
        dcp.async_save(src, storage_writer=ckdcp.Writer(tmp_path, step=step)).result()
        dst = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else None)
               for k, v in src.items()}
        dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path, step=step))
        assert mismatches(full(dst), full(src)) == []
        return len(plans) - n  # create_local_plan calls: stage()'s and DCP's own

    src = {"w": torch.randn(4, 3), "b": torch.randn(3).bfloat16(), "cfg": "a"}
    first = save_and_check(src, 1)
    src = {"w": torch.randn(4, 3), "b": torch.randn(3).bfloat16(), "cfg": "b"}
    assert save_and_check(src, 2) == first - 1  # stage() reused its plan
    src = {"w": torch.randn(5, 3), "b": torch.randn(3).bfloat16(), "cfg": "b"}
    assert save_and_check(src, 3) == first  # a shape changed: planned anew
    src = {"w": torch.randn(5, 3), "b": torch.randn(3).bfloat16(), "cfg": "b",
           "new": torch.ones(2)}
    assert save_and_check(src, 4) == first  # a new key
    assert save_and_check(src, 5) == first - 1


class RenamingSavePlanner(dcp.DefaultSavePlanner):
    """A global plan of its own: counts the items it sees."""
    seen = 0

    def create_global_plan(self, all_plans):
        RenamingSavePlanner.seen = sum(len(p.items) for p in all_plans)
        return super().create_global_plan(all_plans)


class CountingLoadPlanner(dcp.DefaultLoadPlanner):
    seen = 0

    def create_global_plan(self, global_plan):
        CountingLoadPlanner.seen = sum(len(p.items) for p in global_plan)
        return super().create_global_plan(global_plan)


def test_a_planner_with_its_own_global_plan_is_refused_unless_the_writer_has_it(tmp_path):
    """DCP plans globally without the items only under a planner whose
    global plan is the default one; one of its own gets the items when it
    is passed to Writer(planner=) / Reader(planner=), and is refused,
    naming that fix, when it is not (it would have planned nothing)."""
    src = {"w": torch.randn(3, 2), "cfg": {"lr": 0.5}}
    planner = RenamingSavePlanner()
    with pytest.raises(CheckpointException, match=r"Writer\(planner=\.\.\.\)"):
        dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=1), planner=planner)
    assert not os.path.exists(tmp_path / "latest")
    RenamingSavePlanner.seen = 0
    dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=1, planner=planner),
             planner=planner)
    assert RenamingSavePlanner.seen == 2
    dst = {"w": torch.zeros(3, 2), "cfg": {"lr": 0.0}}
    with pytest.raises(CheckpointException, match=r"Reader\(planner=\.\.\.\)"):
        dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path), planner=CountingLoadPlanner())
    load_planner = CountingLoadPlanner()
    dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path, planner=load_planner),
             planner=load_planner)
    assert CountingLoadPlanner.seen == 2
    assert torch.equal(dst["w"], src["w"]) and dst["cfg"] == {"lr": 0.5}
    # The default planners: DCP plans with no items, the data arrive all the same.
    dcp.save(src, storage_writer=ckdcp.Writer(tmp_path, step=2))
    dst = {"w": torch.zeros(3, 2), "cfg": {"lr": 0.0}}
    dcp.load(dst, storage_reader=ckdcp.Reader(tmp_path, step=2))
    assert torch.equal(dst["w"], src["w"]) and dst["cfg"] == {"lr": 0.5}
