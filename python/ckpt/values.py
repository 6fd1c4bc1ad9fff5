"""Python values as checkpoint objects, without pickle.

A value is stored as the UTF-8 JSON document ``{"ckpt_value": 1, "v": V}``
where ``V`` is a tagged form that keeps every type apart:

=========  ==================================================
Python     tagged form
=========  ==================================================
None       ``["none"]``
bool       ``["bool", true]``
int        ``["int", "12345"]`` (decimal string: any size)
float      ``["float", "0x1.8p+1"]`` (float.hex: exact, also inf, nan)
str        ``["str", "text"]``
bytes      ``["bytes", "base64"]``
list       ``["list", [V, ...]]``
tuple      ``["tuple", [V, ...]]``
dict       ``["dict", [[K, V], ...]]`` (keys are tagged values too, in
           insertion order)
=========  ==================================================

Decoding only builds these types; it never imports or calls anything named
in the data, so loading a checkpoint cannot run code. Integers of any size
are written and read in time below quadratic in their digits, whatever
Python's limit on int/str conversion (sys.set_int_max_str_digits). Values
nest at most MAX_DEPTH containers deep.

Saving raises TypeError naming the entry for anything else (including
subclasses such as numpy scalars or enums) and ckpt.InvalidArgumentError
(a ValueError) naming the entry for a list, tuple or dict that contains
itself or that nests deeper than MAX_DEPTH. Decoding raises
ckpt.DataLossError naming the entry for anything that is not such a
document (malformed JSON or tags, an unknown version, a float out of
range, nesting deeper than MAX_DEPTH); never RecursionError or
OverflowError.
"""

import base64
import decimal
import json
import re
import sys
from typing import Any, Optional, Tuple

from ._errors import DataLossError, InvalidArgumentError

FORMAT_VERSION = 1

# Containers within containers, counting the outermost: deep enough for any
# configuration, shallow enough that encoding and decoding (recursive, as
# is Python's json) stay far from the interpreter's recursion limit.
MAX_DEPTH = 100

# --- integers of any size -----------------------------------------------------


def _direct_digits() -> int:
    """Digits below which str(int) and int(str) are safe to call: Python's
    limit (0: none) less a margin."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    return sys.maxsize if limit == 0 else limit - 1


def _int_to_decimal(n: int) -> str:
    """The decimal digits of `n`. Beyond Python's digit limit, by halving
    the bits and combining the halves as decimal.Decimal numbers (whose
    multiplication of large numbers is fast)."""
    if n.bit_length() * 0.30103 < _direct_digits() - 1:
        return str(n)
    D = decimal.Decimal
    powers = {}

    def two_to(w: int):
        if w not in powers:
            powers[w] = D(2) ** w
        return powers[w]

    def build(m: int, w: int):  # 0 <= m < 2**w
        if w <= 512:
            return D(m)
        half = w >> 1
        hi = m >> half
        return build(m - (hi << half), half) + build(hi, w - half) * two_to(half)

    with decimal.localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = decimal.MAX_PREC, decimal.MAX_EMAX, decimal.MIN_EMIN
        ctx.traps[decimal.Inexact] = True
        d = build(abs(n), abs(n).bit_length())
        return ("-" if n < 0 else "") + str(d.to_integral_exact())


_INT_RE = re.compile(r"-?[0-9]+")


def _decimal_to_int(s: str) -> Optional[int]:
    """The int of decimal digits `s` (an optional '-', ASCII digits), or None
    for anything else. Beyond Python's digit limit, by splitting the digits
    in halves: hi * 10**k + lo, with 10**k = 5**k << k."""
    if not _INT_RE.fullmatch(s):
        return None
    if len(s) < _direct_digits():
        return int(s)
    sign, digits = (-1, s[1:]) if s[0] == "-" else (1, s)
    leaf = min(2048, _direct_digits() - 1)
    powers = {}

    def five_to(w: int) -> int:
        if w not in powers:
            powers[w] = 5 ** w
        return powers[w]

    def build(a: int, b: int) -> int:
        if b - a <= leaf:
            return int(digits[a:b])
        mid = (a + b + 1) >> 1
        return (build(a, mid) * five_to(b - mid) << (b - mid)) + build(mid, b)

    return sign * build(0, len(digits))


# --- encoding -----------------------------------------------------------------

# Where a value sits, for messages: (parent path or None, "[i]" or " (key)"),
# formatted only when an error is raised.
_Path = Optional[Tuple[Any, str]]


def _where(base: str, path: _Path) -> str:
    parts = []
    while path is not None:
        path, part = path
        parts.append(part)
    parts.reverse()
    if len(parts) > 10:
        parts[4:-4] = [f"...{len(parts) - 8} levels..."]
    return base + "".join(parts)


def _key_repr(k: Any) -> str:
    """repr(k) cut to 60 characters, in time and stack independent of k's
    size: containers by their type and length, ints of any size."""
    t = type(k)
    if t in (list, tuple, dict):
        return f"a {t.__name__} of {len(k)} items"
    if t is int and k.bit_length() > 200:
        return f"an int of {k.bit_length()} bits"
    r = repr(k[:60] if t in (str, bytes, bytearray) else k)
    return r if len(r) <= 60 else r[:57] + "..."


class _Encoder:
    def __init__(self, where: str):
        self.where = where
        self.open = set()  # ids of the containers being encoded

    def container(self, v, path: _Path, depth: int, items):
        if id(v) in self.open:
            raise InvalidArgumentError(
                f"{_where(self.where, path)}: a {type(v).__name__} that contains itself "
                "cannot be saved as a Python value")
        if depth > MAX_DEPTH:
            raise InvalidArgumentError(
                f"{_where(self.where, path)}: Python values nest at most {MAX_DEPTH} "
                "lists, tuples and dicts deep")
        self.open.add(id(v))
        try:
            return items()
        finally:
            self.open.discard(id(v))

    def encode(self, v: Any, path: _Path = None, depth: int = 0):
        t = type(v)
        if v is None:
            return ["none"]
        if t is bool:
            return ["bool", v]
        if t is int:
            return ["int", _int_to_decimal(v)]
        if t is float:
            return ["float", v.hex()]
        if t is str:
            return ["str", v]
        if t is bytes or t is bytearray:
            return ["bytes", base64.b64encode(bytes(v)).decode("ascii")]
        if t is list or t is tuple:
            return [t.__name__, self.container(v, path, depth + 1, lambda: [
                self.encode(x, (path, f"[{i}]"), depth + 1) for i, x in enumerate(v)])]
        if t is dict:
            return ["dict", self.container(v, path, depth + 1, lambda: [
                [self.encode(k, (path, " (key)"), depth + 1),
                 self.encode(x, (path, f"[{_key_repr(k)}]"), depth + 1)]
                for k, x in v.items()])]
        raise TypeError(
            f"{_where(self.where, path)}: a {t.__module__}.{t.__qualname__} cannot be saved "
            "as a Python value (supported: None, bool, int, float, str, bytes, and lists, "
            "tuples and dicts of them; tensors go in tensor entries)")


def encode(value: Any, where: str = "value") -> bytes:
    """The object bytes of ``value``. TypeError naming ``where`` for an
    unsupported type; ckpt.InvalidArgumentError naming it for a container
    that contains itself or nests deeper than MAX_DEPTH."""
    doc = {"ckpt_value": FORMAT_VERSION, "v": _Encoder(where).encode(value)}
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except RecursionError:  # only where the caller's stack is already deep
        raise InvalidArgumentError(
            f"{where}: the value nests too deeply for this thread's stack") from None
    return text.encode("utf-8")


# --- decoding -----------------------------------------------------------------


def _bad(where: str, why: str):
    return DataLossError(f"{where}: malformed Python value: {why}")


def _decode(t, where: str, depth: int = 0):
    if not isinstance(t, list) or not t or not isinstance(t[0], str):
        raise _bad(where, f"expected a tagged form, got {_key_repr(t)}")
    tag, args = t[0], t[1:]
    try:
        if tag == "none" and not args:
            return None
        if len(args) != 1:
            raise _bad(where, f"tag '{tag:.40}' with {len(args)} arguments")
        a = args[0]
        if tag == "bool" and type(a) is bool:
            return a
        if tag == "int" and type(a) is str:
            n = _decimal_to_int(a)
            if n is None:
                raise _bad(where, f"tag 'int': not a decimal integer: {_key_repr(a)}")
            return n
        if tag == "float" and type(a) is str:
            return float.fromhex(a)
        if tag == "str" and type(a) is str:
            return a
        if tag == "bytes" and type(a) is str:
            return base64.b64decode(a, validate=True)
        if tag in ("list", "tuple", "dict") and type(a) is list and depth >= MAX_DEPTH:
            raise _bad(where, f"nested deeper than {MAX_DEPTH} lists, tuples and dicts")
        if tag in ("list", "tuple") and type(a) is list:
            items = [_decode(x, where, depth + 1) for x in a]
            return items if tag == "list" else tuple(items)
        if tag == "dict" and type(a) is list:
            out = {}
            for pair in a:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _bad(where, "a dict item is not a [key, value] pair")
                out[_decode(pair[0], where, depth + 1)] = _decode(pair[1], where, depth + 1)
            return out
    # int digits, fromhex (OverflowError: 0x1p99999999), b64decode, an
    # unhashable key
    except (ValueError, TypeError, OverflowError) as e:
        raise _bad(where, f"tag '{tag:.40}': {e}") from None
    raise _bad(where, f"unknown tag '{tag:.40}' or bad argument")


def decode(data: bytes, where: str = "value") -> Any:
    """The value of object bytes written by ``encode``. ckpt.DataLossError
    naming ``where`` for malformed bytes, an unknown version, a float out of
    range or nesting deeper than MAX_DEPTH."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise _bad(where, str(e)) from None
    except RecursionError:  # JSON nested deeper than the interpreter's stack
        raise _bad(where, f"nested deeper than {MAX_DEPTH} lists, tuples and dicts") from None
    if not isinstance(doc, dict) or set(doc) != {"ckpt_value", "v"}:
        raise _bad(where, "not a ckpt value document")
    if doc["ckpt_value"] != FORMAT_VERSION:
        raise _bad(where, f"version {_key_repr(doc['ckpt_value'])}, this reader knows "
                          f"{FORMAT_VERSION}")
    return _decode(doc["v"], where)
