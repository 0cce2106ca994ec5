#!/usr/bin/env python3
"""attention_record.py on made-up rows: the default rows (no note) of the bf16 sweep with the
table bench's columns and PyTorch's backends beside them, % of the GEMM ceiling, the lowest
default / fastest torch ratio, and the own-kernel bar read from fa3's column or a default that is
fa3's. Run by ctest (attention_record)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_record import record  # noqa: E402


def check(cond, what):
    if not cond:
        sys.exit("attention_record_test: " + what)


def row(op, name, kernel, tflops, note="", dtype="bf16"):
    return {"op": "attention_" + op, "name": name, "kernel": kernel, "tflops": tflops,
            "note": note, "dtype": dtype}


def point(pas, d, length, causal, cudnn, bespoke, fa3):
    return {"table_point": {"dtype": "bf16", "pass": pas, "head_dim": d, "len": length,
                            "causal": causal, "cudnn_tflops": cudnn, "bespoke_tflops": bespoke,
                            "fa3_tflops": fa3}}


ours = [{"ceiling": True, "gemm_tflops": 800.0},
        row("forward", "b4_h16_l4096_d128", "cudnn_sdpa", 680.0),
        row("forward", "b4_h16_l4096_d128", "flash_fwd_mma_sm80", 300.0, "A/B: kernel forced"),
        row("forward", "b4_h16_l4096_d128", "x", 1.0, dtype="f16"),  # not the bf16 sweep
        row("backward", "b4_h16_l4096_d128", "fa3_bwd_sm90a_ranked_ahead", 490.0),
        row("forward", "b32_h32_l512_d64_causal", "cudnn_sdpa", 250.0),
        row("decode", "decode_b1", "flash_decode_sm80", 0.1)]
short = [row("forward", "b4_h16_l4096_d128", "cudnn_sdpa", 690.0)]
table = [point("forward", 128, 4096, False, 679.0, 340.0, 660.0),
         point("backward", 128, 4096, False, 530.0, 290.0, 480.0),
         point("forward", 64, 512, True, 251.0, 160.0, 240.0)]
peers = [{"op": "attention_forward", "name": "b4_h16_l4096_d128", "peer": "torch_sdpa_cudnn",
          "tflops": 600.0},
         {"op": "attention_forward", "name": "b4_h16_l4096_d128", "peer": "torch_sdpa_flash",
          "tflops": 340.0},
         {"op": "attention_backward", "name": "b4_h16_l4096_d128", "peer": "torch_sdpa_cudnn",
          "tflops": 500.0},
         {"op": "attention_forward", "name": "b32_h32_l512_d64_causal",
          "peer": "torch_sdpa_cudnn", "tflops": 240.0}]
lines = record(ours, peers, table, short)
rows = [ln for ln in lines if ln.startswith("| forward") or ln.startswith("| backward")]
check(len(rows) == 3, "three default rows of the bf16 sweep: %s" % rows)
check(rows[0].startswith("| forward | b32_h32_l512_d64_causal |"), "d64 first: " + rows[0])
check(rows[1] == "| forward | b4_h16_l4096_d128 | cudnn_sdpa | 680.0 | 85% | 690.0 | 679.0 | "
      "340.0 | 660.0 | 600.0 | 340.0 | 1.133x |", "the forward row: " + rows[1])
# No row in --short and no FA2 peer: "-".
check(rows[2] == "| backward | b4_h16_l4096_d128 | fa3_bwd_sm90a_ranked_ahead | 490.0 | 61% | - | "
      "530.0 | 290.0 | 480.0 | 500.0 | - | 0.980x |", "the backward row: " + rows[2])
check("Lowest default / fastest torch: 0.980x (backward b4_h16_l4096_d128); at or above 1.0x: "
      "2 of 3." in lines, "the lowest ratio: %s" % lines)
# forward: fa3's column 660 (the default is cuDNN's); backward: the default (fa3) 490 over the
# column's 480, under the bar.
check("Own-kernel bar (fa3, d128, bf16, non-causal): forward L4096: 660.0 (fa3 column), bar 650: "
      "met" in lines, "the forward bar: %s" % lines)
check("Own-kernel bar (fa3, d128, bf16, non-causal): backward L4096: 490.0 (default "
      "fa3_bwd_sm90a_ranked_ahead), bar 500: NOT met" in lines, "the backward bar: %s" % lines)
print("attention_record_test: ok")
