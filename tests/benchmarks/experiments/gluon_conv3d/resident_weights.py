# Copyright (c) MONAI Consortium
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The resident-weight Gluon convolution of :py:mod:`monai.networks.kernels.conv3d_resident`, on the GPU against
float64 and the Triton kernel, and compiled on the CPU (not on any path).

How it came to be (docs/CHANGELOG.md, 14 x 48 -> 48 x 128^3 on the H200): a draft with one output plane per tile
(12.4 ms) drained its load pipeline at every tile; v2 (9.2 ms) loaded across tile boundaries and fed each patch to
two output planes, all from one warpgroup; warp specialization (a producer warp, one warpgroup per output plane) took
it to 8.6 ms, bit for bit the same outputs; loading a 10-row slab per input plane and column shift instead of a patch
per shift (12 loads per tile instead of 36: the L2 had been 80-85 % busy) to 7.1 ms. The single warpgroup's code is
gone; the patch loads remain for Tritons that refuse the slab views (3.9), and ``run`` times both.

Compile the kernel (without and with the statistics and the residual) for sm_90 here (no GPU needed; prints shared
bytes, registers and spills from ptxas, wgmma and TMA instructions in the PTX)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py --compile-only

On the H200 (each variant checked against float64, then timed next to the Triton kernel's default)::

    python tests/benchmarks/experiments/gluon_conv3d/resident_weights.py
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton
from triton.compiler.compiler import CompiledKernel

from monai.networks.kernels import conv3d_resident


def resources(c: CompiledKernel) -> str:
    """Shared bytes, registers and spills (``n_regs`` / ``n_spills`` need a GPU to load the kernel, so ptxas -v
    is rerun on the PTX as Triton runs it) and the wgmma / TMA instructions in the PTX (static counts: the loops
    are not unrolled)."""
    import re
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(c.asm["ptx"])
        f.flush()
        log = subprocess.run(
            [triton.knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"],
            capture_output=True,
            text=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    ptx = c.asm["ptx"]
    stores = ptx.count(".global.shared::cta.bulk_group")
    return (
        f"shared {c.metadata.shared} B, {regs.group(1) if regs else '?'} registers, "
        f"spills {'%s/%s B (stores/loads)' % spills.groups() if spills else '?'}, "
        f"wgmma {ptx.count('wgmma.mma_async')} in {ptx.count('wgmma.commit_group')} groups, "
        f"TMA loads {ptx.count('cp.async.bulk.tensor') - stores}, TMA stores {stores}"
    )


FORMS = ((False, False), (True, False), (True, True))  # (statistics, residual) of the fused path's launches


def label(stats: bool, residual: bool) -> str:
    return f"conv3x3x3_resident{' +stats' if stats else ''}{' +residual' if residual else ''}"


def run(batch: int = 14, size: int = 128, extras: tuple | list = (), patches: bool = True) -> None:
    """On a Hopper GPU: the module's kernel with slab loads, then with patch loads (its ``slabs`` argument; not when
    ``patches`` is False), then ``extras`` (``(name, function)`` pairs: experiments' kernels with
    :py:func:`conv3x3x3_resident`'s call), each without and with its statistics, and with the statistics and the
    input as its residual, against float64 and timed, next to conv3x3x3's default (the same three forms).

    Checked per form and variant, on outputs whose memory was just filled with NaN (a voxel never written shows): the
    first and the last sample in full (worst plane's relative error: the last planes, the end of the batch and so the
    cross-tile look-ahead and the plane pairing of every tile a program walks), the zero padding channels, and an
    odd shape (D = 13: the last tile's second plane lies outside; H, W not multiples of the tile) on 5 programs, so
    each program walks many tiles. The statistics against the float64 mean and variance of the float64 output
    (with the residual: conv(x) + x) rounded to fp16 (the values as stored), on the same samples."""
    import time

    import torch.nn.functional as F

    from monai.networks.kernels.conv3d import ConvLaunch, conv3x3x3, conv3x3x3_weights
    from monai.networks.kernels.conv3d_resident import conv3x3x3_resident
    from monai.networks.kernels.padded_weights import pad_channels

    start = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    x = pad_channels(torch.randn(batch, 48, size, size, size, generator=g).cuda().half(), 64)
    x_odd = pad_channels(torch.randn(2, 48, 13, 20, 24, generator=g).cuda().half(), 64)
    weight = (torch.randn(48, 48, 3, 3, 3, generator=g) / (27 * 48) ** 0.5).cuda()
    gemm = conv3x3x3_weights(weight, out_columns=64)
    w64 = weight.double()

    def reference(t):
        return F.conv3d(t[:, :48].double(), w64, padding=1)

    def worst_plane_err(out, ref):  # max over samples and planes of |out - ref| / |ref| per plane
        diff = (out[:, :48].double() - ref).flatten(3).norm(dim=3).norm(dim=1)
        return (diff / ref.flatten(3).norm(dim=3).norm(dim=1)).max().item()

    def stats_err(stats, ref):
        # worst |mean - ref| in units of the channel's standard deviation, and worst relative variance error, of
        # the real channels; the padding channels' statistics must be zeros
        mean, var = stats
        ref_var, ref_mean = torch.var_mean(ref.half().double(), dim=(2, 3, 4), unbiased=False)
        pad_ok = bool((mean[:, 48:] == 0).all()) and bool((var[:, 48:] == 0).all())
        e_mean = ((mean[:, :48].double() - ref_mean).abs() / ref_var.sqrt()).max().item()
        e_var = ((var[:, :48].double() - ref_var).abs() / ref_var).max().item()
        return e_mean, e_var, pad_ok

    def poisoned(like, fn):  # fn's output allocation reuses the block of this NaN tensor, freed just before
        torch.full_like(like, float("nan"))
        return fn()

    refs = reference(x[:1]), reference(x[-1:]), reference(x_odd)
    # the residual is the input itself (its padding channels are zero), as in the blocks' conv2
    refs_residual = tuple(r + t[:, :48].double() for r, t in zip(refs, (x[:1], x[-1:], x_odd)))
    base = conv3x3x3_weights(weight, out_columns=64, planes=2)
    triton_default = ConvLaunch(8, 16, 4, 3, 2, True)
    ms_triton = {
        form: triton.testing.do_bench(
            lambda f=form: conv3x3x3(x, base, f[0], x if f[1] else None, triton_default)
        )
        for form in FORMS
    }
    flop = 2 * 48 * 48 * 27 * batch * size**3
    print(f"Triton default (8x16 voxels x 2 planes, swapped): {ms_triton[FORMS[0]]:.3f} ms, with statistics "
          f"{ms_triton[FORMS[1]]:.3f} ms, with statistics and residual {ms_triton[FORMS[2]]:.3f} ms")  # fmt: skip
    kernels = [("slab loads", functools.partial(conv3x3x3_resident, slabs=True))]
    if patches:
        kernels.append(("patch loads", functools.partial(conv3x3x3_resident, slabs=False)))
    kernels += list(extras)
    for (stats, res), (kernel, conv) in [(form, k) for k in kernels for form in FORMS]:
        want = refs_residual if res else refs
        name = f"{label(stats, res)}, {kernel}"
        try:
            out, st = poisoned(x, lambda s=stats, r=res: conv(x, gemm, s, residual=x if r else None))
            out_odd, st_odd = poisoned(x_odd, lambda s=stats, r=res: conv(x_odd, gemm, s, 5, x_odd if r else None))
            torch.cuda.synchronize()
        except Exception as e:  # reported, not fatal: the other lines still stand
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        errs = (
            worst_plane_err(out[:1], want[0]),
            worst_plane_err(out[-1:], want[1]),
            worst_plane_err(out_odd, want[2]),
        )
        pad_ok = bool((out[:, 48:] == 0).all()) and bool((out_odd[:, 48:] == 0).all())
        text = ""
        if stats:
            checks = [
                stats_err((st[0][:1], st[1][:1]), want[0]),
                stats_err((st[0][-1:], st[1][-1:]), want[1]),
                stats_err(st_odd, want[2]),
            ]
            pad_stats = "zero" if all(c[2] for c in checks) else "WRONG"
            text = (
                f"; statistics vs float64 of the fp16-rounded output: worst |mean err| / std "
                f"{max(c[0] for c in checks):.2e}, worst var rel. err {max(c[1] for c in checks):.2e}, "
                f"padding channels' {pad_stats}"
            )
        del out, out_odd, st, st_odd
        ms = triton.testing.do_bench(lambda s=stats, r=res: conv(x, gemm, stats=s, residual=x if r else None))
        print(f"{name}: {ms:.3f} ms ({flop / ms / 1e9:.0f} TFLOP/s), worst-plane rel. err first sample "
              f"{errs[0]:.2e}, last {errs[1]:.2e}, odd shape {errs[2]:.2e}, padding channels "
              f"{'zero' if pad_ok else 'WRONG'}{text}; Triton default {ms_triton[stats, res]:.3f} ms")  # fmt: skip
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compile-only", action="store_true", help="compile the kernel for sm_90 here (no GPU needed)")
    a = p.parse_args()
    if a.compile_only:
        for slabs in (True, False):
            for stats, res in ((False, False), (False, True), (True, False), (True, True)):
                c = conv3d_resident.compile_for_sm90(stats=stats, residual=res, slabs=slabs)
                print(f"{label(stats, res)}, {'slab' if slabs else 'patch'} loads: {resources(c)}")
    else:
        run()
