"""How an fp8 K or V tile becomes a float16 (or the query's dtype) dot operand inside a Triton kernel: the
``FP8_DOT`` modes of ``attention_tiles.FP8_DOT_MODES`` (Triton's conversions, PTX ``cvt`` that Triton leaves
where it is placed, or bit moves), and what one unit of the result is worth (e4m3 bit moves land as value *
2^-8). Shared by the unified paged-attention kernel (``triton_attention_kernel.py``) and the keys-major fp8 decode
(``triton_fp8_decode.py``). Importing this module imports Triton.
"""

from __future__ import annotations

import triton
import triton.language as tl

# e4m3's exponent bias is 7, float16's 15: a bit move scales by 2^-8
_E4M3_BITS_UNIT = tl.constexpr(256.0)
# PTX for 4 fp8 values in a 32-bit register -> 2 registers of f16x2 (element 0 in the low half)
_CVT_E4M3 = tl.constexpr(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }"
)
_CVT_E5M2 = tl.constexpr(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e5m2x2 $0, lo; cvt.rn.f16x2.e5m2x2 $1, hi; }"
)
_BITS_E5M2 = tl.constexpr("prmt.b32 $0, $2, 0, 0x1404; prmt.b32 $1, $2, 0, 0x3424;")  # byte -> high byte
_BITS_E4M3 = tl.constexpr(  # byte -> high byte, then sign stays at bit 15 and the rest moves to bits 7..13
    "{ .reg .b32 h0, h1; prmt.b32 h0, $2, 0, 0x1404; prmt.b32 h1, $2, 0, 0x3424; "
    "shr.b32 $0, h0, 1; shr.b32 $1, h1, 1; "
    "lop3.b32 $0, h0, $0, 0x80008000, 0xE4; lop3.b32 $1, h1, $1, 0x80008000, 0xE4; "
    "and.b32 $0, $0, 0xBF80BF80; and.b32 $1, $1, 0xBF80BF80; }"
)


@triton.jit
def _fp8_bits(FP8_DOT: tl.constexpr):
    """Whether ``FP8_DOT`` moves bits (rather than converting with cvt)."""
    return FP8_DOT == "f16bits" or FP8_DOT == "f16asm" or FP8_DOT == "f16asmv" or FP8_DOT == "f16asmkv"


@triton.jit
def fp8_unit(KV_DTYPE: tl.constexpr, FP8_DOT: tl.constexpr):
    """What one unit of an operand made by ``fp8_operand`` is worth (2^8 for e4m3 bit moves, else 1)."""
    if _fp8_bits(FP8_DOT) and KV_DTYPE == tl.float8e4nv:
        return _E4M3_BITS_UNIT
    else:
        return 1.0


@triton.jit
def _fp8_asm(x, ASM: tl.constexpr, PURE: tl.constexpr):
    """``ASM`` over ``x``'s bytes, four a register, to float16; not ``PURE``: Triton keeps it where it is
    (it moves pure conversions past the change to the dot's operand layout)."""
    return tl.inline_asm_elementwise(
        ASM, "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=PURE, pack=4
    )


@triton.jit
def fp8_operand(x, DOT_DTYPE: tl.constexpr, FP8_DOT: tl.constexpr, IS_V: tl.constexpr, INTERPRET: tl.constexpr):
    """An fp8 K (``IS_V`` False) or V tile as a ``DOT_DTYPE`` dot operand, unscaled (``fp8_unit``: what a unit
    is worth)."""
    E5: tl.constexpr = x.dtype == tl.float8e5
    KEEP: tl.constexpr = (
        FP8_DOT == "f16kv" or FP8_DOT == "f16asmkv" or (IS_V and (FP8_DOT == "f16v" or FP8_DOT == "f16asmv"))
    )
    if FP8_DOT == "scaled" or FP8_DOT == "cast":
        return x.to(DOT_DTYPE)
    elif _fp8_bits(FP8_DOT) and (INTERPRET or FP8_DOT == "f16bits"):
        b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
        if E5:
            h = b << 8
        else:
            h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)
        return h.to(tl.float16, bitcast=True)
    elif _fp8_bits(FP8_DOT):
        return _fp8_asm(x, _BITS_E5M2 if E5 else _BITS_E4M3, not KEEP)
    elif KEEP and not INTERPRET:
        return _fp8_asm(x, _CVT_E5M2 if E5 else _CVT_E4M3, False)
    else:
        return x.to(tl.float16)
