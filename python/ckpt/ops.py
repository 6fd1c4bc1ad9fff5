"""Operations on whole checkpoints: validate, diff and reshard.

The same operations the tools run (ckpt-validate, ckpt-diff, ckpt-reshard;
C++ in ops/), returning dataclasses whose fields are the members of the
tools' ``--json`` reports (tools/README.md): absent values are ``None``;
``ValueDiff.max_abs_diff`` is a float (``inf`` where the JSON says
``"inf"``)::

    import ckpt
    report = ckpt.validate("/ckpt/run1")        # follows `latest`
    for f in report.findings:                   # every problem, not the first
        print(f.severity, f.file, f.entry, f.block, f.message)
    d = ckpt.diff("/ckpt/run1", "/ckpt/run1-on-8")
    assert d.equal, d.values
    r = ckpt.reshard("/ckpt/run1", "/ckpt/run1-on-8", to=8, verify=True)

Problems found in a checkpoint are results (``ValidateReport.findings``,
``DiffReport.structural`` and ``values``), not exceptions. What keeps an
operation from running raises the package's exceptions: ``NotFoundError``
(not a checkpoint), ``DataLossError`` (corrupt data met by diff or
reshard), ``InvalidArgumentError`` (bad options, a layout that does not
fit), ``AlreadyExistsError`` (the reshard's step exists),
``FailedPreconditionError`` (a newer format version). The GIL is released
while an operation runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

from . import _ckpt

__all__ = [
    "DiffNote", "DiffReport", "DiffSide", "Finding", "ReshardReport", "ReshardSide",
    "ReshardedEntry", "StructuralDiff", "ValidateReport", "ValueDiff", "diff", "reshard",
    "validate"
]


def _build(cls, d: dict):
    """An instance of dataclass `cls` from the binding's dict `d` (the
    members of the tool's --json report, with the same names)."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Finding:
    """One problem ckpt.validate found. Location fields that do not apply
    are None: `file` (full path), `entry`, `chunk` (index in the manifest's
    entry), `region` ("[0:4, 0:8]" or "flat[0:100)"), `block` (index in the
    chunk). `text` is the finding as ckpt-validate prints it."""
    severity: str  # "error" or "warning"
    file: Optional[str]
    entry: Optional[str]
    chunk: Optional[int]
    region: Optional[str]
    block: Optional[int]
    message: str
    text: str


@dataclass(frozen=True)
class ValidateReport:
    """What ckpt.validate found (ckpt-validate --json's members). `valid`:
    no error (and, when strict, no warning). Fields of the manifest
    (format_version, step, world_size, checkpoint_id) are None when it did
    not decode."""
    valid: bool
    root: Optional[str]
    checkpoint: Optional[str]
    format_version: Optional[str]
    step: Optional[int]
    world_size: Optional[int]
    checkpoint_id: Optional[str]
    quick: bool
    check_finite: bool
    shards: int
    shards_ok: int
    entries: int
    chunks: int
    payload_bytes: int
    blocks_verified: int
    bytes_verified: int
    seconds: float
    errors: int
    warnings: int
    findings_dropped: int
    findings: List[Finding]


@dataclass(frozen=True)
class DiffSide:
    """One checkpoint of a diff: the directory compared."""
    path: str
    step: int
    world_size: int
    entries: int


@dataclass(frozen=True)
class DiffNote:
    """A difference that does not make the checkpoints differ: "step",
    "world size" or "metadata 'KEY'" ("(absent)" for a missing key)."""
    what: str
    a: str
    b: str


@dataclass(frozen=True)
class StructuralDiff:
    """An entry only in A ("removed"), only in B ("added"), or whose "kind",
    "dtype", "shape", "partial" flag or "coverage" differs (a and b, the
    two values, are None for added and removed)."""
    entry: str
    change: str
    a: Optional[str]
    b: Optional[str]


@dataclass(frozen=True)
class ValueDiff:
    """An entry of equal structure whose values differ: `differing` of
    `total` elements (bytes for an object). Tensors: the largest absolute
    difference, the global coordinates of the first difference and the two
    values there (as text); objects: the two sizes in bytes."""
    entry: str
    kind: str  # "tensor" or "object"
    differing: int
    total: int
    size_a: Optional[int]
    size_b: Optional[int]
    max_abs_diff: Optional[float]
    first_at: Optional[List[int]]
    first_a: Optional[str]
    first_b: Optional[str]


@dataclass(frozen=True)
class DiffReport:
    """What ckpt.diff found (ckpt-diff --json's members). `equal`: no
    structural and no value difference. `loads`: the reads made per side
    (one per batch of entries that fit in a window together, one per
    window of a larger tensor, one per larger object)."""
    a: DiffSide
    b: DiffSide
    atol: float
    rtol: float
    equal: bool
    notes: List[DiffNote]
    structural: List[StructuralDiff]
    values: List[ValueDiff]
    entries_compared: int
    bytes_compared: int
    loads: int


@dataclass(frozen=True)
class ReshardSide:
    """The checkpoint read or written by a reshard."""
    path: str
    step: int
    world_size: int


@dataclass(frozen=True)
class ReshardedEntry:
    """How an entry was laid out: `source`, SRC's layout described ("4 parts
    along dim0"); `layout`, the output's ("dim0", "flat", "replicated",
    "partial", "object"); `override`, whether a layout rule gave it. dtype
    and shape are None for objects."""
    name: str
    kind: str
    dtype: Optional[str]
    shape: Optional[List[int]]
    source: str
    layout: str
    override: bool


@dataclass(frozen=True)
class ReshardReport:
    """What ckpt.reshard wrote (ckpt-reshard --json's members); `verify` is
    the diff of SRC against the output when asked for."""
    src: ReshardSide
    dst: ReshardSide
    step: int
    codec: str
    entries: List[ReshardedEntry]
    tensor_bytes: int
    object_bytes: int
    stored_bytes: int
    largest_read: int
    seconds: float
    verify: Optional[DiffReport]


def _diff_report(d: dict) -> DiffReport:
    d = dict(d, a=_build(DiffSide, d["a"]), b=_build(DiffSide, d["b"]),
             notes=[_build(DiffNote, x) for x in d["notes"]],
             structural=[_build(StructuralDiff, x) for x in d["structural"]],
             values=[_build(ValueDiff, x) for x in d["values"]])
    return _build(DiffReport, d)


def validate(path: str, *, quick: bool = False, check_finite: bool = False,
             strict: bool = False, threads: int = 0,
             max_findings: int = 1000) -> ValidateReport:
    """Checks the checkpoint at `path` (a checkpoint directory, or a root
    whose `latest` is followed) against the format specification and
    returns every problem found, as ckpt-validate does: the manifest, every
    shard file's header, index and chunks, and (unless `quick`) every block
    of every chunk, read and verified against its checksum. `check_finite`
    adds NaN and Inf in floating-point tensors as findings; `strict` makes
    warnings (a stray temporary entry under a root) invalidate too.
    `threads`: payload readers, 0 = one per core. Findings beyond
    `max_findings` are counted in `findings_dropped`.

    Raises NotFoundError when `path` is no checkpoint nor root,
    FailedPreconditionError for a newer format version, InvalidArgumentError
    for quick with check_finite."""
    d = _ckpt._validate(str(path), quick, check_finite, strict, threads, max_findings)
    d = dict(d, findings=[_build(Finding, f) for f in d["findings"]])
    return _build(ValidateReport, d)


def diff(a: str, b: str, *, atol: float = 0.0, rtol: float = 0.0,
         window_bytes: int = 64 << 20, io_threads: int = 4) -> DiffReport:
    """Compares checkpoints `a` and `b` (roots or checkpoint directories) as
    ckpt-diff does, whatever world sizes and shardings they were saved with:
    entries added, removed or changed in kind, dtype, shape or partial flag,
    and the values of the others, tensors window by window (at most
    `window_bytes` per side in memory) with every block verified. Exact
    (bitwise) unless `atol`/`rtol` are given (numpy.isclose's rule, NaN
    equal to NaN).

    Raises NotFoundError for a path that is no checkpoint, DataLossError
    for corrupt data (naming the file, entry and block), InvalidArgumentError
    for bad tolerances."""
    return _diff_report(_ckpt._diff(str(a), str(b), atol, rtol, window_bytes, io_threads))


def reshard(src: str, dst: str, to: int, *, from_: int = 0,
            layout: Optional[Dict[str, str]] = None, codec: Optional[str] = None,
            step: Optional[int] = None, threads: int = 4,
            verify: bool = False) -> ReshardReport:
    """Rewrites checkpoint `src` as `dst`/step-NNNNNNNN laid out for `to`
    ranks, as ckpt-reshard does: rank r finds its part of every tensor in
    shard r; streamed with bounded memory, every block of `src` verified,
    committed atomically. Layouts are inferred from `src`'s chunks; `layout`
    gives them for entries by name or glob pattern ({"layers.*.w": "dim1",
    "emb": "flat", "norm": "replicated"}), as ckpt-reshard's --layout file
    does. `from_` > 0: `src` must have been saved on that many ranks.
    `codec` ("none", "zstd") and `step` default to `src`'s. `verify` diffs
    `src` against the output afterwards (ReshardReport.verify).

    Raises InvalidArgumentError (bad options, a world size other than
    `from_`, an entry whose layout cannot be inferred or a rule that does
    not fit), NotFoundError (`src` is not a checkpoint), AlreadyExistsError
    (`dst` holds that step), DataLossError (`src` is corrupt)."""
    rules = [(str(k), str(v)) for k, v in (layout or {}).items()]
    d = _ckpt._reshard(str(src), str(dst), to, from_, rules, codec, step, threads, verify)
    d = dict(d, src=_build(ReshardSide, d["src"]), dst=_build(ReshardSide, d["dst"]),
             entries=[_build(ReshardedEntry, x) for x in d["entries"]],
             verify=None if d["verify"] is None else _diff_report(d["verify"]))
    return _build(ReshardReport, d)
