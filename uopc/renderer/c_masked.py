"""Masked vector loads and stores, for the partial vector that ends a region of columns (codegen.lanes: an INDEX
whose arg is the number of valid lanes). Lanes past them are neither read (they load as 0) nor written:

    f32x16 val3 = uopc_mload_f32x16(data1+alu2, 5);     /* vmovups (%rdi), %zmm0{%k1}{z}, k1 = 0b11111 */
    uopc_mstore_f32x16(data0+alu4, acc1, 5);             /* vmovups %zmm0, (%rsi){%k1} */

The instruction is chosen by the preprocessor, from what the compiler targets: AVX-512's masked moves, AVX's
vmaskmov, else a copy of the valid bytes through memory (float vectors take it only without AVX; integer vectors,
rare in a lane tile, always do). The count is a constant at every call: the mask folds.
"""

from __future__ import annotations

from uopc.uop.dtype import DType, dtypes

__all__ = ["masked_helpers"]


def _moves(vt: DType) -> list[tuple[str, str, str]]:
    """[(preprocessor condition, load expression, store statement)] for vector type `vt`, tried in order: AVX-512's
    masked moves (512-bit: AVX512F; narrower: AVX512VL), then AVX's vmaskmov (256 and 128 bits). In them `z` is a
    zero vector, `k` the mask as a bit field, `lanes` as a vector of -1 (valid) and 0."""
    sc, bits = vt.scalar(), vt.itemsize * 8
    if sc not in (dtypes.float32, dtypes.float64) or bits not in (128, 256, 512):
        return []
    p = "ps" if sc is dtypes.float32 else "pd"
    k = f"(unsigned {'short' if vt.count == 16 else 'char'})k"
    out = [
        (
            "__AVX512F__" if bits == 512 else "__AVX512VL__",
            f"__builtin_ia32_loadu{p}{bits}_mask(p, z, {k})",
            f"__builtin_ia32_storeu{p}{bits}_mask(p, v, {k})",
        )
    ]
    if bits < 512:
        w = "256" if bits == 256 else ""
        t = vt.cname
        out.append(
            (
                "__AVX__",
                f"__builtin_ia32_maskload{p}{w}((const {t}*)p, lanes)",
                f"__builtin_ia32_maskstore{p}{w}(({t}*)p, lanes, v)",
            )
        )
    return out


_FALLBACK = (
    "  {t} v = {{0}};\n  __builtin_memcpy(&v, p, (unsigned)m * sizeof({s}));\n  return v;",
    "  __builtin_memcpy(p, &v, (unsigned)m * sizeof({s}));",
)


def _branches(vt: DType, load: bool) -> str:
    """The body of the load (or store) helper of vector type `vt`: one #if branch per instruction, the copy last."""
    sc, t, n = vt.scalar(), vt.cname, vt.count
    ints = "long long" if sc.itemsize == 8 else "int"
    setup = (
        f"  {t} z = {{0}};\n  unsigned k = (1u << m) - 1;\n  (void)z; (void)k;\n"
        f"  typedef {ints} lanes_t __attribute__((vector_size({vt.itemsize})));\n"
        f"  lanes_t lanes = (lanes_t){{{', '.join(map(str, range(n)))}}} < m;\n  (void)lanes;\n"
    )
    out, first = [], True
    for cond, ld, st in _moves(vt):
        code = f"return {ld};" if load else f"{st};"
        out.append(f"#{'if' if first else 'elif'} defined({cond})\n{setup}  {code}")
        first = False
    fallback = _FALLBACK[0 if load else 1].format(t=t, s=sc.cname)
    return "\n".join(out) + f"\n#else\n{fallback}\n#endif" if out else fallback


def masked_helpers(vt: DType) -> tuple[str, str]:
    """(name, C code) of the masked load and store of vector type `vt`: the code defines uopc_mload_<vt> and
    uopc_mstore_<vt>, both taking the number of valid lanes as their last argument."""
    t, s = vt.cname, vt.scalar().cname
    inline = "static inline __attribute__((always_inline))"
    code = (
        f"{inline} {t} uopc_mload_{t}(const {s}* p, int m) {{\n{_branches(vt, True)}\n}}\n"
        f"{inline} void uopc_mstore_{t}({s}* p, {t} v, int m) {{\n{_branches(vt, False)}\n}}\n"
    )
    return f"uopc_masked_{t}", code
