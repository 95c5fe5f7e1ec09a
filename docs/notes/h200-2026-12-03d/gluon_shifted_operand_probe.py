import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, fence_async_shared

@gluon.jit
def shifted_a_mma(x_ptr, w_ptr, y_ptr, SHIFT: gl.constexpr, T: gl.constexpr, V: gl.constexpr,
                  K: gl.constexpr, N: gl.constexpr, num_warps: gl.constexpr):
    # y[V, N] = X[SHIFT:SHIFT+V] @ W[K, N]; X staged in a plain shared buffer, read at a row offset into registers
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = gl.arange(0, T, layout=gl.SliceLayout(1, blk))
    cols = gl.arange(0, K, layout=gl.SliceLayout(0, blk))
    x = gl.load(x_ptr + rows[:, None] * K + cols[None, :])
    plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    xs = gl.allocate_shared_memory(gl.float16, [T, K], plain, x)
    wr = gl.arange(0, K, layout=gl.SliceLayout(1, blk))
    wc = gl.arange(0, N, layout=gl.SliceLayout(0, blk))
    w = gl.load(w_ptr + wr[:, None] * N + wc[None, :])
    ws = gl.allocate_shared_memory(gl.float16, [K, N], gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2), w)
    fence_async_shared()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    a = xs.slice(SHIFT, V, dim=0).load(a_l)
    acc = gl.zeros([V, N], gl.float32, acc_l)
    acc = warpgroup_mma(a, ws, acc)
    r = gl.arange(0, V, layout=gl.SliceLayout(1, acc_l))
    c = gl.arange(0, N, layout=gl.SliceLayout(0, acc_l))
    gl.store(y_ptr + r[:, None] * N + c[None, :], acc)

for shift in (0, 1, 2):
    sig = {"x_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp32", "SHIFT": "constexpr", "T": "constexpr", "V": "constexpr", "K": "constexpr", "N": "constexpr", "num_warps": "constexpr"}
    const = dict(SHIFT=shift, T=256, V=128, K=32, N=64, num_warps=4)
    try:
        c = triton.compile(GluonASTSource(fn=shifted_a_mma, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        ptx = c.asm["ptx"]
        print(f"shift {shift}: compiled; wgmma {ptx.count('wgmma.mma_async')}, ldmatrix {ptx.count('ldmatrix')}, ld.shared {ptx.count('ld.shared')}, shared {c.metadata.shared}", flush=True)
    except Exception as e:
        print(f"shift {shift}: {type(e).__name__}: {str(e)[:400]}", flush=True)
