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
in the data, so loading a checkpoint cannot run code. Anything else
(including subclasses such as numpy scalars or enums) is refused on save
with a TypeError naming the entry, and a malformed document with a
ckpt.DataLossError.
"""

import base64
import json
from typing import Any

from ._errors import DataLossError

FORMAT_VERSION = 1


def _encode(v: Any, where: str):
    t = type(v)
    if v is None:
        return ["none"]
    if t is bool:
        return ["bool", v]
    if t is int:
        return ["int", str(v)]
    if t is float:
        return ["float", v.hex()]
    if t is str:
        return ["str", v]
    if t is bytes or t is bytearray:
        return ["bytes", base64.b64encode(bytes(v)).decode("ascii")]
    if t is list or t is tuple:
        return [t.__name__, [_encode(x, f"{where}[{i}]") for i, x in enumerate(v)]]
    if t is dict:
        return ["dict", [[_encode(k, f"{where} (key)"), _encode(x, f"{where}[{k!r}]")]
                         for k, x in v.items()]]
    raise TypeError(
        f"{where}: a {t.__module__}.{t.__qualname__} cannot be saved as a Python value "
        "(supported: None, bool, int, float, str, bytes, and lists, tuples and dicts of "
        "them; tensors go in tensor entries)")


def encode(value: Any, where: str = "value") -> bytes:
    """The object bytes of ``value``. TypeError naming ``where`` for an
    unsupported type."""
    doc = {"ckpt_value": FORMAT_VERSION, "v": _encode(value, where)}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _bad(where: str, why: str):
    return DataLossError(f"{where}: malformed Python value: {why}")


def _decode(t, where: str):
    if not isinstance(t, list) or not t or not isinstance(t[0], str):
        raise _bad(where, f"expected a tagged form, got {t!r:.60}")
    tag, args = t[0], t[1:]
    try:
        if tag == "none" and not args:
            return None
        if len(args) != 1:
            raise _bad(where, f"tag '{tag}' with {len(args)} arguments")
        a = args[0]
        if tag == "bool" and type(a) is bool:
            return a
        if tag == "int" and type(a) is str:
            return int(a, 10)
        if tag == "float" and type(a) is str:
            return float.fromhex(a)
        if tag == "str" and type(a) is str:
            return a
        if tag == "bytes" and type(a) is str:
            return base64.b64decode(a, validate=True)
        if tag in ("list", "tuple") and type(a) is list:
            items = [_decode(x, where) for x in a]
            return items if tag == "list" else tuple(items)
        if tag == "dict" and type(a) is list:
            out = {}
            for pair in a:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise _bad(where, "a dict item is not a [key, value] pair")
                out[_decode(pair[0], where)] = _decode(pair[1], where)
            return out
    except (ValueError, TypeError) as e:  # int(), fromhex, b64decode, unhashable key
        raise _bad(where, f"tag '{tag}': {e}") from None
    raise _bad(where, f"unknown tag '{tag}' or bad argument")


def decode(data: bytes, where: str = "value") -> Any:
    """The value of object bytes written by ``encode``. ckpt.DataLossError
    naming ``where`` for malformed bytes or an unknown version."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(where, str(e)) from None
    if not isinstance(doc, dict) or set(doc) != {"ckpt_value", "v"}:
        raise _bad(where, "not a ckpt value document")
    if doc["ckpt_value"] != FORMAT_VERSION:
        raise _bad(where, f"version {doc['ckpt_value']!r}, this reader knows {FORMAT_VERSION}")
    return _decode(doc["v"], where)
