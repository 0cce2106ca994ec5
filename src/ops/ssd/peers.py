#!/usr/bin/env python3
"""Peers of the ssd benchmark cases (same op/name strings as bench.cpp), one JSON line each:
- ssd_forward / ssd_backward: mamba_ssm's Triton `mamba_chunk_scan_combined` (bf16, chunk 256).
  Its Python files are not part of this repo: copy them into .peers/ (see
  /work/shared/notes/peers.md) and carry that folder to the GPU machine.
- ssd_decode: the one-token state update in PyTorch eager and torch.compile (mamba_ssm's Triton
  selective_state_update does not launch under Triton 3.6).
BARACUDA_SSD_ONLY=forward / backward (the bench's switch) keeps that direction's rows only (a
quick same-call peer for A/B calls; the forward alone takes ~30 s instead of ~190 s); any other
non-empty value (e.g. prefill) keeps both directions and skips the decode peers.
Standalone: python3 src/ops/ssd/peers.py"""
import json
import os
import sys

import torch

ONLY = os.environ.get("BARACUDA_SSD_ONLY", "")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, ".peers"))

CASES = [("B4_L4096_H80_D64_N128_G1", 4, 4096, 80, 64, 128, 1, 256),
         ("B8_L2048_H32_D64_N64_G1", 8, 2048, 32, 64, 64, 1, 256)]


def bench(fn):
    """The better of two medians: the Triton peer's chunk-256 forward read 0.667 ms in one call and
    0.917 ms in another on the same H200 (docs/perf/ssd.md, thirtieth session), so one transiently
    slow reading must not stand for the peer."""
    import triton.testing
    return min(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
               for _ in range(2))


def emit(op, name, peer, ms, **extra):
    print(json.dumps({"family": "ssd", "op": op, "name": name, "peer": peer, "ms": ms, **extra}),
          flush=True)


def prefill():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # noqa: BLE001 - report why the peer is missing, never hide it
        for name, *_ in CASES:
            for op in ("ssd_forward", "ssd_backward"):
                emit(op, name, "mamba_ssm_triton", None, error=f"import failed: {e!r}")
        return
    dev = "cuda"
    inputs = {}
    for name, B, L, H, D, N, G, Q in CASES:  # every forward first: the headline numbers
        g = torch.Generator(device=dev).manual_seed(0)
        bf = torch.bfloat16
        x = (torch.rand(B, L, H, D, device=dev, generator=g) * 2 - 1).to(bf).requires_grad_()
        dt = (torch.rand(B, L, H, device=dev, generator=g) * 0.095 + 0.005).to(bf).requires_grad_()
        A = (-0.5 - 1.5 * torch.rand(H, device=dev, generator=g)).requires_grad_()
        Bm = (torch.rand(B, L, G, N, device=dev, generator=g) * 2 - 1).to(bf).requires_grad_()
        Cm = (torch.rand(B, L, G, N, device=dev, generator=g) * 2 - 1).to(bf).requires_grad_()
        inputs[name] = (x, dt, A, Bm, Cm, Q)
        if ONLY == "backward":
            continue
        with torch.no_grad():
            ms = bench(lambda: mamba_chunk_scan_combined(x, dt, A, Bm, Cm, Q))
        emit("ssd_forward", name, "mamba_ssm_triton", ms)
        for q in (128, 64):  # the bench's "_chunk<Q>" rows: the same forward at other chunk lengths
            with torch.no_grad():
                ms = bench(lambda: mamba_chunk_scan_combined(x, dt, A, Bm, Cm, q))
            emit("ssd_forward", f"{name}_chunk{q}", "mamba_ssm_triton", ms)
    for name, *_ in CASES if ONLY != "forward" else ():
        x, dt, A, Bm, Cm, Q = inputs[name]
        y = mamba_chunk_scan_combined(x, dt, A, Bm, Cm, Q)
        dy = torch.randn_like(y)
        ms = bench(lambda: torch.autograd.grad(y, [x, dt, A, Bm, Cm], dy, retain_graph=True))
        emit("ssd_backward", name, "mamba_ssm_triton", ms)


def decode_step(state, x, dt, A, Bm, Cm):
    dA = torch.exp(dt.float() * A)  # [B, H]
    dBx = (dt.float()[..., None] * x.float())[..., None] * Bm.float()[:, :, None, None, :].squeeze(1)
    state.mul_(dA[..., None, None]).add_(dBx)
    return (state * Cm.float()[:, None, None, :].squeeze(1)).sum(-1).to(x.dtype)


def decode():
    B, H, D, N = 128, 80, 64, 128
    dev, bf = "cuda", torch.bfloat16
    state = torch.rand(B, H, D, N, device=dev) * 2 - 1
    x = (torch.rand(B, H, D, device=dev) * 2 - 1).to(bf)
    dt = (torch.rand(B, H, device=dev) * 0.095 + 0.005).to(bf)
    A = -0.5 - 1.5 * torch.rand(H, device=dev)
    Bm = (torch.rand(B, 1, N, device=dev) * 2 - 1).to(bf)
    Cm = (torch.rand(B, 1, N, device=dev) * 2 - 1).to(bf)
    name = "B128_H80_D64_N128"
    emit("ssd_decode", name, "torch_eager", bench(lambda: decode_step(state, x, dt, A, Bm, Cm)))
    try:
        compiled = torch.compile(decode_step)
        compiled(state, x, dt, A, Bm, Cm)
        emit("ssd_decode", name, "torch_compile", bench(lambda: compiled(state, x, dt, A, Bm, Cm)))
    except Exception as e:  # noqa: BLE001
        emit("ssd_decode", name, "torch_compile", None, error=repr(e)[:500])


def run(ctx=None):
    prefill()
    if not ONLY:
        decode()


if __name__ == "__main__":
    run()
