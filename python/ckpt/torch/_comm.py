"""ckpt's collectives over torch.distributed, and how ranks agree: every
rank's failure before a collective is raised on every rank (no rank waits
in a collective a failed one never enters)."""
import json
import socket
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist

from .._errors import Error, FailedPreconditionError, InvalidArgumentError, error_class


def _global_rank(group, group_rank: int) -> int:
    if group is None:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # torch >= 2.0
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)


class ProcessGroupCommunicator:
    """ckpt's collectives over a torch.distributed process group (gloo, or
    any backend with all_gather, broadcast, all_reduce, barrier and
    all_to_all_single on CPU tensors). Bytes travel as uint8 tensors, so
    dtypes a backend rejects (gloo: bfloat16) never reach it; unequal
    all-gathers are padded to the longest contribution; all_to_all moves
    each byte once. Ranks are ranks of `group`; node_name is the host name.
    """

    def __init__(self, group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise FailedPreconditionError(
                "ProcessGroupCommunicator: torch.distributed is not initialised")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        # Ranks on one machine share its storage and network bandwidth: a
        # cooperative load spreads its reads over machines first.
        self.node_name = socket.gethostname()

    # all_gather and broadcast send each rank's length with its first bytes
    # in one buffer of this size: the small messages of ckpt's agreements
    # (most of them) take one collective instead of two (its latency, not
    # its bytes, is what they cost where processes outnumber cores).
    _INLINE = 4096
    _HEAD = 8  # the length, u64 little-endian

    def _packed(self, data: bytes) -> torch.Tensor:
        buf = torch.zeros(self._INLINE, dtype=torch.uint8)
        staged = buf.numpy()
        staged[:self._HEAD] = np.frombuffer(len(data).to_bytes(self._HEAD, "little"), np.uint8)
        first = min(len(data), self._INLINE - self._HEAD)
        if first:
            staged[self._HEAD:self._HEAD + first] = np.frombuffer(data, np.uint8, first)
        return buf

    def _unpacked(self, buf: torch.Tensor):
        """(length, the bytes that came with it)."""
        raw = buf.numpy()
        n = int.from_bytes(raw[:self._HEAD].tobytes(), "little")
        return n, raw[self._HEAD:self._HEAD + min(n, self._INLINE - self._HEAD)].tobytes()

    def all_gather(self, data: bytes) -> List[bytes]:
        """Every rank's data, by rank: one collective when every part is at
        most _INLINE - 8 bytes, else a second one for the rest."""
        outs = [torch.empty(self._INLINE, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(outs, self._packed(data), group=self.group)
        got = [self._unpacked(o) for o in outs]
        inline = self._INLINE - self._HEAD
        longest = max(n for n, _ in got) - inline
        if longest <= 0:
            return [b for _, b in got]
        buf = torch.zeros(longest, dtype=torch.uint8)
        if len(data) > inline:
            buf.numpy()[:len(data) - inline] = np.frombuffer(data, np.uint8, offset=inline)
        rest = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(rest, buf, group=self.group)
        return [b + r[:max(n - inline, 0)].numpy().tobytes() for (n, b), r in zip(got, rest)]

    def broadcast(self, data: bytes, root: int) -> bytes:
        """Rank root's data on every rank: one collective when it is at most
        _INLINE - 8 bytes, else a second one for the rest."""
        src = _global_rank(self.group, root)
        head = self._packed(data if self.rank == root else b"")
        dist.broadcast(head, src, group=self.group)
        n, out = self._unpacked(head)
        inline = self._INLINE - self._HEAD
        if n <= inline:
            return out
        buf = torch.empty(n - inline, dtype=torch.uint8)
        if self.rank == root:
            buf.numpy()[:] = np.frombuffer(data, np.uint8, offset=inline)
        dist.broadcast(buf, src, group=self.group)
        return out + buf.numpy().tobytes()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_reduce_max(self, values: List[int]) -> List[int]:
        t = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(x) for x in t]

    def _exchange_sizes(self, sent: List[int]) -> List[int]:
        """sent[d]: the bytes this rank sends rank d; returns, by rank, the
        bytes every rank sends here (one all_to_all_single)."""
        arriving = torch.empty(self.size, dtype=torch.int64)
        dist.all_to_all_single(arriving, torch.tensor(sent, dtype=torch.int64),
                               group=self.group)
        return [int(n) for n in arriving]

    def all_to_all(self, parts: List[bytes]) -> List[memoryview]:
        """parts[d] (bytes-like) goes to rank d; returns the part every rank
        sent here, by rank, as read-only memoryviews of one buffer. Two
        all_to_all_single calls (gloo has no list all_to_all): the sizes,
        then the concatenated parts with uneven splits, so each byte moves
        once. The parts are copied once, into the send buffer, and the
        received bytes not at all: a cooperative load moves most of a
        checkpoint through here. REQUIRES: len(parts) == size on every rank
        (ckpt checks it on every rank before calling)."""
        if len(parts) != self.size:
            raise InvalidArgumentError(
                f"all_to_all: {len(parts)} parts for {self.size} ranks")
        sent = [len(p) for p in parts]
        received = self._exchange_sizes(sent)
        send = torch.empty(sum(sent), dtype=torch.uint8)
        staged, at = send.numpy(), 0
        for p, n in zip(parts, sent):
            if n:
                staged[at:at + n] = np.frombuffer(p, dtype=np.uint8)
            at += n
        out = torch.empty(sum(received), dtype=torch.uint8)
        dist.all_to_all_single(out, send, output_split_sizes=received,
                               input_split_sizes=sent, group=self.group)
        data, offsets = memoryview(out.numpy()).toreadonly(), [0]
        for n in received:
            offsets.append(offsets[-1] + n)
        return [data[a:b] for a, b in zip(offsets, offsets[1:])]

    def all_to_all_into(self, send, send_sizes: List[int], recv,
                        recv_sizes: List[int]) -> None:
        """ckpt's AllToAll without copies: `send` holds the part for each
        rank d (send_sizes[d] bytes) back to back, `recv` (writable) takes
        the part from each rank s (recv_sizes[s] bytes) back to back.
        all_to_all_single runs straight on tensors over both buffers; a
        first one exchanges the sizes, so that a rank whose recv_sizes
        disagree with what the others send receives into a buffer of its
        own, completes the collective with them and then raises."""
        if len(send_sizes) != self.size or len(recv_sizes) != self.size:
            raise InvalidArgumentError(
                f"all_to_all_into: {len(send_sizes)} and {len(recv_sizes)} parts "
                f"for {self.size} ranks")
        sent = [int(n) for n in send_sizes]
        received = self._exchange_sizes(sent)
        expected = [int(n) for n in recv_sizes]
        total = sum(received)
        if received == expected and total > 0:
            out = torch.frombuffer(recv, dtype=torch.uint8, count=total)
        else:
            out = torch.empty(total, dtype=torch.uint8)
        if sum(sent) > 0:
            inp = torch.frombuffer(send, dtype=torch.uint8, count=sum(sent))
        else:
            inp = torch.empty(0, dtype=torch.uint8)
        dist.all_to_all_single(out, inp, output_split_sizes=received,
                               input_split_sizes=sent, group=self.group)
        if received != expected:
            s = next(i for i, (a, b) in enumerate(zip(received, expected)) if a != b)
            raise InvalidArgumentError(
                f"all_to_all_into: rank {s} sent {received[s]} bytes to rank "
                f"{self.rank}, which expected {expected[s]}")


def _communicator(process_group):
    """None (single process), a ckpt communicator, or a
    ProcessGroupCommunicator over `process_group`."""
    if process_group is None:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return ProcessGroupCommunicator(None)
        return None
    if hasattr(process_group, "all_gather") and hasattr(process_group, "all_reduce_max"):
        return process_group  # already a communicator
    return ProcessGroupCommunicator(process_group)


def _exchange(comm, info: Dict) -> List[Dict]:
    """Every rank's `info` (a JSON-able dict), in rank order."""
    if comm is None:
        return [info]
    return [json.loads(b) for b in comm.all_gather(json.dumps(info).encode())]


def _error_info(e: BaseException) -> Dict:
    code = next((c for c in range(1, 17) if type(e) is error_class(c)), 0)
    return {"message": f"{type(e).__name__}: {e}", "code": code}


def _raise_if_any_rank_failed(gathered: List[Dict], local_error, what: str) -> None:
    """Raises on every rank when one rank failed before a collective (so no
    rank waits in a collective the failed one never enters)."""
    if local_error is not None:
        raise local_error
    for r, g in enumerate(gathered):
        if g.get("error"):
            cls = error_class(g["error"]["code"]) if g["error"]["code"] else Error
            raise cls(f"{what}: rank {r} failed: {g['error']['message']}")


def _rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))

