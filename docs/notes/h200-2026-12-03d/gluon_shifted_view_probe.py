import re, subprocess, tempfile, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait, fence_async_shared

@gluon.jit
def shifted_mma(x_ptr, w_ptr, y_ptr, SHIFT: gl.constexpr, SWZ: gl.constexpr, T: gl.constexpr, V: gl.constexpr,
                K: gl.constexpr, M: gl.constexpr, num_warps: gl.constexpr):
    # X: [T, K] rows of an input line; W: [M, K]; y[M, V] = W @ X[SHIFT:SHIFT+V]^T
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = gl.arange(0, T, layout=gl.SliceLayout(1, blk))
    cols = gl.arange(0, K, layout=gl.SliceLayout(0, blk))
    x = gl.load(x_ptr + rows[:, None] * K + cols[None, :])
    xl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWZ, element_bitwidth=16, rank=2)
    xs = gl.allocate_shared_memory(gl.float16, [T, K], xl, x)
    wrows = gl.arange(0, M, layout=gl.SliceLayout(1, blk))
    w = gl.load(w_ptr + wrows[:, None] * K + cols[None, :])
    ws = gl.allocate_shared_memory(gl.float16, [M, K], gl.NVMMASharedLayout(swizzle_byte_width=SWZ, element_bitwidth=16, rank=2), w)
    fence_async_shared()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, V, 16])
    acc = gl.zeros([M, V], gl.float32, acc_l)
    b = xs.slice(SHIFT, V, dim=0).permute((1, 0))
    acc = warpgroup_mma(ws, b, acc)
    out_rows = gl.arange(0, M, layout=gl.SliceLayout(1, acc_l))
    out_cols = gl.arange(0, V, layout=gl.SliceLayout(0, acc_l))
    gl.store(y_ptr + out_rows[:, None] * V + out_cols[None, :], acc)

def compile_probe(shift, swz, T=256, V=128, K=32, M=64):
    sig = {"x_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp32", "SHIFT": "constexpr", "SWZ": "constexpr", "T": "constexpr",
           "V": "constexpr", "K": "constexpr", "M": "constexpr", "num_warps": "constexpr"}
    const = dict(SHIFT=shift, SWZ=swz, T=T, V=V, K=K, M=M, num_warps=4)
    src = GluonASTSource(fn=shifted_mma, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))

if __name__ == "__main__":
    for swz in (0, 64):
        for shift in (0, 1, 8):
            try:
                c = compile_probe(shift, swz)
                print(f"swizzle {swz} shift {shift}: compiled, wgmma {c.asm['ptx'].count('wgmma.mma_async')}", flush=True)
            except Exception as e:
                print(f"swizzle {swz} shift {shift}: {type(e).__name__}: {str(e).splitlines()[-1][:300] if str(e) else ''}", flush=True)
