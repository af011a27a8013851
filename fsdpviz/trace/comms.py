"""Which events are communication, which collective they are, and how many bytes they move.

Names repeat (a trace has thousands of events but a few hundred distinct names), so the name-based
rules run once per distinct name and the result is mapped onto the events; only the few events that
carry per-event facts (``Collective name``, message sizes, input shapes) are looked at one by one.

Rules (see docs/concepts.md):
- GPU kernels named ``nccl...Kernel...`` are communication (NCCL ``ncclKernel_AllGather_...``,
  NCCL >= 2.19 ``ncclDevKernel_ReduceScatter_...``, RCCL ``ncclDevKernel_Generic``). The collective
  comes from the ``Collective name`` arg copied from ``record_param_comms`` when present, else from
  the kernel name; ``Generic`` without that arg is ``other``.
- CPU events that run or issue a collective: ``gloo:all_gather`` and friends (they run on gloo
  worker threads), ``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``, ``c10d::allreduce_``,
  ``_c10d_functional::*`` ops, ``nccl:*`` annotations and ``record_param_comms``.
- Bytes: the larger of ``In msg nelems`` / ``Out msg nelems`` times the dtype size (i.e. the
  unsharded size: the output of a gather, the input of a reduce-scatter); else the largest tensor in
  ``Input Dims``/``Input type``; a ``gloo:all_gather`` only sees its shard, so its bytes are the shard
  times the group size.
"""

from __future__ import annotations

import math
import re
from typing import Final

from fsdpviz import vocabulary
from fsdpviz.trace import schema

NCCL_KERNEL_RE: Final = re.compile(r"^nccl\w*Kernel")
_KERNEL_COLLECTIVE_RE: Final = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
# Host backends run a collective on a CPU thread of their own, also for CUDA tensors (copied
# through host memory): the op there is the collective's whole duration.
HOST_BACKEND_PREFIXES: Final = ("gloo:", "mpi:")
_CPU_COMM_PREFIXES: Final = (*HOST_BACKEND_PREFIXES, "nccl:", "c10d::", "_c10d_functional::", "c10d_functional::")
_NOT_COMM_CPU: Final = ("wait", "work", "barrier_wait", "monitored", "new_group", "init")
RECORD_PARAM_COMMS: Final = "record_param_comms"

# Ordered: the first token found in the squashed (lower-case, letters only) name wins.
_COLLECTIVE_TOKENS: Final = (
    ("reducescatter", vocabulary.REDUCE_SCATTER),
    ("allgather", vocabulary.ALL_GATHER),
    ("allreduce", vocabulary.ALL_REDUCE),
    ("alltoall", vocabulary.ALL_TO_ALL),
    ("broadcast", vocabulary.BROADCAST),
    ("sendrecv", vocabulary.SEND_RECV),
    ("barrier", vocabulary.BARRIER),
    ("reduce", vocabulary.REDUCE),
    ("send", vocabulary.SEND_RECV),
    ("recv", vocabulary.SEND_RECV),
    ("gather", vocabulary.OTHER_COMM),
    ("scatter", vocabulary.OTHER_COMM),
)

# PyTorch ScalarType names (record_param_comms ``dtype``) and C++ type names (``Input type``), as
# torch spells the dtype; and each dtype's size.
_TORCH_DTYPE: Final = {
    "float": "float32", "float32": "float32", "double": "float64", "float64": "float64", "half": "float16",
    "float16": "float16", "c10::half": "float16", "bfloat16": "bfloat16", "c10::bfloat16": "bfloat16",
    "long": "int64", "long int": "int64", "int64": "int64", "int": "int32", "int32": "int32", "short": "int16",
    "short int": "int16", "int16": "int16", "char": "int8", "signed char": "int8", "int8": "int8", "byte": "uint8",
    "unsigned char": "uint8", "uint8": "uint8", "bool": "bool", "complexfloat": "complex64",
    "c10::complex<float>": "complex64", "complexdouble": "complex128", "c10::complex<double>": "complex128",
    "unsigned int": "uint32", "uint32": "uint32", "unsigned long": "uint64", "uint64": "uint64",
    "unsigned short": "uint16", "uint16": "uint16",
}
_ITEM_BYTES: Final = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "uint32": 4, "uint64": 8, "uint16": 2,
}


def collective_from_text(text: str) -> str:
    """Normalise a collective's spelling (``_allgather_base``, ``AllGather``, ``reduce_scatter_tensor``).

    Returns one of ``vocabulary.COLLECTIVES``; ``other`` when nothing is recognised.
    """
    squashed = re.sub(r"[^a-z]", "", text.lower())
    for token, comm in _COLLECTIVE_TOKENS:
        if token in squashed:
            return comm
    return vocabulary.OTHER_COMM


def classify_kernel_name(name: str) -> str:
    """Collective of a GPU kernel from its name, ``""`` when it is not a communication kernel."""
    if not NCCL_KERNEL_RE.match(name):
        return ""
    match = _KERNEL_COLLECTIVE_RE.match(name)
    if match is None or match.group(1) == "Generic":
        return vocabulary.OTHER_COMM
    return collective_from_text(match.group(1))


def classify_cpu_name(name: str) -> str:
    """Collective a CPU op or annotation runs or issues, ``""`` when it is not communication."""
    if name == RECORD_PARAM_COMMS:
        return vocabulary.OTHER_COMM  # refined per event from its ``Collective name`` arg
    if not name.startswith(_CPU_COMM_PREFIXES):
        return ""
    op = name.split(":")[-1].lower()
    if any(word in op for word in _NOT_COMM_CPU):
        return ""
    comm = collective_from_text(op)
    # Other c10d ops (e.g. c10d::allreduce_coalesced_ is fine, c10d::foo is not a collective).
    if comm == vocabulary.OTHER_COMM and not name.startswith((*HOST_BACKEND_PREFIXES, "nccl:")):
        return ""
    return comm


def is_gloo_op(name: str) -> bool:
    """A collective as run by a gloo worker thread."""
    return name.startswith("gloo:")


def is_host_backend_op(name: str) -> bool:
    """A collective as run by a host backend's own thread (gloo, MPI), on CPU or CUDA tensors."""
    return name.startswith(HOST_BACKEND_PREFIXES)


def dtype_bytes(dtype: str | None) -> int | None:
    """Size in bytes of one element of a PyTorch/C++ dtype name, None when unknown."""
    name = torch_dtype_name(dtype)
    if name.startswith("float8"):
        return 1
    return _ITEM_BYTES.get(name)




def torch_dtype_name(dtype: str | None) -> str:
    """A PyTorch / C++ dtype name as torch spells it (``c10::BFloat16`` -> ``bfloat16``), "" if unknown."""
    if not dtype:
        return ""
    key = dtype.strip().lower()
    if "float8" in key:
        return key.removeprefix("c10::")
    return _TORCH_DTYPE.get(key, "")


def largest_input_dtype(dims: object, types: object) -> str:
    """torch's name of the largest tensor argument's dtype in ``Input Dims``/``Input type``, "" if unknown."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return ""
    best, name = 0, ""
    for arg_dims, type_name in zip(dims, types):
        numel = _numel(arg_dims)
        if numel and isinstance(type_name, str) and numel > best and torch_dtype_name(type_name):
            best, name = numel, torch_dtype_name(type_name)
    return name


def bytes_from_nelems(in_nelems: int | None, out_nelems: int | None, dtype: str | None) -> int:
    """Unsharded message bytes from ``record_param_comms`` args, ``UNKNOWN_BYTES`` if incomplete."""
    size = dtype_bytes(dtype)
    nelems = max(in_nelems or 0, out_nelems or 0)
    if size is None or nelems <= 0:
        return schema.UNKNOWN_BYTES
    return _fits_int64(nelems * size)


def _fits_int64(nbytes: int) -> int:
    """Sizes from damaged args can exceed any real message (and the int64 column): unknown then."""
    return nbytes if nbytes < 2**63 else schema.UNKNOWN_BYTES


def _numel(dims: object) -> int | None:
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        return math.prod(dims) if dims else None  # [] is a scalar argument, not a tensor
    if isinstance(dims, list) and dims and all(isinstance(d, list) for d in dims):
        parts = [_numel(d) for d in dims]  # a TensorList: the tensors move together
        return sum(p for p in parts if p) or None
    return None


def payload_numel(name: str, comm: str, dims: object) -> int:
    """Elements of the tensor a host backend runs a collective on, -1 when ``Input Dims`` do not say.

    A gloo op's ``Input Dims`` are that tensor (a gather's shard). An issuing op lists its output and
    input (and scalars): a gather hands the backend its smallest tensor (the shard), every other
    collective its largest (a reduce-scatter's whole input, which gloo all-reduces). Ops of
    different process groups move tensors of different sizes (a 4-byte flag, a block's gradients,
    an activation), which is what keeps them apart where the trace names no group.
    """
    if not isinstance(dims, list):
        return -1
    sizes = [n for n in (_numel(d) for d in dims) if n]
    if not sizes:
        return -1
    numel = max(sizes) if is_host_backend_op(name) or comm != vocabulary.ALL_GATHER else min(sizes)
    return numel if numel < 2**63 else -1  # damaged dims: no real tensor


def bytes_from_inputs(dims: object, types: object, *, multiplier: int = 1) -> int:
    """Largest tensor argument in ``Input Dims``/``Input type`` in bytes, times ``multiplier``."""
    if not isinstance(dims, list):
        return schema.UNKNOWN_BYTES
    type_list = types if isinstance(types, list) else []
    best = schema.UNKNOWN_BYTES
    for i, arg_dims in enumerate(dims):
        numel = _numel(arg_dims)
        type_name = type_list[i] if i < len(type_list) else None
        size = dtype_bytes(type_name) if isinstance(type_name, str) else None
        if numel and size:
            best = max(best, numel * size)
    if best == schema.UNKNOWN_BYTES:
        return best
    return _fits_int64(best * max(multiplier, 1))
