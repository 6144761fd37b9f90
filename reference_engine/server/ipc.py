"""The wire format between the API process and the engine process.

Messages are pickled (protocol 5) and sent over ZMQ sockets (ipc:// files in a private
0700 temp folder, so only this user's processes can connect: the same trust as a
multiprocessing pipe). Pickle carries any dataclass with *all* its fields, so a field added
to RequestOutput, RequestMetrics, EngineStats or SamplingParams flows through the IPC with
no change here. Measured against msgpack (below) by `python -m
tests.benchmarks.studies.ipc_bench`: for a step message of dataclasses pickle is
faster to encode and decode (docs/engine.md has the figures), so pickle is the default.

`msgpack_encode`/`msgpack_decode` are the alternative measured there: a dataclass travels as
the one-entry map {TAG: [class key, *field values]} and is rebuilt without `__init__`; only
classes under `cbbench.` are rebuilt. Tuples arrive as lists; int-keyed dicts are allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import pickle
import threading
from functools import cache
from typing import Any

import msgpack

# a dataclass travels as the one-entry map {_TAG: [class key, *field values]}
_TAG = "\x00dc"
_ENUM_TAG = "\x00enum"
_ALLOWED_PREFIX = "cbbench."


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@cache
def _class_key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@cache
def _resolve(key: str) -> type:
    module, _, qualname = key.partition(":")
    if not module.startswith(_ALLOWED_PREFIX):
        raise ValueError(f"ipc: refusing to rebuild {key!r} (not a cbbench class)")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _default(obj: Any) -> Any:
    # returns builtins that msgpack packs in turn (recursively, in C)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {_TAG: [_class_key(cls), *(getattr(obj, n) for n in _field_names(cls))]}
    if isinstance(obj, enum.Enum):
        return {_ENUM_TAG: [_class_key(type(obj)), obj.value]}
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    raise TypeError(f"ipc: cannot send {type(obj).__name__}")


def _object_hook(d: dict[Any, Any]) -> Any:
    if len(d) == 1:
        values = d.get(_TAG)
        if values is not None:
            cls = _resolve(values[0])
            obj = object.__new__(cls)
            names = _field_names(cls)
            assert len(names) == len(values) - 1, f"ipc: {values[0]} field count differs"
            obj.__dict__.update(zip(names, values[1:], strict=True))
            return obj
        values = d.get(_ENUM_TAG)
        if values is not None:
            return _resolve(values[0])(values[1])
    return d


_PACKER = msgpack.Packer(default=_default, use_bin_type=True)
_PACK_LOCK = threading.Lock()  # a Packer keeps one buffer: one caller at a time


def msgpack_encode(message: Any) -> bytes:
    with _PACK_LOCK:
        return _PACKER.pack(message)


def msgpack_decode(data: bytes) -> Any:
    return msgpack.unpackb(data, object_hook=_object_hook, strict_map_key=False, raw=False)


def encode(message: Any) -> bytes:
    return pickle.dumps(message, protocol=5)


def decode(data: bytes) -> Any:
    return pickle.loads(data)
