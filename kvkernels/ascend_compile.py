"""Compile the ascend backend's kernels for an Ascend target without CANN: the static check.

triton-ascend lowers a kernel to Triton IR, then (triton-adapter-opt) to the Linalg/HIVM form
that ascendnpu-ir's `bishengir-compile` takes. bishengir then runs HFusion and HIVM, plans
every on-chip buffer (Unified Buffer, L1, L0) and stops before its last step, `hivmc`, which
only CANN ships. A kernel whose buffers do not fit makes it report "Ub overflow"; one that
fits reaches "External hivmc run fails". The memory plan it saved (`--save-temps`) places
each buffer with `hivm.hir.pointer_cast(offset, ...) : memref<shape x type, address_space>`:
the highest offset + size per address space is the kernel's footprint.

Needs the `make ascend-env` venv (triton-ascend 3.2.0, ascendnpu-ir 1.2.0); nothing here is
imported by the backend itself.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError

TARGET = "Ascend910B3"
UB_BYTES = 192 * 1024  # per vector core, as bishengir's Ascend910B3 spec says (UB_SIZE in bits)
L1_BYTES = 512 * 1024  # per AI core (L1_SIZE)
LOWERING_ATTEMPTS = 3
REACHED_LAST_STEP = "External hivmc run fails"
UB_OVERFLOW = "Ub overflow"

_TARGET_ENTRY = re.compile(r'#dlti\.dl_entry<"(\w+_SIZE)", (\d+) : i32>')
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1}
_CONSTANT = re.compile(r"(%c\w+) = arith\.constant (-?\d+) : i64")
_BUFFER = re.compile(
    r"hivm\.hir\.pointer_cast\(([^)]*)\)[^:]*: memref<([^,>]+), #hivm\.address_space<(\w+)>>"
)


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What bishengir-compile said about one kernel at one set of constants."""

    kernel: str
    reached_last_step: bool  # stopped only for want of CANN's hivmc
    ub_overflow: bool
    ub_bytes: int  # highest planned UB offset + size
    l1_bytes: int  # the same for L1 (cbuf): Cube-core operands of tl.dot
    mix_mode: str  # "aiv": Vector cores only; "mix": Cube + Vector
    target_bytes: dict[str, int]  # the target's buffer sizes as bishengir states them (UB, L1...)
    log: str

    @property
    def passed(self) -> bool:
        """Reached the last step with every buffer inside UB and L1."""
        return (
            self.reached_last_step
            and not self.ub_overflow
            and self.ub_bytes <= UB_BYTES
            and self.l1_bytes <= L1_BYTES
        )


def bishengir_compile_path() -> Path:
    """The `bishengir-compile` that the ascendnpu-ir package ships; KvlabError without it."""
    try:
        package = importlib.import_module("ascendnpuir")
    except ImportError as err:
        raise KvlabError(
            "the Ascend static check needs ascendnpu-ir (make ascend-env installs it)"
        ) from err
    path = Path(str(package.__file__)).parent / "bin" / "bishengir-compile"
    if not path.is_file():
        raise KvlabError(f"ascendnpu-ir is installed but {path} is missing")
    return path


def compile_kernel(
    fn: Any, signature: dict[str, str], constants: dict[str, int], target: str = TARGET
) -> CompileResult:
    """Lower `fn` with these argument types and constexprs for `target`, run bishengir on it."""
    fn = compilable(fn)
    linalg, mix_mode = _lower(fn, signature, constants, target)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ttadapter.mlir"
        source.write_text(linalg)
        temps = Path(tmp) / "temps"
        temps.mkdir()
        result = subprocess.run(
            [
                str(bishengir_compile_path()),
                str(source),
                *_bishengir_options(target),
                f"--save-temps={temps}",
                "-o",
                str(Path(tmp) / "kernel"),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": os.environ.get("PATH", "")},
        )
        log = result.stdout + result.stderr
        plans = [p.read_text() for p in temps.glob("*.mlir")]
    footprint = _footprint("\n".join(plans))
    return CompileResult(
        kernel=fn.__name__,
        reached_last_step=REACHED_LAST_STEP in log,
        ub_overflow=UB_OVERFLOW in log,
        ub_bytes=footprint.get("ub", 0),
        l1_bytes=footprint.get("cbuf", 0),
        mix_mode=mix_mode,
        target_bytes=_target_sizes("\n".join(plans)),
        log=log,
    )


def compilable(fn: Any) -> Any:
    """The JIT function of a kernel, also when TRITON_INTERPRET=1 made it an interpreted one."""
    if hasattr(fn, "params"):
        return fn
    jit = importlib.import_module("triton.runtime.jit")
    return jit.JITFunction(fn.fn)


def _lower(
    fn: Any, signature: dict[str, str], constants: dict[str, int], target: str
) -> tuple[str, str]:
    """_to_linalg, tried up to LOWERING_ATTEMPTS times: triton-adapter-opt 3.2.0 was seen to
    die of SIGSEGV now and then on a busy machine, then lower the same kernel on the next try."""
    for attempt in range(1, LOWERING_ATTEMPTS + 1):
        try:
            return _to_linalg(fn, signature, constants, target)
        except subprocess.CalledProcessError:
            if attempt == LOWERING_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _to_linalg(
    fn: Any, signature: dict[str, str], constants: dict[str, int], target: str
) -> tuple[str, str]:
    """triton-ascend's own first stages (ttir, ttadapter) and its metadata step, for `target`."""
    compiler = importlib.import_module("triton.compiler.compiler")
    backends = importlib.import_module("triton.backends.compiler")
    ascend = importlib.import_module("triton.backends.ascend.compiler")
    libtriton = importlib.import_module("triton._C.libtriton")
    gpu_target = backends.GPUTarget("npu", target, 0)
    backend = ascend.AscendBackend(gpu_target)
    options = backend.parse_options({})
    context = libtriton.ir.context()
    libtriton.ir.load_dialects(context)
    backend.load_dialects(context)
    source = compiler.ASTSource(fn, signature=signature, constants=constants)
    module = source.make_ir(
        options, backend.get_codegen_implementation(), backend.get_module_map(), context
    )
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options)
    metadata = {"hash": fn.__name__, "target": gpu_target, **options.__dict__}
    module = stages["ttir"](module, metadata)
    linalg = stages["ttadapter"](module, metadata)
    linalg, metadata = ascend._parse_linalg_metadata(linalg, metadata)
    return linalg, str(metadata["mix_mode"])


def _bishengir_options(target: str) -> list[str]:
    """The A2/A3 options triton-ascend 3.2.0 passes by default (multi-buffer, sub-block bind)."""
    return [
        f"--target={target}",
        "--enable-auto-multi-buffer=true",
        "--enable-auto-bind-sub-block=true",
        "--enable-hfusion-compile=true",
        "--enable-hivm-compile=true",
        "--enable-triton-kernel-compile=true",
    ]


def _target_sizes(plan: str) -> dict[str, int]:
    """The target description's buffer sizes, in bytes (bishengir states them in bits)."""
    return {name: int(bits) // 8 for name, bits in _TARGET_ENTRY.findall(plan)}


def _footprint(plan: str) -> dict[str, int]:
    """Highest planned offset + size per address space, in bytes, over the memory plan."""
    constants = {name: int(value) for name, value in _CONSTANT.findall(plan)}
    top: dict[str, int] = {}
    for args, memref, space in _BUFFER.findall(plan):
        *shape, element = memref.split("x")
        if "?" in shape or element not in _ELEMENT_BYTES:
            continue  # a dynamic or opaque buffer carries no size here
        dims = [int(d) for d in shape]
        size = math.prod(dims) * _ELEMENT_BYTES[element]
        offsets = [constants.get(a.strip(), 0) for a in args.split(",") if a.strip()]
        top[space] = max(top.get(space, 0), *(offset + size for offset in offsets or [0]))
    return top


@dataclass(frozen=True, slots=True)
class HeadShape:
    """The attention shape a static check compiles for."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # Triton's element name of the queries (and float caches): "bf16", "fp16", "fp32"
    kv_dtype: str = ""  # "i8": int8 pages (kv_cache_dtype int8, C8); "": caches in `dtype`

    @property
    def c8(self) -> bool:
        """True for int8 pages with per-channel scales (kv_cache_dtype int8)."""
        return self.kv_dtype == "i8"


LLAMA3_8B = HeadShape(num_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16")
LLAMA3_8B_C8 = HeadShape(num_heads=32, num_kv_heads=8, head_dim=128, dtype="bf16",
                         kv_dtype="i8")
STATIC_CHECK_PAGE_SIZES = (16, 32, 64, 128, 256, 512)


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel as the backend launches it: argument types and constexprs."""

    fn: Any
    signature: dict[str, str]
    constants: dict[str, int]


def backend_kernels(page_size: int, shape: HeadShape) -> list[KernelSpec]:
    """The ascend backend's four kernels with the tiles it picks for this page size and shape."""
    tiles = importlib.import_module("kvlab.kernels.ascend_tiles")
    kernels = importlib.import_module("kvlab.kernels.ascend_kernels")
    heads = (page_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.c8)
    page_numel = page_size * shape.num_kv_heads * shape.head_dim
    kv = f"*{shape.kv_dtype or shape.dtype}"  # pages, and the rows write_kv stores in them
    pointers = {name: kv for name in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")}
    pointers.update(q_ptr=f"*{shape.dtype}", out_ptr=f"*{shape.dtype}")
    pointers.update({f"{side}_{k}_ptr": kv for side in ("src", "dst") for k in "kv"})
    # the C8 scales; float pages pass their caches in their place (unused)
    pointers.update(k_scale_ptr="*fp32" if shape.c8 else kv, v_scale_ptr="*fp32" if shape.c8
                    else kv)
    pointers.update(slot_ptr="*i64", src_ids_ptr="*i64", dst_ids_ptr="*i64", scale="fp32")
    launches = [
        (kernels.write_kv_kernel, tiles.write_kv_constants(shape.num_kv_heads, shape.head_dim)),
        (kernels.decode_kernel, tiles.decode_constants(*heads)),
        (kernels.prefill_kernel, tiles.prefill_constants(*heads)),
        (kernels.move_pages_kernel, tiles.move_pages_constants(page_numel)),
    ]
    return [
        KernelSpec(compilable(fn), _signature(compilable(fn), pointers), constants)
        for fn, constants in launches
    ]


def _signature(fn: Any, types: dict[str, str]) -> dict[str, str]:
    """Every runtime argument's type: pointers and floats from `types`, the rest int32
    (metadata tables, counts and strides are int32, as the backend passes them)."""
    return {
        p.name: types.get(p.name, "*i32" if p.name.endswith("_ptr") else "i32")
        for p in fn.params
        if not p.is_constexpr
    }


@dataclass(frozen=True, slots=True)
class CheckRow:
    """One line of the static check: a kernel at a page size."""

    page_size: int
    constants: dict[str, int]
    result: CompileResult


def static_check(
    page_sizes: tuple[int, ...] = STATIC_CHECK_PAGE_SIZES,
    shape: HeadShape = LLAMA3_8B,
    overrides: dict[str, dict[str, int]] | None = None,
) -> list[CheckRow]:
    """Compile every backend kernel at every page size, in a child process.

    The child runs without TRITON_INTERPRET: under the interpreter, kernels are not compilable
    and triton.language is patched for interpretation. `overrides` replaces constexprs of the
    named kernels (to check that an oversized tile does fail).
    """
    request = {"page_sizes": list(page_sizes), "shape": asdict(shape), "overrides": overrides or {}}
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    child = subprocess.run(
        [sys.executable, "-m", "kvlab.kernels.ascend_compile"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the static check's child failed:\n{child.stderr[-4000:]}")
    rows = []
    for line in child.stdout.splitlines():
        row = json.loads(line)
        rows.append(CheckRow(row["page_size"], row["constants"], CompileResult(**row["result"])))
    return rows


def _serve(request: dict[str, Any]) -> None:
    """The child's side of static_check: one JSON line per kernel and page size on stdout."""
    shape = HeadShape(**request["shape"])
    for page_size in request["page_sizes"]:
        for spec in backend_kernels(page_size, shape):
            name = spec.fn.__name__
            constants = {**spec.constants, **request["overrides"].get(name, {})}
            result = compile_kernel(spec.fn, spec.signature, constants)
            line = {"page_size": page_size, "constants": constants, "result": asdict(result)}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    _serve(json.loads(sys.stdin.read()))
