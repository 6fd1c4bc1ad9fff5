"""s3:// roots from Python (ckpt.has_s3), against moto's S3 server on
loopback with signature checking on (tests/testing/s3/moto_server.py): a
save and a load through the same Writer and Reader as for local paths, the
object-store layout of spec/FORMAT.md §4.3, keep_last, and a flipped byte
found by the checksums. Under ctest the server is the s3 tests' fixture
(CKPT_S3_TEST_SERVER names its state file); run alone, the test starts its
own."""
import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import ckpt
from conftest import require

if not ckpt.has_s3:
    if os.environ.get("CI") == "true":
        pytest.fail("the extension was built without S3 support", pytrace=False)
    pytest.skip("the extension was built without S3 support (libcurl, OpenSSL)",
                allow_module_level=True)
boto3 = require("boto3")

MOTO_SERVER = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "testing",
                           "s3", "moto_server.py")


@pytest.fixture(scope="module")
def server():
    """The server's JSON (endpoint, region, user keys)."""
    child = None
    state = os.environ.get("CKPT_S3_TEST_SERVER")
    if state and os.path.exists(state):
        with open(state) as f:
            info = json.load(f)
    else:
        child = subprocess.Popen([sys.executable, MOTO_SERVER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
        info = json.loads(child.stdout.readline() or b'{"error": "no answer"}')
    if "error" in info:
        if os.environ.get("CI") == "true":
            pytest.fail(f"moto: {info['error']}", pytrace=False)
        pytest.skip(f"moto: {info['error']}")
    # Read by the extension at its first s3:// root, in this process.
    os.environ.update({"AWS_ENDPOINT_URL": info["endpoint"],
                       "AWS_REGION": info["region"],
                       "AWS_ACCESS_KEY_ID": info["user"]["access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": info["user"]["secret_access_key"]})
    yield info
    if child is not None:
        child.stdin.close()
        child.wait(timeout=30)


@pytest.fixture
def s3(server):
    return boto3.client("s3", endpoint_url=server["endpoint"], region_name=server["region"],
                        aws_access_key_id=server["user"]["access_key_id"],
                        aws_secret_access_key=server["user"]["secret_access_key"])


@pytest.fixture
def bucket(s3):
    name = f"ckpt-py-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def keys(s3, bucket, prefix):
    out = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return [o["Key"][len(prefix):] for o in out]


def save(root, step, arrays, **options):
    w = ckpt.Writer()
    for name, a in arrays.items():
        w.add_tensor(name, ckpt.DType.from_name(str(a.dtype)), a.shape,
                     ckpt.Box.full(a.shape), a)
    return w.save(root, step, ckpt.save_options(**options))


def test_save_and_load_an_s3_root(s3, bucket):
    root = f"s3://{bucket}/run"
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = np.arange(10, dtype=np.int64)
    for step in (1, 2):
        res = save(root, step, {"a": a * step, "b": b + step}, keep_last=1)
    assert res.path == f"{root}/step-00000002"
    # Only step 2 is left; MANIFEST and a shard named after its save.
    names = keys(s3, bucket, "run/")
    assert names[0] == "latest" and all(n.startswith("step-00000002/") for n in names[1:])
    assert sorted(n.split("/")[1].split(".")[0] for n in names[1:]) == ["MANIFEST",
                                                                       "shard-00000"]

    r = ckpt.Reader(root)
    assert r.path == f"{root}/step-00000002" and r.step == 2
    cols = np.zeros((4, 2), np.float32)
    r.load([ckpt.LoadRequest("a", ckpt.float32, (4, 6), ckpt.Box((0, 3), (4, 2)), cols)],
           allow_unrequested=True)
    np.testing.assert_array_equal(cols, (a * 2)[:, 3:5])


def test_flipped_byte_in_a_shard_object_is_data_loss(s3, bucket):
    root = f"s3://{bucket}/run"
    a = np.arange(4096, dtype=np.float32)
    save(root, 1, {"a": a})
    shard = next(k for k in keys(s3, bucket, "run/step-00000001/") if k.startswith("shard-"))
    key = f"run/step-00000001/{shard}"
    data = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[4096 + 100] ^= 0x01  # inside the payload, which starts at 4096
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    out = np.zeros_like(a)
    with pytest.raises(ckpt.DataLossError, match=shard):
        ckpt.Reader(root).load([ckpt.LoadRequest("a", ckpt.float32, a.shape,
                                                 ckpt.Box.full(a.shape), out)])


def test_missing_s3_root_is_file_not_found(bucket):
    with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/nothing"):
        ckpt.Reader(f"s3://{bucket}/nothing")
