#!/usr/bin/env python3
"""PyTorch peers for the write_slice benchmark cases (same op/name strings as bench.cpp).

Timing mirrors bench::time_it: CUDA events around each call, warm-up first, median of the reps,
inputs rotated the same way. Prints one JSON line per (case, peer); run standalone on the GPU
machine: `python3 src/ops/write_slice/peers.py`.
"""
import json
import math
import sys
import time

FAMILY = "write_slice"
START = time.time()
COMPILE_BUDGET_S = 100  # torch.compile is slow to warm up; stop compiling past this


def time_events(torch, fn, rotations=1, reps=30, warmup=3):
    for i in range(warmup):
        fn(i % rotations)
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
           for _ in range(reps)]
    for i, (a, b) in enumerate(evs):
        a.record()
        fn((warmup + i) % rotations)
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in evs)
    return ms[len(ms) // 2]


def row(op, name, peer, ms, note=""):
    return {"family": FAMILY, "op": op, "name": name, "peer": peer, "ms": ms, "note": note}


def peer_rows(torch, op, name, make_fn, rotations=1, reps=30, warmup=3, note="", compile_too=True):
    """make_fn(compiled: bool) -> fn(rotation). Eager always; torch.compile while budget lasts."""
    out = []
    try:
        out.append(row(op, name, "torch_eager", time_events(torch, make_fn(False), rotations, reps,
                                                             warmup), note))
    except Exception as e:  # a broken peer is reported, never silently missing
        out.append(row(op, name, "torch_eager", None, f"error: {e}"))
    if compile_too and time.time() - START < COMPILE_BUDGET_S:
        try:
            out.append(row(op, name, "torch_compile",
                           time_events(torch, make_fn(True), rotations, reps, max(warmup, 3)),
                           note))
        except Exception as e:
            out.append(row(op, name, "torch_compile", None, f"error: {type(e).__name__}: {e}"[:300]))
    return out


def run(ctx=None):
    import torch

    dev = "cuda"
    rows = []
    g = torch.Generator(device=dev)
    g.manual_seed(1234)

    def rand(shape, dtype):
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, device=dev, dtype=torch.uint8, generator=g)
        return torch.randn(shape, device=dev, dtype=dtype, generator=g)

    def slice_case(op, name, dtype, dest_shape, index, rotations=2, note="", label="bf16"):
        window = [b - a for a, b in index]
        nbytes = math.prod(dest_shape) * torch.empty(0, dtype=dtype).element_size()
        # Several dests only when small, as bench.cpp does (a big dest's window is what is touched).
        dests = [rand(dest_shape, dtype) for _ in range(rotations if nbytes <= (256 << 20) else 1)]
        srcs = [rand(window, dtype) for _ in range(rotations)]
        sl = tuple(slice(a, b) for a, b in index)

        def assign(d, s):
            d[sl] = s

        def make(compiled):
            f = torch.compile(assign) if compiled else assign
            return lambda r: f(dests[r % len(dests)], srcs[r])

        for r in peer_rows(torch, op, name, make, rotations, 30, 3, note):
            r["dtype"] = label  # the case's dtype in bench.cpp (s4 runs here as uint8 bytes)
            rows.append(r)
        del dests, srcs
        torch.cuda.empty_cache()

    # Large windows (64 MiB of window). s4 has no torch dtype: the same bytes as uint8.
    slice_case("write_slice", "chunk_64MiB", torch.bfloat16, [3, 16, 1 << 20],
               [(1, 3), (0, 16), (0, 1 << 20)])
    slice_case("write_slice", "kv2d_T512", torch.bfloat16, [16, 32, 8192, 128],
               [(0, 16), (0, 32), (1000, 1512), (0, 128)], rotations=2)
    slice_case("write_slice", "strided_T512_D64", torch.bfloat16, [16, 32, 8192, 128],
               [(0, 16), (0, 32), (1000, 2024), (32, 96)], rotations=2)
    slice_case("write_slice", "chunk_64MiB", torch.uint8, [3, 16, 1 << 21],
               [(1, 3), (0, 16), (0, 1 << 21)], note="s4 case as uint8 bytes", label="s4")
    slice_case("write_slice", "kv2d_T2048", torch.uint8, [16, 32, 8192, 64],
               [(0, 16), (0, 32), (1000, 3048), (0, 64)], note="s4 case as uint8 bytes", label="s4")
    slice_case("write_slice", "kv2d_T2048_256MiB", torch.bfloat16, [16, 32, 8192, 128],
               [(0, 16), (0, 32), (1000, 3048), (0, 128)], rotations=1)

    # Decode appends into [16, 32, 8192, 128] bf16.
    B, H, L, D = 16, 32, 8192, 128
    cache = rand([B, H, L, D], torch.bfloat16)
    pos = torch.tensor([1000 + 37 * b for b in range(B)], device=dev, dtype=torch.int64)
    for T in (1, 2, 4, 8, 16):
        name = f"decode_T{T}"
        src = rand([B, H, T, D], torch.bfloat16)
        p = 1000

        def assign(c, s, p=p, T=T):
            c[:, :, p:p + T, :] = s

        def make_slice(compiled, src=src, assign=assign):
            f = torch.compile(assign) if compiled else assign
            return lambda r: f(cache, src)

        rows.extend(peer_rows(torch, "write_slice", name, make_slice, 1, 100, 10,
                              "cache[:, :, p:p+T, :] = src"))
        idx = torch.arange(p, p + T, device=dev)

        def index_copy(c, s, idx=idx):
            c.index_copy_(2, idx, s)

        def make_ic(compiled, src=src, index_copy=index_copy):
            f = torch.compile(index_copy) if compiled else index_copy
            return lambda r: f(cache, src)

        for r in peer_rows(torch, "kv_append", name, make_ic, 1, 100, 10,
                           "index_copy_ (one position for all rows)"):
            r["peer"] = r["peer"].replace("torch_", "torch_index_copy_")
            rows.append(r)
        # Per-row positions, as kv_append does: advanced indexing (one scatter kernel).
        tt = torch.arange(T, device=dev)
        bi = torch.arange(B, device=dev)[:, None].expand(B, T)
        ti = pos[:, None] + tt[None, :]
        src_bt = src.permute(0, 2, 1, 3)

        def adv(c, s, bi=bi, ti=ti):
            c[bi, :, ti] = s

        def make_adv(compiled, src_bt=src_bt, adv=adv):
            f = torch.compile(adv) if compiled else adv
            return lambda r: f(cache, src_bt)

        for r in peer_rows(torch, "kv_append", name, make_adv, 1, 100, 10,
                           "cache[b, :, pos[b]+t] = src (per-row positions)"):
            r["peer"] = r["peer"].replace("torch_", "torch_advindex_")
            rows.append(r)
    return rows


if __name__ == "__main__":
    for r in run():
        print(json.dumps(r), flush=True)
    sys.exit(0)
