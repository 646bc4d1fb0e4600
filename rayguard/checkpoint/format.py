"""The shard format: a safetensors-compatible file whose metadata holds the state's structure.

Layout (little endian), exactly the safetensors layout, so ``safetensors.safe_open`` reads
the tensors of a shard::

    [8 bytes: n = header length][n bytes: JSON header, space padded][payload bytes]

The JSON header maps tensor names ``"0"``, ``"1"``, ... to ``{dtype, shape, data_offsets}``
and keeps, under ``__metadata__``, ``rayguard.structure``: the nested containers and plain
values of the state as tagged JSON, with each tensor or numpy array replaced by a reference
to its payload entry. Loading parses JSON and copies raw bytes into freshly allocated
tensors: nothing is ever unpickled. dtypes that safetensors has no name for (complex128,
float8 variants it lacks, bit types, ...) are stored as raw ``U8`` bytes; the structure
keeps the true torch dtype and shape for every tensor, so every dtype round-trips.
"""

from __future__ import annotations

import base64
import ctypes
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rayguard.checkpoint import safejson
from rayguard.exceptions import CheckpointCorruptError, SerializationError

FORMAT_NAME = "rayguard-shard"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors limit
MAX_STRUCTURE_DEPTH = 200
"""JSON levels of a state's structure (two per container level): a deeper state is refused
when it is saved, and a deeper header when it is read."""
MAX_ELEMENTS = 1 << 62

_SAFETENSORS_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}  # fmt: skip
_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


@dataclass
class Entry:
    """One payload buffer: a tensor or numpy array, in payload order."""

    kind: str  # "tensor" | "ndarray"
    dtype: str  # torch dtype name ("bfloat16") or numpy dtype string ("<f4")
    shape: tuple[int, ...]
    nbytes: int
    obj: Any = field(default=None, repr=False)  # the source object (writer side only)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or dtype in _QUANTIZED:
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


class _Encoder:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._memo: dict[int, int] = {}

    def encode(self, obj: Any, where: str) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"_": "float", "v": repr(float(obj))}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, where)
        if isinstance(obj, np.ndarray):
            return self._ndarray(obj, where)
        if isinstance(obj, np.generic):
            return {"_": "npscalar", "v": self._ndarray(np.asarray(obj), where)}
        if isinstance(obj, dict):
            keys = [self._key(k, where) for k in obj]
            vals = [self.encode(v, f"{where}[{k!r}]") for k, v in obj.items()]
            return {"_": "dict", "k": keys, "v": vals}
        if isinstance(obj, (list, tuple)):
            tag = "tuple" if isinstance(obj, tuple) else "list"
            return {"_": tag, "v": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        return self._other(obj, where)

    def _other(self, obj: Any, where: str) -> Any:
        if isinstance(obj, complex):
            return {"_": "complex", "v": [repr(obj.real), repr(obj.imag)]}
        if isinstance(obj, (bytes, bytearray)):
            return {"_": "bytes", "v": base64.b64encode(bytes(obj)).decode("ascii")}
        if isinstance(obj, torch.dtype):
            return {"_": "dtype", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):
            return {"_": "device", "v": str(obj)}
        raise SerializationError(
            f"{where}: cannot checkpoint a value of type {type(obj).__module__}.{type(obj).__qualname__}. "
            "A checkpoint state holds tensors, numpy arrays, numbers, strings, bools, None, bytes "
            "and dicts/lists/tuples of them. Fix: convert it (e.g. obj.state_dict(), or a dict of "
            "its fields) before saving."
        )

    def _key(self, key: Any, where: str) -> Any:
        if key is None or isinstance(key, (bool, int, float, str, tuple)):
            return self.encode(key, f"{where} key")
        raise SerializationError(
            f"{where}: dict key {key!r} of type {type(key).__name__} cannot be checkpointed. "
            "Fix: use str, int, float, bool, None or tuple keys."
        )

    def _tensor(self, t: torch.Tensor, where: str) -> Any:
        if id(t) in self._memo:
            return {"_": "ref", "i": self._memo[id(t)]}
        problem = _unsupported_tensor(t)
        if problem:
            raise SerializationError(f"{where}: {problem}")
        entry = Entry("tensor", str(t.dtype).removeprefix("torch."), tuple(t.shape),
                      t.numel() * t.element_size(), t)  # fmt: skip
        node = {"_": "tensor", "i": self._add(t, entry), "dtype": entry.dtype, "shape": list(t.shape)}
        if t.requires_grad:
            node["rg"] = True
        return node

    def _ndarray(self, a: np.ndarray, where: str) -> Any:
        if id(a) in self._memo:
            return {"_": "ref", "i": self._memo[id(a)]}
        if a.dtype.hasobject or a.dtype.fields is not None or a.dtype.kind == "V":
            raise SerializationError(
                f"{where}: numpy array of dtype {a.dtype} cannot be checkpointed "
                "(object/structured dtypes would need pickle). Fix: convert to a numeric array."
            )
        entry = Entry("ndarray", a.dtype.str, tuple(a.shape), int(a.nbytes), a)
        return {"_": "ndarray", "i": self._add(a, entry), "dtype": entry.dtype, "shape": list(a.shape)}

    def _add(self, obj: Any, entry: Entry) -> int:
        self.entries.append(entry)
        self._memo[id(obj)] = len(self.entries) - 1
        return len(self.entries) - 1


def _unsupported_tensor(t: torch.Tensor) -> str:
    desc = f"tensor of dtype {t.dtype}, shape {tuple(t.shape)}, device {t.device}"
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        if type(t).__name__ == "DTensor":
            return (f"{desc} is a DTensor, not a plain tensor. Fix: pass sharded models and "
                    "optimizers as sharded={'model': model, 'optim': opt} (torch.distributed."
                    "checkpoint, reshardable), or save t.full_tensor().")
        return f"{desc} is a {type(t).__name__}, not a plain tensor. Fix: save t.full_tensor() or t.to_local()."
    if t.layout != torch.strided:
        return f"{desc} has layout {t.layout}. Fix: save t.to_dense()."
    if t.is_quantized:
        return f"{desc} is quantized. Fix: save t.dequantize() or its int_repr() with scale/zero point."
    if t.device.type == "meta":
        return f"{desc} is on the meta device and has no data. Fix: materialize it first."
    return ""


def encode(state: Any) -> tuple[Any, list[Entry]]:
    """Split ``state`` into its JSON structure and its payload entries (tensors, arrays)."""
    enc = _Encoder()
    try:
        structure = enc.encode(state, "state")
    except RecursionError:
        structure = None
    if structure is None and state is not None or safejson.depth(structure, MAX_STRUCTURE_DEPTH) > MAX_STRUCTURE_DEPTH:
        raise SerializationError(
            f"state: nested more than {MAX_STRUCTURE_DEPTH // 2} containers deep, which a "
            "checkpoint refuses to read back. Fix: flatten the state (e.g. a dict of lists).")
    return structure, enc.entries


def build_header(structure: Any, entries: list[Entry]) -> bytes:
    """The 8-byte length plus the padded JSON header of a shard holding ``entries``."""
    header: dict[str, Any] = {
        "__metadata__": {
            "format": FORMAT_NAME,
            "format_version": str(FORMAT_VERSION),
            "rayguard.structure": json.dumps(structure, separators=(",", ":"), allow_nan=False),
        }
    }
    offset = 0
    for i, e in enumerate(entries):
        code = _SAFETENSORS_CODES.get(torch_dtype(e.dtype)) if e.kind == "tensor" else None
        shape = list(e.shape) if code else [e.nbytes]
        header[str(i)] = {"dtype": code or "U8", "shape": shape, "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    return len(raw).to_bytes(8, "little") + raw


def parse_header(header: bytes, file_size: int, path: str) -> tuple[Any, list[Entry], int]:
    """Validate a shard header; returns (structure, entries without objects, payload start).

    Total: any bytes give a result or CheckpointCorruptError (sizes, depth and numbers are
    bounded; see :mod:`rayguard.checkpoint.safejson`)."""

    def corrupt(what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{path}: shard header is invalid ({what}); the file is corrupt or not a rayguard shard")

    where = f"{path}: shard header is invalid"
    doc = safejson.loads(header, where, max_bytes=MAX_HEADER_BYTES, max_depth=4)
    try:
        meta = doc.pop("__metadata__")
        if not isinstance(meta, dict) or not isinstance(meta.get("rayguard.structure"), str):
            raise corrupt("no rayguard structure in __metadata__")
        if meta.get("format") != FORMAT_NAME or meta.get("format_version") != str(FORMAT_VERSION):
            raise corrupt(f"format {str(meta.get('format'))[:40]!r} version {str(meta.get('format_version'))[:40]!r}")
        structure = safejson.loads(meta["rayguard.structure"], f"{where} (structure)",
                                   max_bytes=MAX_HEADER_BYTES, max_depth=MAX_STRUCTURE_DEPTH,
                                   top=object)
        entries = _entries_from_structure(structure)
    except CheckpointCorruptError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RuntimeError) as exc:
        raise corrupt(f"{type(exc).__name__}: {str(exc)[:300]}") from None
    start = 8 + len(header)
    offset = 0
    for i, e in enumerate(entries):
        spec = doc.get(str(i))
        if not isinstance(spec, dict) or spec.get("data_offsets") != [offset, offset + e.nbytes]:
            offsets = spec.get("data_offsets") if isinstance(spec, dict) else spec
            raise corrupt(f"tensor {i}: offsets {str(offsets)[:80]} do not match its size")
        offset += e.nbytes
    if len(doc) != len(entries) or start + offset != file_size:
        raise corrupt(f"payload of {offset} bytes after a {start}-byte header does not fill the {file_size}-byte file")
    return structure, entries, start


def _entry(tag: str, node: dict[str, Any]) -> Entry:
    """The payload entry of a ``tensor``/``ndarray`` structure node, with bounded numbers."""
    dims = node["shape"]
    if not isinstance(dims, list) or not isinstance(node["dtype"], str):
        raise ValueError("shape is not a list or dtype is not a string")
    shape = tuple(safejson.int_field(s, "shape", 0, MAX_ELEMENTS) for s in dims)
    if math.prod(max(s, 1) for s in shape) > MAX_ELEMENTS:
        raise ValueError(f"shape {shape} has more than {MAX_ELEMENTS} elements")
    if tag == "tensor":
        itemsize = torch.empty(0, dtype=torch_dtype(node["dtype"])).element_size()
    else:
        itemsize = _numpy_dtype(node["dtype"]).itemsize
    return Entry(tag, node["dtype"], shape, math.prod(shape) * itemsize)


def _entries_from_structure(structure: Any) -> list[Entry]:
    found: dict[int, Entry] = {}
    refs: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            tag = node.get("_")
            if tag == "ref":
                refs.append(safejson.int_field(node["i"], "ref index"))
            if tag in ("tensor", "ndarray"):
                found[safejson.int_field(node["i"], "tensor index")] = _entry(tag, node)
            for key in ("v", "k"):
                children = node.get(key)
                if isinstance(children, list):
                    for child in children:
                        walk(child)
                elif isinstance(children, dict):
                    walk(children)

    walk(structure)
    if sorted(found) != list(range(len(found))) or any(not 0 <= r < len(found) for r in refs):
        raise ValueError("tensor references are not 0..n-1")
    return [found[i] for i in range(len(found))]


def _numpy_dtype(name: str) -> np.dtype:
    if not isinstance(name, str) or len(name) > 16:
        raise ValueError(f"numpy dtype {str(name)[:40]!r} is not allowed")
    dtype = np.dtype(name)
    if (dtype.hasobject or dtype.fields is not None or dtype.kind == "V"
            or dtype.subdtype is not None or dtype.str != name):
        raise ValueError(f"numpy dtype {name!r} is not allowed")
    return dtype


def raw_view(obj: torch.Tensor | np.ndarray, nbytes: int) -> memoryview:
    """A byte view of a contiguous CPU tensor or array, valid while ``obj`` lives."""
    if nbytes == 0:
        return memoryview(b"")
    ptr = obj.data_ptr() if isinstance(obj, torch.Tensor) else obj.ctypes.data
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


def source_buffer(entry: Entry) -> tuple[memoryview, object]:
    """(bytes to write, object that owns them) for a payload entry. Copies GPU data to CPU."""
    obj = entry.obj
    if isinstance(obj, torch.Tensor):
        obj = obj.detach()
        if obj.device.type != "cpu":
            obj = obj.to("cpu")
        obj = obj.resolve_conj().resolve_neg().contiguous()
    else:
        obj = np.ascontiguousarray(obj)
    return raw_view(obj, entry.nbytes), obj


def allocate(entry: Entry) -> tuple[torch.Tensor | np.ndarray, memoryview]:
    """A fresh uninitialized CPU tensor/array for ``entry``, and a writable byte view of it."""
    if entry.kind == "tensor":
        obj: torch.Tensor | np.ndarray = torch.empty(entry.shape, dtype=torch_dtype(entry.dtype))
    else:
        obj = np.empty(entry.shape, dtype=_numpy_dtype(entry.dtype))
    return obj, raw_view(obj, entry.nbytes)


def decode(structure: Any, objects: list[Any]) -> Any:
    """Rebuild the state from its structure and the loaded payload objects."""
    if structure is None or isinstance(structure, (bool, int, float, str)):
        return structure
    tag = structure["_"]
    if tag == "dict":
        return {_freeze(decode(k, objects)): decode(v, objects) for k, v in zip(structure["k"], structure["v"], strict=True)}
    if tag in ("list", "tuple"):
        items = [decode(v, objects) for v in structure["v"]]
        return items if tag == "list" else tuple(items)
    if tag in ("tensor", "ndarray", "ref"):
        obj = objects[structure["i"]]
        if structure.get("rg"):
            obj.requires_grad_(True)
        return obj
    return _decode_scalar(tag, structure["v"], objects)


def _decode_scalar(tag: str, v: Any, objects: list[Any]) -> Any:
    if tag == "float":
        return float(v)
    if tag == "npscalar":
        return decode(v, objects)[()]
    if tag == "complex":
        return complex(float(v[0]), float(v[1]))
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "dtype":
        return torch_dtype(v)
    if tag == "device":
        return torch.device(v)
    raise ValueError(f"unknown structure tag {tag!r}")


def _freeze(key: Any) -> Any:
    return tuple(_freeze(k) for k in key) if isinstance(key, (list, tuple)) else key
