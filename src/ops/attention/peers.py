#!/usr/bin/env python3
"""Peers of the attention benchmarks: PyTorch SDPA with each backend forced (flash = FlashAttention-2,
cudnn, efficient), on the same cases and names as bench.cpp. Prints one JSON line per timing:
{"family", "op", "name", "peer", "ms", "tflops" | "gbps"}."""
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

FAMILY = "attention"
BACKENDS = {"torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
            "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
            "torch_sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
# BARACUDA_PEERS_BACKENDS=torch_sdpa_flash,...: only these peers (short A/B calls).
if os.environ.get("BARACUDA_PEERS_BACKENDS"):
    _keep = os.environ["BARACUDA_PEERS_BACKENDS"].split(",")
    BACKENDS = {k: v for k, v in BACKENDS.items() if k in _keep}


def emit(op, name, peer, ms, **extra):
    if peer.endswith("_cudnn"):  # the release decides which engines cuDNN has
        extra["cudnn_version"] = torch.backends.cudnn.version()
    print(json.dumps({"family": FAMILY, "op": op, "name": name, "peer": peer, "ms": ms, **extra}),
          flush=True)


FORWARD_ONLY = False


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def sweep():
    tokens, hidden = 16384, 2048
    # BARACUDA_ATTN_SWEEP=short: bench_attention attention_hopper's short points (L 128 / 256,
    # head dims 64-256) instead of the FlashAttention papers' sweep.
    short = os.environ.get("BARACUDA_ATTN_SWEEP") == "short"
    for dim in (64, 128, 256) if short else (64, 128):
        heads = hidden // dim
        for length in (128, 256) if short else (512, 1024, 2048, 4096, 8192, 16384):
            batch = tokens // length
            for causal in (False, True):
                name = f"b{batch}_h{heads}_l{length}_d{dim}" + ("_causal" if causal else "")
                flops = 4.0 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
                shape = (batch, heads, length, dim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                for peer, backend in BACKENDS.items():
                    try:
                        with sdpa_kernel(backend):
                            ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                            emit("attention_forward", name, peer, ms, tflops=flops / ms / 1e9)
                            if FORWARD_ONLY:
                                continue
                            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            ms = bench(lambda: torch.autograd.grad(y, (q, k, v), dy, retain_graph=True))
                            emit("attention_backward", name, peer, ms, tflops=2.5 * flops / ms / 1e9)
                    except Exception as e:  # a backend that cannot run a case is reported, not hidden
                        emit("attention_forward", name, peer, None, error=str(e)[:200])
                del q, k, v, dy
                torch.cuda.empty_cache()


def each_backend(op, name, run, suffix="", **per_ms):
    """Times run() under every SDPA backend and emits a row for each (or its error), the peer
    named with `suffix` appended; per_ms maps an extra field to the numerator that divides the
    milliseconds (e.g. gbps=bytes / 1e6)."""
    for peer, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):
                ms = bench(run)
            emit(op, name, peer + suffix, ms, **{k: v / ms for k, v in per_ms.items()})
        except Exception as e:  # a backend that cannot run a case is reported, not hidden
            emit(op, name, peer + suffix, None, error=str(e)[:200])


def decode():
    # (batch, keys, head dim): the bench_attention decode rows of one query token, same names.
    for b, lk, d in ((1, 32768, 128), (1, 32768, 64), (12, 2048, 128), (6, 4096, 128),
                     (12, 4096, 64)):
        decode_case(b, 32, 8, lk, d, repeated_kv=(b, d) == (1, 128))
    decode_ragged()


def decode_case(b, hq, hk, lk, d, repeated_kv):
    name = f"decode_b{b}_hq{hq}_hk{hk}_lk{lk}_d{d}"
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    # Cache in [B, L, H, D] memory, viewed as [B, H, L, D] (as bench.cpp does).
    k = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kv_bytes = 2 * b * lk * hk * d * 2
    each_backend("attention_decode", name,
                 lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                 gbps=kv_bytes / 1e6)
    if not repeated_kv:
        return
    # Eager GQA by repeating K/V (what a framework without enable_gqa does).
    kr, vr = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ms = bench(lambda: F.scaled_dot_product_attention(q, kr, vr))
    emit("attention_decode", name, "torch_sdpa_flash_repeated_kv", ms, gbps=kv_bytes / ms / 1e6)


def decode_ragged(b=16, hq=32, hk=8, lk=2048, d=128):
    """bench.cpp's _ragged row: 16 caches of 2048 rows filled to the same lengths (the same
    formula), which SDPA can only take as a key mask over the whole cache (a boolean
    [B, 1, 1, L]); bytes count the keys used, as bench.cpp does."""
    name = f"decode_b{b}_hq{hq}_hk{hk}_lk{lk}_d{d}_ragged"
    used = [256 + (i * 997 + 331) % 1793 for i in range(b)]
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    lengths = torch.tensor(used, device="cuda")
    mask = (torch.arange(lk, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    kv_bytes = 2 * sum(used) * hk * d * 2
    each_backend("attention_decode", name,
                 lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
                 suffix="_masked", gbps=kv_bytes / 1e6)


def prefill(b=4, hq=32, hk=8, lq=512, lk=4096, d=128):
    """bench.cpp's attention_prefill padded rows: lq new tokens a sequence at the end of 4096-key
    caches (causal, bottom-right: SDPA's causal_lower_right bias), the cache padded in [B, L, H, D] memory
    (SDPA takes no block table) and repeated to the query heads outside the timing; TFLOP/s on
    the visible keys, as bench.cpp counts them."""
    from torch.nn.attention.bias import causal_lower_right
    name = f"prefill_b{b}_hq{hq}_hk{hk}_lq{lq}_lk{lk}_d{d}_padded"
    q = torch.randn(b, hq, lq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn(b, lk, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kr, vr = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    bias = causal_lower_right(lq, lk)
    flops = 4.0 * b * hq * d * sum(lk - lq + i + 1 for i in range(lq))
    each_backend("attention_prefill", name,
                 lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=bias),
                 tflops=flops / 1e9)


# Packed sequences of mixed lengths (bench_attention's attention_varlen rows, same names): SDPA
# on nested (jagged) tensors, each backend forced; d128, 16 heads, 16k tokens.
VARLEN_LENGTHS = (512, 1024, 3072, 4096, 2048, 1536, 4096)


def varlen():
    heads, dim = 16, 128
    total = sum(VARLEN_LENGTHS)
    offsets = torch.tensor([0] + list(torch.tensor(VARLEN_LENGTHS).cumsum(0)), device="cuda",
                           dtype=torch.int64)

    def nested():
        values = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16,
                             requires_grad=True)
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        return values, nt.transpose(1, 2)  # [B, H, j, D]

    for causal in (False, True):
        name = f"varlen_s{len(VARLEN_LENGTHS)}_t{total}_h{heads}_d{dim}" + ("_causal" if causal else "")
        flops = sum(4.0 * heads * l * l * dim for l in VARLEN_LENGTHS) * (0.5 if causal else 1.0)
        for peer, backend in BACKENDS.items():
            try:
                (qv, q), (kv, k), (vv, v) = nested(), nested(), nested()
                with sdpa_kernel(backend):
                    run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    ms = bench(run)
                    emit("attention_forward", name, peer, ms, tflops=flops / ms / 1e9)
                    y = run().transpose(1, 2).values()
                    dy = torch.randn_like(y)
                    ms = bench(lambda: torch.autograd.grad(y, (qv, kv, vv), dy, retain_graph=True))
                    emit("attention_backward", name, peer, ms, tflops=2.5 * flops / ms / 1e9)
            except Exception as e:  # a backend that cannot run a case is reported, not hidden
                emit("attention_forward", name, peer, None, error=str(e)[:200])


if __name__ == "__main__":
    torch.manual_seed(0)
    only = os.environ.get("BARACUDA_ATTENTION_ONLY")
    # BARACUDA_ATTENTION_ONLY=decode / varlen / forward / backward (as for bench_attention): those
    # rows only (forward: the sweep's forward rows; backward: the sweep, forward and backward).
    FORWARD_ONLY = only == "forward"
    if only not in ("varlen", "forward", "backward"):
        decode()
        for lq in (32, 64, 128, 256, 512, 1024, 2048):
            prefill(lq=lq)
    if only not in ("decode", "varlen"):
        sweep()
    if only not in ("decode", "forward", "backward"):
        varlen()
