"""Python values (ckpt.values) from a caller and from a hostile file
(issue 28): a value that contains itself, nesting, integers of any size,
and documents with valid checksums but hostile contents raise ckpt's
documented exceptions, never RecursionError or OverflowError."""
import json
import sys

import pytest

from conftest import require

torch = require("torch")
import ckpt  # noqa: E402
import ckpt.torch as ct  # noqa: E402
from ckpt import values  # noqa: E402


def _nested(depth: int):
    v = None
    for _ in range(depth):
        v = [v]
    return v


def _self_list():
    a = [1]
    a.append(a)
    return a


def _self_dict_in_list():
    d = {1: "x"}
    d[2] = [d]
    return [d]


def _tuple_through_list():
    inner = []
    t = (inner,)
    inner.append(t)
    return t


@pytest.mark.parametrize("make", [_self_list, _self_dict_in_list, _tuple_through_list])
def test_values_that_contain_themselves_are_refused_naming_the_entry(tmp_path, make):
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'cfg.v'.*contains itself"):
        ct.save({"cfg": {"v": make()}}, str(tmp_path), 1)
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'x'.*contains itself"):
        values.encode(make(), "entry 'x'")


def test_a_state_dict_that_contains_itself_is_refused_naming_the_entry(tmp_path):
    sd = {"w": torch.zeros(2), "sub": {"lr": 0.1}}
    sd["sub"]["up"] = sd
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'sub.up': the dict holds a "
                                                        r"dict it is nested in"):
        ct.save(sd, str(tmp_path), 1)
    ct.save({"w": torch.zeros(2), "sub": {"lr": 0.1}}, str(tmp_path), 1)
    with pytest.raises(ckpt.InvalidArgumentError, match=r"entry 'sub.up'"):
        ct.load(sd, str(tmp_path))
    shared = {"a": 1}  # the same dict twice, not nested in itself: fine
    ct.save({"x": shared, "y": shared}, str(tmp_path), 2)


def test_state_dicts_nest_to_any_depth(tmp_path):
    sd = leaf = {}
    for i in range(3000):  # deeper than Python's recursion limit
        leaf["k"] = {}
        leaf = leaf["k"]
    leaf["w"] = torch.ones(1)
    name = "k." * 3000 + "w"
    with pytest.raises(ckpt.InvalidArgumentError, match=r"name"):  # too long, not a recursion
        ct.save(sd, str(tmp_path), 1)
    assert len(name) > 1024


def test_values_nest_up_to_max_depth(tmp_path):
    ct.save({"v": _nested(values.MAX_DEPTH)}, str(tmp_path), 1)
    out = {"v": None}
    ct.load(out, str(tmp_path))
    assert out["v"] == _nested(values.MAX_DEPTH)
    with pytest.raises(ckpt.InvalidArgumentError,
                       match=rf"entry 'v'\[0\].*: Python values nest at most "
                             rf"{values.MAX_DEPTH} lists"):
        ct.save({"v": _nested(values.MAX_DEPTH + 1)}, str(tmp_path), 2)
    deep = {}
    d = deep
    for _ in range(values.MAX_DEPTH):
        d[0] = {}
        d = d[0]
    with pytest.raises(ckpt.InvalidArgumentError, match="nest at most"):
        values.encode(deep, "entry 'd'")


@pytest.fixture
def digit_limit():
    """Python's int/str digit limit, lowered to its minimum for the test."""
    get = getattr(sys, "get_int_max_str_digits", None)
    if get is None:
        pytest.skip("Python without an int digit limit")
    old = get()
    sys.set_int_max_str_digits(640)
    yield
    sys.set_int_max_str_digits(old)


def test_integers_of_any_size_round_trip(tmp_path, digit_limit):
    big = {"pos": 10**5000, "neg": -(10**5000) - 7, "pow2": 2**100000 + 1, "small": -12,
           "keys": {3**3000: "a", 0: (-(7**2000),)}}
    ct.save({"cfg": big}, str(tmp_path), 1)  # a dict of str keys: one entry per key
    out = {"cfg": {k: None for k in big}}
    ct.load(out, str(tmp_path))
    assert out["cfg"] == big
    for n in (10**640, 10**639, -(10**641), 2**(1 << 20) - 1):
        assert values.decode(values.encode(n)) == n


def _doc(v) -> bytes:
    return json.dumps({"ckpt_value": 1, "v": v}).encode()


def _raw_deep(depth: int) -> bytes:
    return b'{"ckpt_value":1,"v":' + b"[" * depth + b"]" * depth + b"}"


def _tagged_deep(depth: int) -> bytes:
    return b'{"ckpt_value":1,"v":' + b'["list",[' * depth + b"]]" * depth + b"}"


# Documents a hostile writer can store with valid checksums, and what the
# error says.
HOSTILE = {
    "float out of range": (_doc(["float", "0x1p99999999"]), "too large"),
    "JSON nested past the stack": (_raw_deep(200000), "nested deeper than"),
    "tags nested past MAX_DEPTH": (_tagged_deep(150), "nested deeper than 100"),
    "tags nested past the stack": (_tagged_deep(100000), "nested deeper than"),
    "int with junk": (_doc(["int", "12 "]), "not a decimal integer"),
    "int with a huge JSON number": (b'{"ckpt_value":' + b"1" * 5000 + b',"v":["none"]}',
                                    "Exceeds the limit"),
    "huge unknown tag": (_doc(["x" * 10**6, 1]), "unknown tag 'xxx"),
    "huge untagged list": (_doc([[0] * 10**5]), "got a list of 1 items"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_value_documents_raise_data_loss_naming_the_entry(tmp_path, case):
    data, words = HOSTILE[case]
    w = ckpt.Writer()
    w.set_object("v", data)
    w.save(str(tmp_path), 1)
    with pytest.raises(ckpt.DataLossError, match=f"entry 'v': malformed Python value: .*{words}"):
        ct.load({"v": None}, str(tmp_path))
