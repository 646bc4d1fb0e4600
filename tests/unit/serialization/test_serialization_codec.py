"""The codec round-trips every dtype bit-exactly through pickle protocol 5 (no Ray)."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from serialization_helpers import bits, roundtrip

from rayguard.exceptions import SerializationError
from rayguard.serialization.codec import TensorHeader, decode, encode
from rayguard.serialization.policy import SerializerPolicy, set_policy

warnings.filterwarnings("ignore", message=".*ComplexHalf.*")
warnings.filterwarnings("ignore", message=".*quantize.*")

ALL_DTYPES = sorted(
    {v for v in vars(torch).values() if isinstance(v, torch.dtype) and not v.is_quantized()}
    if hasattr(torch.dtype, "is_quantized") else
    {v for v in vars(torch).values() if isinstance(v, torch.dtype) and "q" not in str(v)[6:8]},
    key=str,
)
# dtypes with working copy/index kernels: used for strided and non-contiguous cases
COMMON_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64,
                 torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32,
                 torch.uint64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                 torch.bool, torch.complex64, torch.complex128]


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bit patterns (NaNs and infs included), valid for ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    n = 1
    for s in shape:
        n *= s
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def test_every_dtype_torch_has_is_covered() -> None:
    names = {str(d) for d in ALL_DTYPES}
    for must in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2",
                 "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz", "torch.uint16",
                 "torch.uint32", "torch.uint64", "torch.complex32", "torch.bool"):
        assert must in names


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("readonly", [True, False], ids=["out-of-band", "in-band"])
def test_every_dtype_roundtrips_bit_exactly(dtype: torch.dtype, readonly: bool) -> None:
    x = random_tensor(dtype, (3, 5))
    y = roundtrip(x, readonly=readonly)
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == "cpu"
    assert torch.equal(bits(y), bits(x))


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3), (1,), (2, 1, 3)])
def test_zero_dim_and_empty(shape: tuple[int, ...]) -> None:
    for dtype in (torch.bfloat16, torch.float8_e5m2, torch.int64):
        x = random_tensor(dtype, shape)
        y = roundtrip(x)
        assert y.shape == x.shape and y.dtype == dtype
        assert torch.equal(bits(y), bits(x))


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(COMMON_DTYPES),
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_strided_views_with_offsets_roundtrip(dtype, shape, seed, data) -> None:
    base = random_tensor(dtype, tuple(s + 2 for s in shape), seed)
    slices = tuple(
        slice(data.draw(st.integers(0, 1)), None, data.draw(st.integers(1, 2))) for _ in shape
    )
    view = base[slices]
    if view.dim() >= 2 and data.draw(st.booleans()):
        view = view.transpose(0, -1)
    y = roundtrip(view)
    assert y.shape == view.shape and y.dtype == dtype
    assert torch.equal(bits(y), bits(view))


def test_view_ships_only_its_own_elements() -> None:
    base = torch.zeros(1_000_000)
    payload = encode(base[10:20])
    assert memoryview(payload[2]).nbytes == 40  # not the 4 MB storage torch.save would send


def test_requires_grad_and_parameter_kept() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(2, 2, dtype=torch.bfloat16))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    y, q, f = roundtrip([x, p, frozen])
    assert y.requires_grad and y.is_leaf and torch.equal(y, x)
    assert isinstance(q, torch.nn.Parameter) and q.requires_grad and torch.equal(q, p)
    assert isinstance(f, torch.nn.Parameter) and not f.requires_grad


def test_non_leaf_tensor_arrives_as_leaf_with_requires_grad() -> None:
    x = torch.randn(3, requires_grad=True)
    y = roundtrip(x * 2)
    assert y.is_leaf and y.requires_grad and torch.equal(y, (x * 2).detach())


def test_conj_and_neg_views_resolve() -> None:
    z = torch.randn(3, dtype=torch.complex64)
    assert torch.equal(roundtrip(z.conj()), z.conj().resolve_conj())


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    meta: dict


def test_nested_containers_and_shared_tensor() -> None:
    t = torch.arange(6, dtype=torch.bfloat16)
    obj = {"a": [t, (t[2:], Batch(t.view(2, 3), {"k": torch.tensor(1.5)}))], "b": None}
    out = roundtrip(obj)
    assert torch.equal(out["a"][0], t)
    assert torch.equal(out["a"][1][0], t[2:])
    assert isinstance(out["a"][1][1], Batch) and torch.equal(out["a"][1][1].x, t.view(2, 3))
    assert out["a"][1][1].meta["k"].item() == 1.5


def test_sparse_tensors_take_torchs_path() -> None:
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    coo = torch.sparse_coo_tensor(i, torch.tensor([3.0, 4.0, 5.0], dtype=torch.bfloat16), (2, 3))
    csr = torch.randn(4, 5).relu().to_sparse_csr()
    dense = torch.randn(4, 6).relu()
    others = [dense.to_sparse_csc(), dense.to_sparse_bsr((2, 2)), dense.to_sparse_bsc((2, 2))]
    out_coo, out_csr, *out_others = roundtrip([coo, csr, *others])
    assert out_coo.is_sparse and torch.equal(out_coo.to_dense(), coo.to_dense())
    assert out_csr.layout == torch.sparse_csr and torch.equal(out_csr.to_dense(), csr.to_dense())
    for got, sent in zip(out_others, others, strict=True):
        assert got.layout == sent.layout and torch.equal(got.to_dense(), dense)


def test_meta_tensors_take_torchs_path() -> None:
    y = roundtrip(torch.empty(3, 2, device="meta", dtype=torch.bfloat16))
    assert y.device.type == "meta" and y.shape == (3, 2) and y.dtype == torch.bfloat16


def test_python_attributes_kept() -> None:
    t = torch.ones(2)
    t.tag = "weights"
    assert roundtrip(t).tag == "weights"


def test_received_tensor_is_private_to_its_receiver() -> None:
    x = torch.arange(4.0)
    payload = pickle.loads(pickle.dumps(encode(x), protocol=5))  # bytes become a bytearray
    header, data = payload[1], payload[2]
    shared = memoryview(bytes(memoryview(encode(x)[2]))).toreadonly()
    a = decode(("raw", header, shared))
    b = decode(("raw", header, shared))
    a.add_(100)
    assert torch.equal(b, x) and torch.equal(decode(("raw", header, data)), x)


def test_wrong_byte_count_names_dtype_shape_device() -> None:
    header = TensorHeader("bfloat16", (4, 4), "cpu", False, False, None)
    with pytest.raises(SerializationError, match=r"torch\.bfloat16.*\[4, 4\].*cpu.*bytes"):
        decode(("raw", header, memoryview(b"\0" * 7)))


def test_unknown_dtype_is_a_clear_error() -> None:
    header = TensorHeader("float3_e1m1", (2,), "cpu", False, False, None)
    with pytest.raises(SerializationError, match="no dtype torch.float3_e1m1"):
        decode(("raw", header, memoryview(b"\0\0")))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU receiver")
def test_cuda_tensor_on_a_receiver_without_gpu() -> None:
    header = TensorHeader("bfloat16", (2, 3), "cuda:1", False, False, None)
    data = memoryview(b"\0" * 12)
    with pytest.raises(SerializationError, match=r"torch\.bfloat16.*\[2, 3\].*cuda:1.*cuda='cpu'"):
        decode(("raw", header, data))
    set_policy(SerializerPolicy(cuda="cpu"))
    try:
        y = decode(("raw", header, data))
    finally:
        set_policy(None)
    assert y.device.type == "cpu" and y.dtype == torch.bfloat16 and y.shape == (2, 3)
