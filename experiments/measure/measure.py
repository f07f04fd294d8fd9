#!/usr/bin/env python
"""Per-operator microbenchmarks in servesim's native calibration CSV format.

Writes one row per measurement with the columns

    op,dtype,m,k,n,bytes,gpus,time_us,device,torch_version

(see ``experiments/measure/README.md`` for what each op measures and which fields it fills), which
``servesim calibrate --operators FILE`` reads.

Single process (compute ops):       python experiments/measure/measure.py --out h100.csv
Collectives (one process per GPU):  torchrun --nproc-per-node 8 experiments/measure/measure.py \\
                                        --collectives --out h100-nccl.csv
CPU smoke run (no CUDA, seconds):   python experiments/measure/measure.py --out ops.csv --device cpu

On CUDA every point is timed with CUDA events (warm-up, then the median of ``--repeats`` runs, the L2
cache flushed before each run); on the CPU a tiny grid is timed with ``time.perf_counter``. Standard
library + torch only.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

COLUMNS = ("op", "dtype", "m", "k", "n", "bytes", "gpus", "time_us", "device", "torch_version")
COMPUTE_OPS = ("gemm", "attention_prefill", "attention_decode", "copy")
COLLECTIVE_OPS = ("allreduce", "sendrecv")
OPS = COMPUTE_OPS + COLLECTIVE_OPS

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
if hasattr(torch, "float8_e4m3fn"):
    DTYPES["fp8"] = torch.float8_e4m3fn
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

MB = 1 << 20
GB = 1 << 30

# Llama-3 layer shapes (hidden, ffn, heads, kv_heads, head_dim = 128), sharded Megatron-style over TP:
# QKV / MLP-up column-parallel (N / TP), attention-out / MLP-down row-parallel (K / TP).
LLAMA3 = {"llama-3-8b": (4096, 14336, 32, 8), "llama-3-70b": (8192, 28672, 64, 8)}
HEAD_DIM = 128


def llama_gemm_shapes(model: str, tp: int) -> list[tuple[int, int]]:
    """(K, N) of the four GEMMs of one Llama-3 layer on one of ``tp`` GPUs."""
    h, f, heads, kv = LLAMA3[model]
    return [
        (h, (heads + 2 * kv) * HEAD_DIM // tp),  # QKV projection
        (heads * HEAD_DIM // tp, h),            # attention output projection
        (h, 2 * f // tp),                       # gated MLP up (gate + up fused)
        (f // tp, h),                           # MLP down
    ]


def _unique(seq):
    out = []
    for x in seq:
        if x not in out:
            out.append(x)
    return out


def gpu_grid(quick: bool) -> dict:
    if quick:
        ms = [1, 16, 128, 512, 2048, 8192]
        kn = llama_gemm_shapes("llama-3-8b", 1)
        heads = [(32, 8)]
        prefill_tokens = [512, 2048, 8192]
        decode = [(b, c) for b in (1, 16, 128) for c in (1024, 8192)]
        copy_sizes = [MB * 4 ** i for i in range(6)]  # 1 MB .. 1 GB
    else:
        ms = sorted(set([2 ** i for i in range(15)] + [3 * 2 ** i for i in range(4, 13)]))  # 1..16384
        kn = _unique(llama_gemm_shapes("llama-3-8b", 1) + llama_gemm_shapes("llama-3-70b", 1)
                     + llama_gemm_shapes("llama-3-70b", 4) + llama_gemm_shapes("llama-3-70b", 8))
        heads = [(32, 8), (64, 8), (8, 1)]  # 8B TP1, 70B TP1, 70B TP8
        prefill_tokens = [2 ** i for i in range(7, 15)]  # 128 .. 16384
        decode = [(b, c) for b in (1, 4, 16, 64, 256) for c in (512, 2048, 8192, 32768)]
        copy_sizes = [MB * 2 ** i for i in range(13)]  # 1 MB .. 4 GB
    return dict(ms=ms, kn=kn, heads=heads, head_dim=HEAD_DIM, prefill_tokens=prefill_tokens,
                decode=decode, decode_heads=heads, copy_sizes=copy_sizes,
                kv_budget=8 * GB, collective_sizes=[2 ** i for i in range(10, 31, 2)])  # 1 KB .. 1 GB


def cpu_grid() -> dict:
    """A tiny grid: the whole pipeline in a few seconds on any CPU."""
    return dict(ms=[1, 16, 64, 256], kn=[(256, 256), (512, 1024)], heads=[(4, 2)], head_dim=32,
                prefill_tokens=[16, 64], decode=[(1, 64), (4, 256)], decode_heads=[(4, 2)],
                copy_sizes=[64 * 1024, MB, 4 * MB], kv_budget=64 * MB,
                collective_sizes=[1024, 64 * 1024, MB])


def log(msg: str) -> None:
    print(f"[measure] {msg}", file=sys.stderr, flush=True)


class Timer:
    """Median wall time of a thunk in microseconds: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, flush_mb: int = 256):
        self.device, self.warmup, self.repeats = device, warmup, repeats
        self.cuda = device.type == "cuda"
        # Writing a buffer larger than L2 before each timed run keeps weights from being served out
        # of L2 (which would flatter small-M GEMMs); the write is outside the timed region.
        self.flush = torch.empty(flush_mb * MB, dtype=torch.uint8, device=device) if self.cuda else None

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        if self.cuda:
            for _ in range(self.repeats):
                self.flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)  # ms -> us
        else:
            for _ in range(self.repeats):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def _row(op, dtype, time_us, ctx, m=None, k=None, n=None, nbytes=None, gpus=None) -> dict:
    return {"op": op, "dtype": dtype, "m": m, "k": k, "n": n, "bytes": nbytes, "gpus": gpus,
            "time_us": f"{time_us:.3f}", "device": ctx["device_name"], "torch_version": torch.__version__}


def _fp8_operands(m, k, n, device, b=None):
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    if b is None:
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major (k x n)
    return a, b


def _fp8_supported(device) -> bool:
    """Whether an fp8 (e4m3) GEMM runs through torch._scaled_mm here (Hopper / Ada and newer)."""
    if "fp8" not in DTYPES or device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        log("fp8: skipped (needs CUDA and torch._scaled_mm)")
        return False
    try:
        a, b = _fp8_operands(16, 32, 32, device)
        one = torch.ones((), device=device, dtype=torch.float32)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        return True
    except Exception as exc:  # unsupported GPU or torch build
        log(f"fp8: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        return False


def bench_gemm(ctx, grid, dtypes, timer):
    device = ctx["device"]
    one = torch.ones((), device=device, dtype=torch.float32)
    for dt in dtypes:
        if dt == "fp8" and not _fp8_supported(device):
            continue
        for k, n in grid["kn"]:
            b = None if dt == "fp8" else torch.randn(k, n, device=device, dtype=DTYPES[dt])
            for m in grid["ms"]:
                if dt == "fp8":
                    if m % 16:  # _scaled_mm wants every dimension a multiple of 16
                        continue
                    a, b = _fp8_operands(m, k, n, device, b)

                    def fn(a=a, b=b):
                        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    a = torch.randn(m, k, device=device, dtype=DTYPES[dt])
                    fn = lambda a=a, b=b: torch.matmul(a, b)  # noqa: E731
                try:
                    t = timer(fn)
                except RuntimeError as exc:  # out of memory, or a shape the kernel refuses
                    log(f"gemm {dt} m={m} k={k} n={n}: skipped ({str(exc).splitlines()[0][:120]})")
                    continue
                yield _row("gemm", dt, t, ctx, m=m, k=k, n=n)
                log(f"gemm {dt} m={m} k={k} n={n}: {t:.1f} us ({2 * m * k * n / t / 1e6:.1f} TFLOP/s)")
            del b


def _sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _attn_dtypes(dtypes):
    return [d for d in dtypes if d != "fp8"]  # SDPA has no fp8 path; fp8 rows come from GEMMs only


def bench_attention_prefill(ctx, grid, dtypes, timer):
    device, hd = ctx["device"], grid["head_dim"]
    for dt in _attn_dtypes(dtypes):
        for heads, kv_heads in grid["heads"]:
            for s in grid["prefill_tokens"]:
                # Grouped-query K/V are expanded to the query heads outside the timed region: prefill
                # is compute-bound, and this keeps SDPA on its fused kernels on every torch version
                # (enable_gqa, 2.5+, can fall back to the unfused math kernel on some backends).
                try:
                    q = torch.randn(1, heads, s, hd, device=device, dtype=DTYPES[dt])
                    k = torch.randn(1, heads, s, hd, device=device, dtype=DTYPES[dt])
                    v = torch.randn_like(k)
                    t = timer(lambda: _sdpa(q, k, v, True))
                except RuntimeError as exc:  # out of memory, or no kernel for this shape / dtype
                    log(f"attention_prefill {dt} tokens={s}: skipped ({str(exc).splitlines()[0][:120]})")
                    continue
                finally:
                    q = k = v = None
                yield _row("attention_prefill", dt, t, ctx, m=s, k=heads * hd, n=kv_heads * hd)
                log(f"attention_prefill {dt} tokens={s} heads={heads}/{kv_heads}: {t:.1f} us")


def bench_attention_decode(ctx, grid, dtypes, timer):
    device, hd = ctx["device"], grid["head_dim"]
    for dt in _attn_dtypes(dtypes):
        esz = ELEMENT_BYTES[dt]
        for heads, kv_heads in grid["decode_heads"]:
            for batch, ctx_len in grid["decode"]:
                kv_bytes = 2 * batch * kv_heads * ctx_len * hd * esz  # K and V, read once
                if kv_bytes > grid["kv_budget"]:
                    continue
                # Decode is bound by reading the KV cache, so each K/V head must be read once: the
                # heads // kv_heads query heads sharing a KV head are packed as that many query rows
                # of one non-causal attention (all sit at the same position), which is exactly equivalent.
                try:
                    q = torch.randn(batch, kv_heads, heads // kv_heads, hd, device=device, dtype=DTYPES[dt])
                    k = torch.randn(batch, kv_heads, ctx_len, hd, device=device, dtype=DTYPES[dt])
                    v = torch.randn_like(k)
                    t = timer(lambda: _sdpa(q, k, v, False))
                except RuntimeError as exc:  # out of memory, or no kernel for this shape / dtype
                    log(f"attention_decode {dt} batch={batch} ctx={ctx_len}: skipped "
                        f"({str(exc).splitlines()[0][:120]})")
                    continue
                finally:
                    q = k = v = None
                yield _row("attention_decode", dt, t, ctx, m=batch, k=heads * hd, n=ctx_len,
                           nbytes=kv_bytes)
                log(f"attention_decode {dt} batch={batch} ctx={ctx_len} heads={heads}/{kv_heads}: "
                    f"{t:.1f} us ({kv_bytes / t / 1e3:.1f} GB/s of KV)")


def bench_copy(ctx, grid, dtypes, timer):
    device = ctx["device"]
    dt = "bf16" if "bf16" in dtypes else _attn_dtypes(dtypes)[0] if _attn_dtypes(dtypes) else "bf16"
    esz = ELEMENT_BYTES[dt]
    for nbytes in grid["copy_sizes"]:
        try:
            src = torch.empty(nbytes // esz, device=device, dtype=DTYPES[dt]).normal_()
            dst = torch.empty_like(src)
        except (RuntimeError, MemoryError):  # torch.cuda.OutOfMemoryError is a RuntimeError
            log(f"copy {nbytes} B: skipped (out of memory)")
            continue
        t = timer(lambda: dst.copy_(src))
        src = dst = None  # free the buffers before the next size
        yield _row("copy", dt, t, ctx, nbytes=nbytes)
        log(f"copy {nbytes / MB:.2f} MB: {t:.1f} us ({2 * nbytes / t / 1e3:.1f} GB/s read+write)")


# --------------------------------------------------------------------------------------- collectives
def bench_collectives(ctx, grid, dtypes, ops, warmup, repeats):
    """All-reduce over the first g ranks (g = 2, 4, ... world) and send-recv rank 0 -> rank 1.

    Every rank times its own part; the slowest rank's median is reported (by rank 0)."""
    import torch.distributed as dist

    device, world, rank = ctx["device"], dist.get_world_size(), dist.get_rank()
    dt = "bf16" if "bf16" in dtypes else "fp16"
    esz = ELEMENT_BYTES[dt]
    timer = Timer(device, 0, 1)
    sizes = grid["collective_sizes"]

    def timed(fn, active):
        times = []
        for i in range(warmup + repeats):
            dist.barrier()
            timer.sync()
            if not active:
                continue
            if timer.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                t = start.elapsed_time(end) * 1e3
            else:
                t0 = time.perf_counter()
                fn()
                t = (time.perf_counter() - t0) * 1e6
            if i >= warmup:
                times.append(t)
        med = torch.tensor([statistics.median(times) if times else 0.0], dtype=torch.float64)
        med = med.to(device) if timer.cuda else med
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        return float(med.item())

    if "allreduce" in ops:
        gs, g = [], 2
        while g <= world:
            gs.append(g)
            g *= 2
        if world not in gs:
            gs.append(world)
        for g in gs:
            group = dist.new_group(list(range(g)))  # every rank must take part in creating it
            for nbytes in sizes:
                buf = torch.ones(nbytes // esz, device=device, dtype=DTYPES[dt])
                t = timed(lambda: dist.all_reduce(buf, group=group), rank < g)
                if rank == 0:
                    yield _row("allreduce", dt, t, ctx, nbytes=nbytes, gpus=g)
                    log(f"allreduce gpus={g} {nbytes} B: {t:.1f} us "
                        f"(bus {2 * (g - 1) / g * nbytes / t / 1e3:.1f} GB/s)")
    if "sendrecv" in ops:
        for nbytes in sizes:
            buf = torch.ones(nbytes // esz, device=device, dtype=DTYPES[dt])

            def fn():
                if rank == 0:
                    dist.send(buf, dst=1)
                elif rank == 1:
                    dist.recv(buf, src=0)

            t = timed(fn, rank < 2)
            if rank == 0:
                yield _row("sendrecv", dt, t, ctx, nbytes=nbytes, gpus=2)
                log(f"sendrecv {nbytes} B: {t:.1f} us ({nbytes / t / 1e3:.1f} GB/s)")


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="CSV to write (native servesim calibration format)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available, else cpu (the cpu grid is tiny)")
    p.add_argument("--dtypes", default=None,
                   help="comma list of bf16,fp16,fp8,fp32 (default: bf16,fp16,fp8 on cuda, bf16 on cpu; "
                        "fp8 only where torch._scaled_mm runs)")
    p.add_argument("--quick", action="store_true", help="a reduced GPU grid (a minute or so)")
    p.add_argument("--ops", default=None, help=f"comma list restricting the ops ({','.join(OPS)})")
    p.add_argument("--collectives", action="store_true",
                   help="measure all-reduce / send-recv instead of the compute ops (launch with torchrun, "
                        ">1 process)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs per point (default 5 cuda, 2 cpu)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per point; the median is kept (default 20 cuda, 5 cpu)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        log("--device cuda but torch sees no CUDA device")
        return 2
    dtypes = (args.dtypes.split(",") if args.dtypes
              else ["bf16", "fp16", "fp8"] if device_type == "cuda" else ["bf16"])
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        log(f"unknown or unsupported dtype(s) {bad}; choose from {sorted(DTYPES)}")
        return 2
    ops = args.ops.split(",") if args.ops else list(COLLECTIVE_OPS if args.collectives else COMPUTE_OPS)
    if [o for o in ops if o not in OPS]:
        log(f"unknown op(s) {[o for o in ops if o not in OPS]}; choose from {OPS}")
        return 2
    cuda = device_type == "cuda"
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    repeats = args.repeats if args.repeats is not None else (20 if cuda else 5)
    grid = gpu_grid(args.quick) if cuda else cpu_grid()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    distributed = world > 1
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        device_name = f"cpu:{platform.machine()}"
    ctx = {"device": device, "device_name": device_name}

    rows = []
    wanted_collectives = [o for o in ops if o in COLLECTIVE_OPS]
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo")
        try:
            if wanted_collectives:
                rows += list(bench_collectives(ctx, grid, dtypes, wanted_collectives, warmup, repeats))
            elif rank == 0:
                log("launched with several processes but no collectives asked for: use --collectives")
        finally:
            dist.destroy_process_group()
        if rank != 0:
            return 0
        if [o for o in ops if o in COMPUTE_OPS]:
            log("compute ops are measured in a single process run; skipped under torchrun")
    else:
        if wanted_collectives:
            log(f"single process: skipping {','.join(wanted_collectives)} "
                "(launch with torchrun --nproc-per-node N ... --collectives)")
        torch.manual_seed(0)
        timer = Timer(device, warmup, repeats)
        log(f"device {device_name}, torch {torch.__version__}, dtypes {','.join(dtypes)}, "
            f"{'quick ' if args.quick and cuda else ''}{'gpu' if cuda else 'tiny cpu'} grid")
        benches = {"gemm": bench_gemm, "attention_prefill": bench_attention_prefill,
                   "attention_decode": bench_attention_decode, "copy": bench_copy}
        with torch.inference_mode():
            for op in COMPUTE_OPS:
                if op in ops:
                    rows += list(benches[op](ctx, grid, dtypes, timer))
        del timer

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r[c] is None else r[c]) for c in COLUMNS})
    log(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
