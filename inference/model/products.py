"""Which products a quantized model's weights run on a CPU, and what they promise.

integer: each block of 32 activations is split into three int8 slices with one power-of-two
scale, multiplied with the weights' own integers exactly (kernels/islices.c: AVX-512 VNNI where
the CPU has it), and each block's scales applied once in float32. Every output is within BOUND of
the float32 product of the dequantized weights, and a row's result is the same bits alone or in
a batch of any size. float32: each weight dequantized and multiplied in float32 (kernels/quant.c),
the reference the integer products are tested against.
"""

from __future__ import annotations

from inference.errors import InputError
from inference.model import kernels

CHOICES = ("auto", "integer", "float32")
# |y - y_f32| for one output y = sum_i w_i x_i of a weight row w (as gguf dequantizes it) and
# activations x, where s_b is block b's slice scale (the least power of two with 127 s_b >= the
# block's largest |x|: s_b 2^-17 is under 2^-16/127, about 2^-23, of it), m_i the block's min term where the type
# has one (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) and n the inputs (docs/design.md derives it; tests/model/test_islices.py).
BOUND = ("|y - y_f32| <= 2^-17 sum_b s_b sum_{i in b} |w_i| "
         "+ 1.01 (3n/32 + 16) 2^-24 sum_i (|w_i| + |m_i|) |x_i|")


def resolve_products(name: str, device) -> str:
    """"integer" or "float32" for --products NAME on this device: auto is integer where the CPU
    has AVX-512 VNNI (the integer products' fast kernels), float32 elsewhere."""
    if name not in CHOICES:
        raise InputError(f"unknown products {name!r} (use {', '.join(CHOICES)})")
    if device.type != "cpu" or name == "float32":
        return "float32"
    simd = kernels.int_products()
    if name == "integer" and simd is None:
        raise InputError("integer products need the compiled CPU kernels (a C compiler; TOKEN_LAB_KERNELS=0 "
                         "turns them off)")
    return "integer" if name == "integer" or simd == "avx512-vnni" else "float32"


def describe(products: str) -> dict:
    """What a quantized model's card, the API's model information and the CLI's JSON say of its
    products: the path, the kernels that run it and, for integer products, the bound."""
    simd = kernels.int_products()
    if products == "integer":
        return {"path": "integer", "kernels": simd, "bound": BOUND}
    why = ("--products float32" if simd == "avx512-vnni" else
           "this CPU has no AVX-512 VNNI (--products integer runs them in plain C)" if simd else "no compiled kernels")
    return {"path": "float32", "kernels": "float32 on the dequantized weights", "bound": None, "why": why}
