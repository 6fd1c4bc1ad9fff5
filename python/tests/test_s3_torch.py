"""ckpt.torch on s3:// roots: an FSDP2 training state (fully_shard over
gloo, CPU) saved to S3 on 2 processes and resumed on 3 with every value
exact, `latest` followed and the committed steps listed (Checkpointer)
through the package's storage, against moto's server on loopback
(test_s3.py's fixtures; under ctest the s3 tests' server).

The training jobs are test_torch2.py's, on processes forked from this one.
This process opens no s3:// root before the last job has run: a forked
child must not share the parent's HTTP connections."""
import os

from conftest import require

torch = require("torch")
require("torch.distributed.tensor")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402
from test_s3 import bucket, keys, s3, server  # noqa: E402,F401  (fixtures)
from test_torch2 import K, M, Job, _mismatched, dump, read, run  # noqa: E402


def fsdp_train_and_save(rank, world, root, out):
    """K steps, a save; M more steps, a save in the background."""
    job = Job(world)
    with ct.Checkpointer(root) as ck:
        for _ in range(K):
            job.step()
        ck.save(job.state(), K)
        for _ in range(M):
            job.step()
        handle = ck.save_async(job.state(), K + M)
        full = job.full()
        handle.wait()
    if rank == 0:
        torch.save(full, os.path.join(out, "saved.pt"))


def fsdp_resume(rank, world, root, out):
    job = Job(world, seed=1)
    with ct.Checkpointer(root) as ck:
        steps, latest = ck.steps(), ck.latest_step()
        state = job.state()
        report = ck.load(state)
    job.step_no = state["step"]
    saved = torch.load(os.path.join(out, "saved.pt"))
    dump(out, "resumed", rank, {
        "steps": steps, "latest": latest, "step": job.step_no,
        "mismatched": _mismatched(job.full(), saved), "n": len(saved),
        "bytes_loaded": report.bytes_loaded})


def test_fsdp2_state_saved_to_s3_on_2_resumes_exactly_on_3(tmp_path, s3, bucket):
    root = f"s3://{bucket}/run"
    out = str(tmp_path / "out")
    os.mkdir(out)
    run(fsdp_train_and_save, 2, tmp_path, root, out)
    run(fsdp_resume, 3, tmp_path, root, out)
    for rank in range(3):
        got = read(out, "resumed", rank)
        assert got["steps"] == [K, K + M] and got["latest"] == K + M, rank
        assert got["step"] == K + M and got["mismatched"] == [], rank
        assert got["n"] > 0 and got["bytes_loaded"] > 0, rank

    # What is on the store: `latest` and the two committed steps, each with
    # its MANIFEST and one shard object per saving rank.
    names = keys(s3, bucket, "run/")
    assert names[0] == "latest"
    for step in (K, K + M):
        prefix = f"step-{step:08d}/"
        in_step = sorted(n[len(prefix):].split(".")[0] for n in names if n.startswith(prefix))
        assert in_step == ["MANIFEST", "shard-00000", "shard-00001"], in_step
    r = ckpt.Reader(root)
    assert (r.step, r.world_size) == (K + M, 2)
    report = ckpt.validate(root)
    assert report.valid, report
