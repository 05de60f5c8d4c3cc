"""The route: which code computes each part of a token on this machine, decided once.

`current_route()` resolves it on first use from the default device, the MLXSWITCH_KERNELS
setting (the one place the environment is read) and the BLAS threads setting, then every
dispatcher reads the same frozen `Route` instead of testing the device or the environment
itself. `resolve_route()` decides it again (after changing the default device, or in a test
that flips the setting); `kernels_override()` runs a block on another setting.

MLXSWITCH_KERNELS values:
  "auto" (default, or unset): custom kernels and fast routes where they exist and passed checks;
        on a CPU, quantized weights are multiplied as stored by the compiled quantized kernel,
        each row of activations rounded to int8 per 32 inputs for every pass a decoding round
        makes (as llama.cpp does; a step 1.4x faster, bench/bench_int8_accuracy.py measures what
        the rounding changes; a down projection's to int16 on 4-bit codes, else fp32), and fp32
        scales and biases held as fp16 where every scale is in
        fp16's normal range (a layer's weights then as precise as an fp16 model's);
  "exact": as "auto", but the quantized kernel multiplies fp32 activations (exact up to
        summation order) on the scales as loaded;
  "fp32": on a CPU, plain quantized linears keep a resident fp32 copy multiplied by the compiled
        panel kernel (4 bytes a weight: the route before the quantized kernel, for A/B runs);
  "blas": as "fp32", but the fp32 copies go through NumPy's BLAS, not the panel kernel;
  "reference": every dispatcher returns its plain-mx reference (to rule the kernels out of a bug);
  "mx": only MLX computes (no NumPy route), results stay lazy and traceable: on a CPU, the
        route a Mac takes, minus its Metal kernels (docs/platforms.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import mlx.core as mx

from .panel_cpu import build_panel_kernel
from .pass_ops import build_pass_ops
from .quant_cpu import build_quant_kernel

KERNELS_ENV = "MLXSWITCH_KERNELS"
SETTINGS = ("auto", "exact", "fp32", "blas", "reference", "mx")
BACKENDS = ("metal", "cuda", "cpu")


def parse_kernels_setting(value: str | None) -> str:
    """A MLXSWITCH_KERNELS value as one of SETTINGS (unset or empty: "auto"); ValueError otherwise."""
    setting = (value or "").strip().lower() or "auto"
    if setting not in SETTINGS:
        raise ValueError(f"{KERNELS_ENV}={setting!r}: expected one of {', '.join(SETTINGS)}")
    return setting


# The device tests, one function each so that a test can fake a machine it does not have.
def _default_is_gpu() -> bool:
    return mx.default_device().type == mx.DeviceType.gpu


def _metal_available() -> bool:
    return bool(mx.metal.is_available())


def _cuda_available() -> bool:
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def detect_backend() -> str:
    """The backend the default device computes on: "metal", "cuda" or "cpu"."""
    if not _default_is_gpu():
        return "cpu"
    # MLX has two GPU backends; a GPU that is not Metal is CUDA's.
    return "metal" if _metal_available() else "cuda"


# What `describe` says for each field's values.
_WORDS = {
    "backend": {"metal": "metal (Apple GPU)", "cuda": "cuda (MLX's CUDA backend)", "cpu": "cpu"},
    "signals": {
        "metal-kernel": "fused Metal kernel (checked on first use; mx ops on a mismatch)",
        "compiled": "compiled pass operations (pass_ops.c), read from the logits",
        "numpy": "NumPy, read from the logits",
        "mx-ops": "mx ops (the reference)",
    },
    "plain_linears": {
        "mlx-module": "MLX's own nn.QuantizedLinear",
        "quant-kernel": "compiled quantized kernel on the stored codes (no fp32 copy; checked on load)",
        "resident-fp32": "resident fp32 NumPy copy where it fits (see resident_product), else the rows route",
        "rows": "rows route (MLX's quantized matmul below the multi-row floor)",
    },
    "quant_activations": {
        "fp32": "fp32 (exact up to summation order; MLXSWITCH_KERNELS=exact)",
        "int8": "int8 per 32 inputs for decoding's passes (up to 33 rows; 4-bit down projections int16), "
        "fp32 for prefill",
        "none": "no quantized kernel",
    },
    "quant_scales": {
        "fp16": "fp16 where every scale of a layer is in fp16's normal range, else as loaded",
        "stored": "as loaded (fp32 on a CPU; MLXSWITCH_KERNELS=exact)",
        "none": "no quantized kernel",
    },
    "resident_product": {
        "panel-kernel": "compiled C panel kernel: each weight read once for 1-6 rows (checked on load)",
        "numpy-blas": "NumPy's BLAS (sgemv, padded sgemm)",
        "none": "no resident copies",
    },
    "nested": {
        "quant-kernel": "compiled quantized kernel, one product a plane",
        "metal-kernel": "fused Metal mat-vec for 2+ planes, ≤ 4 rows (checked on first use); "
        "else quantized_matmul a plane",
        "reference": "quantized_matmul a plane (many rows on a CPU: multi_row)",
    },
    "pass_ops": {
        "compiled": "compiled C (pass_ops.c): RMSNorm, RoPE, attention and silu·up of a decoding pass "
        "(checked on load)",
        "numpy": "NumPy",
        "none": "MLX's own (no NumPy blocks)",
    },
    "multi_row": {
        "numpy-blas": "dequantized fp32 + NumPy BLAS",
        "mx-dense": "dequantized fp32 + MLX matmul where it pays",
        "reference": "quantized_matmul (no dense route)",
    },
}


@dataclass(frozen=True)
class Route:
    """Which code computes each part of a token here. Read by the dispatchers, never re-decided.

    backend: "metal" | "cuda" | "cpu" — the default device's backend.
    metal: whether Metal is present (its kernels can run on a GPU stream, whatever the default).
    kernels: the MLXSWITCH_KERNELS setting (one of SETTINGS).
    signals: per-token entropy/varentropy/margin — "metal-kernel" (checked on first use, the mx
        reference on a mismatch), "compiled" (eager, from the logits, by the pass operations where
        they built: pass_ops.c), "numpy" (eager, from the logits) or "mx-ops" (the reference).
    plain_linears: a plain quantized linear — "mlx-module" (MLX's own nn.QuantizedLinear),
        "quant-kernel" (the compiled quant_rows.c on the stored codes, where it built and passed
        its check), "resident-fp32" (a resident fp32 NumPy copy where it fits in memory, multiplied as
        resident_product says; else "rows") or "rows" (our module: the multi-row route, MLX's
        quantized matmul otherwise).
    quant_activations: what the quantized kernel multiplies the codes with — "int8" (x rounded
        per 32 inputs for decoding's passes, to int16 for 4-bit down projections; fp32 for
        prefill), "fp32" (exact up to summation order) or "none".
    quant_scales: how the quantized kernel holds a layer's scales and biases — "fp16" (fp32 ones
        narrowed on load where every scale is in fp16's normal range: a weight s·q + b then as
        precise as an fp16 model's, ~1 bit a weight less to read and hold), "stored" or "none".
    resident_product: a product on a resident fp32 copy — "panel-kernel" (the compiled
        panel_rows.c, where it built and passed its check), "numpy-blas" or "none" (no copies).
    nested: a nested-gear product — "quant-kernel" (a CPU: the compiled kernel, one product a
        plane, any row count), "metal-kernel" (the fused mat-vec for 2+ planes and few rows,
        checked on first use) or "reference" (one quantized_matmul a plane, or multi_row's rule).
    pass_ops: a decoding pass's RMSNorm, RoPE, attention and silu·up on the CPU's NumPy blocks —
        "compiled" (pass_ops.c, where it built and passed its check; MLXSWITCH_KERNELS=auto), "numpy"
        (the reference arithmetic: exact, fp32, blas) or "none" (no NumPy blocks).
    multi_row: a product of many rows — "numpy-blas" (dequantized fp32 + NumPy's BLAS),
        "mx-dense" (dequantized fp32 + MLX's matmul where it pays) or "reference".
    blas_threads: the BLAS threads a NumPy product of THREADED_MIN_ROWS+ rows may use (--threads).
    compute_dtype: "float32" (every float cast on load) or None (the checkpoint's own).
    """

    backend: str
    metal: bool
    kernels: str
    signals: str
    plain_linears: str
    quant_activations: str
    quant_scales: str
    resident_product: str
    nested: str
    pass_ops: str
    multi_row: str
    blas_threads: int
    compute_dtype: str | None

    @property
    def on_gpu(self) -> bool:
        """Whether the default device is a GPU."""
        return self.backend != "cpu"

    @property
    def force_reference(self) -> bool:
        """Whether MLXSWITCH_KERNELS=reference puts every dispatcher on its reference."""
        return self.kernels == "reference"

    @property
    def numpy_allowed(self) -> bool:
        """Whether a dispatcher may hand work to NumPy (a CPU with MLXSWITCH_KERNELS=auto or blas)."""
        return self.backend == "cpu" and self.kernels in ("auto", "exact", "fp32", "blas")

    @property
    def lazy_passes(self) -> bool:
        """Whether a model's pass stays a lazy MLX graph until it is read (no NumPy route), so
        that queuing the next pass before reading this one overlaps host work with it."""
        return not self.numpy_allowed

    def mx_compute_dtype(self) -> mx.Dtype | None:
        """compute_dtype as an mx dtype (None: keep the checkpoint's)."""
        return None if self.compute_dtype is None else getattr(mx, self.compute_dtype)

    def record(self) -> dict:
        """The route as a JSON-ready dict (one key per field)."""
        return asdict(self)

    def describe(self) -> list[tuple[str, str]]:
        """One (field, value in words) line per field, as `mlxswitch doctor` prints them."""
        lines = []
        for key, value in self.record().items():
            if key == "compute_dtype":
                text = value or "the checkpoint's"
            elif key == "kernels":
                text = f"{value} ({KERNELS_ENV})"
            elif key == "metal":
                text = "available" if value else "not available"
            elif key == "plain_linears" and self.kernels in ("auto", "exact") and self.backend == "cpu":
                # Why the quantized kernel is (or is not) in use: compiler and flags, or what failed.
                text = f"{_WORDS[key][value]}; build: {build_quant_kernel().detail}"
            elif key == "resident_product" and value != "none" and self.kernels in ("auto", "exact", "fp32"):
                text = f"{_WORDS[key][value]}; build: {build_panel_kernel().detail}"
            elif key == "pass_ops" and self.kernels == "auto" and self.backend == "cpu":
                text = f"{_WORDS[key][value]}; build: {build_pass_ops().detail}"
            else:
                text = _WORDS.get(key, {}).get(value, str(value))
            lines.append((key, text))
        return lines


def route_for(
    backend: str,
    kernels: str = "auto",
    *,
    metal: bool | None = None,
    blas_threads: int = 1,
    panel_kernel: bool = False,
    quant_kernel: bool = False,
    pass_ops: bool = False,
) -> Route:
    """The route a machine with `backend` takes under a kernels setting (pure: reads no device);
    `panel_kernel`, `quant_kernel`, `pass_ops`: whether each compiled kernel built and passed its
    check here."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    kernels = parse_kernels_setting(kernels)
    metal = backend == "metal" if metal is None else metal
    reference = kernels == "reference"
    numpy = backend == "cpu" and kernels in ("auto", "exact", "fp32", "blas")
    quantized = backend == "cpu" and kernels in ("auto", "exact") and quant_kernel
    compiled_ops = numpy and pass_ops and kernels == "auto"
    if backend == "cpu":
        signals = "compiled" if compiled_ops else "numpy" if numpy else "mx-ops"
        # Our module on every plain linear (the same arrays): the quantized kernel reads them as
        # stored; without it, resident fp32 copies (where NumPy may run) or the multi-row route.
        plain = "quant-kernel" if quantized else "resident-fp32" if numpy else "rows"
        multi_row = "reference" if reference else "numpy-blas" if numpy else "mx-dense"
    else:
        # A GPU: MLX's own modules and ops; only the Metal kernels are ours.
        signals = "metal-kernel" if backend == "metal" and metal and not reference else "mx-ops"
        plain, multi_row = "mlx-module", "reference"
    if plain != "resident-fp32":
        resident = "none"
    else:
        resident = "panel-kernel" if panel_kernel and kernels in ("auto", "exact", "fp32") else "numpy-blas"
    if quantized:
        nested = "quant-kernel"
    else:
        nested = "metal-kernel" if backend == "metal" and metal and not reference else "reference"
    return Route(
        backend=backend,
        metal=metal,
        kernels=kernels,
        signals=signals,
        plain_linears=plain,
        quant_activations=("fp32" if kernels == "exact" else "int8") if quantized else "none",
        quant_scales=("stored" if kernels == "exact" else "fp16") if quantized else "none",
        resident_product=resident,
        nested=nested,
        pass_ops=("compiled" if compiled_ops else "numpy") if numpy else "none",
        multi_row=multi_row,
        blas_threads=blas_threads,
        # On MLX's CPU backend bf16 is slower with wrong reductions, and fp16 quantization scales
        # make quantized_matmul many times slower; fp32 is the fast, correct choice there.
        compute_dtype="float32" if backend == "cpu" else None,
    )


_ROUTE: Route | None = None


def resolve_route(
    kernels: str | None = None, backend: str | None = None, *, blas_threads: int | None = None
) -> Route:
    """Decide the route again and make it current: `kernels` (default: MLXSWITCH_KERNELS, read
    here), `backend` (default: the default device's); the BLAS threads setting carries over."""
    setting = parse_kernels_setting(os.environ.get(KERNELS_ENV) if kernels is None else kernels)
    if blas_threads is None:
        # Every core by default: two threads were faster at every row count on a quiet machine
        # (bench/results/threads-qwen.txt); --threads (set_blas_threads) overrides it.
        blas_threads = _ROUTE.blas_threads if _ROUTE is not None else available_cores()
    # A named backend is a machine the test imagines: its Metal is the backend's own.
    metal = _metal_available() if backend is None else None
    backend = detect_backend() if backend is None else backend
    # A kernel is compiled (or loaded from the machine's cache) only where the route would use it:
    # the panel kernel only where the quantized one is not in use.
    quant = backend == "cpu" and setting in ("auto", "exact") and build_quant_kernel().kernel is not None
    panel = (
        backend == "cpu"
        and setting in ("auto", "exact", "fp32")
        and not quant
        and build_panel_kernel().kernel is not None
    )
    ops = backend == "cpu" and setting == "auto" and build_pass_ops().ops is not None
    route = route_for(
        backend,
        setting,
        metal=metal,
        blas_threads=blas_threads,
        panel_kernel=panel,
        quant_kernel=quant,
        pass_ops=ops,
    )
    use_route(route)
    return route


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def current_route() -> Route:
    """The route in force (resolved on first use)."""
    return _ROUTE if _ROUTE is not None else resolve_route()


def use_route(route: Route | None) -> None:
    """Make `route` current (None: resolve again on next use)."""
    global _ROUTE
    _ROUTE = route


def set_route_threads(threads: int) -> Route:
    """The current route with `threads` BLAS threads, made current."""
    route = replace(current_route(), blas_threads=threads)
    use_route(route)
    return route


@contextmanager
def kernels_override(kernels: str) -> Iterator[Route]:
    """Run the block on the route of another MLXSWITCH_KERNELS setting, then restore the route."""
    before = _ROUTE
    try:
        yield resolve_route(kernels)
    finally:
        use_route(before)
