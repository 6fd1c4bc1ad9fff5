"""ckpt: sharded checkpoints for large-model training, from Python.

The core API mirrors the C++ library (ckpt/writer.h, ckpt/reader.h):

    import numpy as np, ckpt
    w = ckpt.Writer()                       # comm=... for several ranks
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    w.add_tensor("a", ckpt.float32, a.shape, ckpt.Box.full(a.shape), a)
    w.set_object("note", b"hello")
    result = w.save("/tmp/run", step=1)     # ckpt.SaveResult

    r = ckpt.Reader("/tmp/run")             # follows `latest`
    out = np.empty((3, 2), np.float32)      # columns 2..3 of "a"
    req = ckpt.LoadRequest("a", ckpt.float32, (3, 4), ckpt.Box((0, 2), (3, 2)), out)
    note = ckpt.LoadRequest.for_object("note")
    report = r.load([req, note])            # out is written in place

A root may be an S3 URL, s3://bucket/prefix, where the extension was
built with S3 support (ckpt.has_s3): the store is configured by the AWS
environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION), read at the first
use of an s3:// root; libckpt/s3/README.md has the rest.

Arrays cross without copies: numpy arrays (and anything with the buffer
protocol) and DLPack tensors (torch). A non-contiguous array is refused.
Save and load release the GIL. PyTorch users want ckpt.torch.

Operations on whole checkpoints, as the tools run them (ckpt.ops):

    report = ckpt.validate("/tmp/run")      # report.valid, report.findings
    d = ckpt.diff("/tmp/run", "/tmp/run2")  # d.equal, d.structural, d.values
    ckpt.reshard("/tmp/run", "/tmp/run3", to=3, verify=True)
"""

from . import _ckpt
from ._ckpt import (Box, Codec, Communicator, DType, Entry, FlatRange, LoadReport,
                    LoadRequest, Reader, SaveOptions, SaveResult, SingleProcessCommunicator,
                    Writer)
from ._errors import (AbortedError, AlreadyExistsError, CancelledError, DataLossError,
                      DeadlineExceededError, Error, FailedPreconditionError, InternalError,
                      InvalidArgumentError, NotFoundError, OutOfRangeError,
                      PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError,
                      UnavailableError, UnimplementedError, UnknownError)
from .ops import (DiffReport, Finding, ReshardReport, ValidateReport, diff, reshard,
                  validate)

__version__ = _ckpt.__version__
has_s3: bool = _ckpt.has_s3  # s3:// roots work (the extension has ckpt_s3)

bool_ = DType.bool
uint8, uint16, uint32, uint64 = DType.uint8, DType.uint16, DType.uint32, DType.uint64
int8, int16, int32, int64 = DType.int8, DType.int16, DType.int32, DType.int64
float16, bfloat16, float32, float64 = (DType.float16, DType.bfloat16, DType.float32,
                                       DType.float64)
float8_e4m3fn, float8_e5m2 = DType.float8_e4m3fn, DType.float8_e5m2


def save_options(**options) -> SaveOptions:
    """A SaveOptions with the given fields set (codec may be a name:
    "none" or "zstd"; metadata a dict). TypeError for an unknown option."""
    o = SaveOptions()
    for key, value in options.items():
        if key.startswith("_") or not hasattr(o, key):
            raise TypeError(f"unknown save option '{key}'")
        if key == "codec" and isinstance(value, str):
            value = Codec.__members__[value]
        if key == "metadata" and isinstance(value, dict):
            value = list(value.items())
        setattr(o, key, value)
    return o


def step_path(root: str, step: int) -> str:
    """The directory of checkpoint `step` under `root` (spec/FORMAT.md §4)."""
    return f"{root.rstrip('/')}/step-{step:08d}"


def MpiCommunicator(comm, max_bytes_per_call: int = 1 << 30) -> Communicator:
    """ckpt's MPI communicator (ckpt/mpi_communicator.h) over an mpi4py
    communicator. Collective over `comm`: it duplicates it, so ckpt's
    traffic never matches the caller's messages.

    Only when the extension was built with MPI (ckpt_mpi); mpi4py must be
    imported (which initialises MPI) first. Drop it before MPI is finalised
    (mpi4py finalises at exit).
    """
    if not _ckpt._HAS_MPI:
        raise UnimplementedError("ckpt was built without MPI (ckpt_mpi)")
    return _ckpt._MpiCommunicator(comm.py2f(), max_bytes_per_call)


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("annotations",)]
