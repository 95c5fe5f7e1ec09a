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
"""The fused channels-last VISTA3D forward against the module path, and its kernels against PyTorch's.

Three parts, each optional:

* ``--kernels``: one full-resolution 3x3x3 convolution (48 channels) and one instance norm + ReLU of a window batch,
  as PyTorch/cuDNN run them in the module path and as the fused path runs them (channels-last, 64 padded
  channels, the Triton norm kernel): ms, TFLOP/s or GB/s, and the relative error of each against a float64
  reference computed on the first window.
* ``--conv``: the Triton implicit-GEMM convolution (:py:mod:`monai.networks.kernels.conv3d`) in several launch
  configurations, with and without its statistics epilogue, beside cuDNN on the same padded tensors.
* ``--forward``: ``vista3d132`` (random weights, 117 classes, fp16 autocast) on window batches of each size, module
  path and fused path: ms per window, peak GiB, and the agreement of their logits (max / mean abs difference) and
  labels (argmax over classes, background where no logit is > 0).
* ``--profile B,...``: the CUDA kernels of one fused forward of each batch ``B``, grouped by kind, with their share.

    python tests/benchmarks/vista3d_fused.py --device cuda --kernels --conv --forward \
        --sw-batch-sizes 1,2,14 --profile 14
    python tests/benchmarks/vista3d_fused.py --forward     # CPU: the tiny network, the PyTorch reference kernels
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vista3d_everything import build_net, everything_labels, label_map  # noqa: E402

from monai.networks.kernels import dispatch  # noqa: E402
from monai.networks.kernels.conv3d import FUSED_LAUNCHES  # noqa: E402
from monai.networks.kernels.dispatch import FusedConfig  # noqa: E402
from monai.networks.nets import vista3d_fused  # noqa: E402

# the fused path's configuration of this run (--graph-max-windows, --cudnn-benchmark); the variants of --triton-conv
# change its convolution fields
BASE = FusedConfig()


def bench(fn, cuda: bool, repeats: int = 10) -> float:
    """Median milliseconds of ``fn`` after two warm-up calls (CUDA events on the GPU)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def kernels(dev: torch.device, batch: int, size: int) -> list[dict]:
    from monai.networks.kernels.instance_norm import NormAct, instance_stats, norm_act
    from monai.networks.kernels.padded_weights import pad_channels

    cuda = dev.type == "cuda"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 48, size, size, size, generator=g).to(dev, torch.float16)
    w = (torch.randn(48, 48, 3, 3, 3, generator=g) / 36).to(dev, torch.float16)
    x_cl, w_cl = x.contiguous(memory_format=torch.channels_last_3d), w.contiguous(memory_format=torch.channels_last_3d)
    x_pad = pad_channels(x, 64)
    w_pad = F.pad(w, (0, 0, 0, 0, 0, 0, 0, 16, 0, 16)).contiguous(
        memory_format=torch.channels_last_3d
    )  # [64, 64, 3, 3, 3]
    ref = F.conv3d(x[:1].double(), w.double(), padding=1)
    flop = 2 * 48 * 48 * 27 * batch * size**3
    rows = []
    for name, fn in [
        ("conv 48->48, cuDNN NCDHW", lambda: F.conv3d(x, w, padding=1)),
        ("conv 48->48, cuDNN NDHWC", lambda: F.conv3d(x_cl, w_cl, padding=1)),
        ("conv 48->48, cuDNN NDHWC padded to 64", lambda: F.conv3d(x_pad, w_pad, padding=1)),
    ]:
        ms = bench(fn, cuda)
        err = rel_error(fn()[:1, :48], ref)
        rows.append({"op": name, "ms": ms, "tflops": flop / ms / 1e9, "rel_err": err})
    y = F.conv3d(x, w, padding=1)
    y_pad = pad_channels(y, 64)
    gamma, beta = torch.randn(48, generator=g).to(dev), torch.randn(48, generator=g).to(dev)
    gamma_p, beta_p = F.pad(gamma, (0, 16)), F.pad(beta, (0, 16))
    yd = y[:1].double()
    var, mean = torch.var_mean(yd, dim=(2, 3, 4), unbiased=False, keepdim=True)
    ref = torch.relu(
        (yd - mean) / torch.sqrt(var + 1e-5) * gamma.double().view(1, -1, 1, 1, 1) + beta.double().view(1, -1, 1, 1, 1)
    )
    moved = 2 * y.numel() * 2  # one read and one write of fp16 (the fused kernel also reads once for statistics)
    spec = NormAct(act="relu")
    variants = [
        ("instance norm + ReLU, PyTorch NCDHW", lambda: torch.relu(F.instance_norm(y, weight=gamma, bias=beta))),
        (
            "instance norm + ReLU, PyTorch NDHWC",
            lambda: torch.relu(
                F.instance_norm(y.contiguous(memory_format=torch.channels_last_3d), weight=gamma, bias=beta)
            ),
        ),
        (
            "instance norm + ReLU, fused kernel NDHWC padded to 64",
            lambda: norm_act(y_pad, gamma_p, beta_p, spec, real_channels=48),
        ),
    ]
    for block_s, warps in ((64, 4), (128, 4), (128, 8), (256, 8)):
        variants.append(
            (
                f"norm statistics alone, block {block_s}, {warps} warps",
                lambda b=block_s, nw=warps: instance_stats(y_pad, block_s=b, num_warps=nw)[0].view(-1, 64, 1, 1, 1),
            )
        )
    # the apply pass alone, in place on a copy with its statistics given (as the fused path runs it after a
    # convolution): unit affine, so repeating it keeps the values bounded; it moves the 48 real channels twice
    y_apply, stats = y_pad.clone(), instance_stats(y_pad)
    ones, zeros = torch.ones(64, device=dev), torch.zeros(64, device=dev)
    for block_s, warps in ((128, 4), (256, 4), (256, 8), (512, 8), (64, 2)):
        variants.append(
            (
                f"norm apply alone, in place, block {block_s}, {warps} warps",
                lambda b=block_s, nw=warps: norm_act(
                    y_apply, ones, zeros, spec, None, 48, out=y_apply, stats=stats, block_s=b, num_warps=nw
                ),
            )
        )
    moved_stats = y_pad.numel() * 2
    moved_apply = 2 * y.numel() * 2
    for name, fn in variants:
        ms = bench(fn, cuda)
        if name.startswith("norm apply alone"):
            rows.append({"op": name, "ms": ms, "gbps": moved_apply / ms / 1e6, "rel_err": float("nan")})
            continue
        if name.startswith("norm statistics"):
            rows.append(
                {
                    "op": name,
                    "ms": ms,
                    "gbps": moved_stats / ms / 1e6,
                    "rel_err": rel_error(fn()[:1, :48], mean.view(1, 48, 1, 1, 1)),
                }
            )
            continue
        err = rel_error(fn()[:1, :48], ref)
        rows.append({"op": name, "ms": ms, "gbps": moved / ms / 1e6, "rel_err": err})
    for r in rows:
        rate = f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r else f"{r['gbps']:7.1f} GB/s  "
        print(f"{r['op']:58s} {r['ms']:8.3f} ms {rate} rel. err {r['rel_err']:.2e}", flush=True)
    return rows


def conv_variants(dev: torch.device, batch: int, size: int, channels: int) -> list[dict]:
    """The Triton implicit-GEMM convolution beside cuDNN's: over padded channels (as cuDNN runs) and over the real
    input channels only (48 = 32 + 16), with one or two output planes per program, and with the residual add and
    the next norm's statistics folded in."""
    from monai.networks.kernels.conv3d import ConvLaunch, conv3x3x3, conv3x3x3_weights
    from monai.networks.kernels.instance_norm import merge_parts, merge_parts_triton
    from monai.networks.kernels.padded_weights import pad_channels, padded_channels

    cuda = dev.type == "cuda"
    g = torch.Generator().manual_seed(0)
    cp = padded_channels(channels)
    x = pad_channels(torch.randn(batch, channels, size, size, size, generator=g).to(dev, torch.float16), cp)
    w_real = (torch.randn(channels, channels, 3, 3, 3, generator=g) / (channels * 27) ** 0.5).to(dev, torch.float16)
    w = torch.zeros(cp, cp, 3, 3, 3, device=dev, dtype=torch.float16)
    w[:channels, :channels] = w_real
    w_cl = w.contiguous(memory_format=torch.channels_last_3d)
    gemm_padded = conv3x3x3_weights(w)  # [27 * cp, cp]
    # real K, padded N (padding channels computed as zeros), stacked for 1, 2 or 4 output planes per program
    gemms = {p: conv3x3x3_weights(w_real, out_columns=cp, planes=p) for p in (1, 2, 4)}
    ref = F.conv3d(x[:1, :channels].double(), w_real.double(), padding=1)
    flop = 2 * channels * channels * 27 * batch * size**3  # the real channels' work
    L = ConvLaunch
    variants = [
        (f"cuDNN NDHWC padded to {cp}", lambda: F.conv3d(x, w_cl, padding=1)),
        (f"Triton GEMM {cp}x{cp}, 16x16 voxels, 4 warps, 3 stages", lambda: conv3x3x3(x, gemm_padded)[0]),
    ]
    if cp == 64:
        # (16x32 voxels, 8 warps, one plane, swapped: 523 ms, a register cliff; measured once; docs/CHANGELOG.md)
        launches = [L(16, 16, 4, 3, 1), L(8, 16, 8, 3, 2), L(16, 16, 4, 3, 1, True), L(8, 32, 4, 3, 1, True)]
        launches += [L(8, 16, 4, 3, 2, True), L(8, 16, 8, 3, 2, True), L(16, 16, 8, 3, 2, True)]
        launches += [L(16, 16, 8, 4, 2, True), L(8, 32, 8, 3, 2, True), L(8, 16, 8, 3, 4, True)]
        folded = [L(16, 16, 4, 3, 1, True), L(8, 16, 4, 3, 2, True), L(8, 16, 8, 3, 2, True), L(16, 16, 8, 3, 2, True)]
    else:
        launches = [L(16, 16, 8, 3, 1), L(8, 16, 4, 3, 1, True), L(16, 16, 8, 3, 1, True), L(8, 16, 8, 3, 2, True)]
        # the last two fit two programs per SM (98 / 111 KB of shared memory; the first, the forward's launch, takes
        # 221 KB and 249 registers a thread)
        folded = [L(16, 16, 8, 3, 1, True), L(8, 16, 8, 3, 2, True), L(8, 16, 4, 2, 1, True), L(8, 8, 4, 3, 1, True)]

    def name(la: ConvLaunch) -> str:
        swap = ", swapped" if la.swap else ""
        shape = f"{la.block_h}x{la.block_w} voxels x {la.planes} plane(s)"
        return f"{shape}, {la.num_warps} warps, {la.num_stages} stages{swap}"

    for la in launches:
        run = lambda la=la: conv3x3x3(x, gemms[la.planes], launch=la)[0]  # noqa: E731
        variants.append((f"Triton GEMM {channels}x{cp}, {name(la)}", run))
    for la in folded:
        run = lambda la=la: conv3x3x3(x, gemms[la.planes], True, launch=la)[0]  # noqa: E731
        variants.append((f"Triton GEMM {channels}x{cp}, {name(la)} +stats", run))
        # checked as conv(x) + x - x; timed without the subtraction
        timed = lambda la=la: conv3x3x3(x, gemms[la.planes], True, x, la)  # noqa: E731
        variants.append(
            (f"Triton GEMM {channels}x{cp}, {name(la)} +residual +stats", lambda t=timed: t()[0] - x, timed)
        )
    rows = []
    for label, fn, *timed in variants:
        try:
            ms = bench(timed[0] if timed else fn, cuda)
            err = rel_error(fn()[:1, :channels], ref)
        except Exception as e:  # a launch configuration the compiler rejects is reported, not fatal
            print(f"{channels} ch, {label:72s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        rows.append(
            {"op": f"conv {channels}->{channels} {batch}x{size}^3, {label}", "ms": ms, "tflops": flop / ms / 1e9}
        )
        rows[-1]["rel_err"] = err
        print(f"{channels} ch, {label:72s} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s rel. err {err:.2e}", flush=True)
    # the statistics' merge (Triton, part of every "+stats" row above) on its own, beside its PyTorch reference
    n_parts = batch * size * (size // 16) ** 2
    mean, m2 = (torch.rand(batch, n_parts // batch, cp, device=dev) for _ in range(2))
    counts = torch.full((batch, n_parts // batch), 256.0, device=dev)
    merges = {
        "Triton": lambda: merge_parts_triton(counts, mean, m2),
        "PyTorch": lambda: merge_parts(mean, m2, counts[0]),
    }
    for label, fn in merges.items():
        ms = bench(fn, cuda)
        rows.append({"op": f"merge of {n_parts} x {cp} patch statistics, {label}", "ms": ms})
        name = f"merge of the patch statistics (16x16 patches), {label}"
        print(f"{channels} ch, {name:72s} {ms:8.3f} ms", flush=True)
    return rows


# logits closer than this to a tie (between the two best classes, or of the best class to the threshold 0) make a
# label that fp16 rounding may flip; with random weights many voxels are that close
TIE_MARGIN = 0.01


def clear_of_ties(logits: torch.Tensor, margin: float) -> torch.Tensor:
    """Voxels of ``[C, ...]`` logits whose label no change of the logits below ``margin / 2`` can flip."""
    top = logits.topk(2, dim=0).values
    return ((top[0] - top[1]) > margin) & (top[0].abs() > margin / 2)


def conv_tables() -> dict[str, dict]:
    """Named choices of which convolutions the fused forward runs through the Triton kernel (``--triton-conv``): the
    :py:class:`FusedConfig` fields ``triton_launches`` and ``resident_conv`` of each; only ``default`` runs the
    48-channel convolutions through the resident-weight Gluon kernel (where the GPU runs it; slab or patch loads as
    the installed Triton builds them), ``noresident`` is the default without it, ``patches`` the default with the
    resident kernel's patch loads. ``upcudnn`` is the default with the decoders' upsampling on cuDNN and the skip
    add a pass of its own, ``up16x16``, ``up8x16``, ``up4w``, ``upnoswap``, ``up2s``, ``up4w2s`` and ``up8x8`` the
    default with the upsampling kernel's launch given (16 x 16 voxels on 8 warps in 3 stages, the default before
    ``up4w2s``; 8 x 16 voxels on 8 warps; on 4 warps; 16 x 16 with voxels as the MMA's M side; 16 x 16 in 2 stages;
    8 x 16 voxels on 4 warps in 2 stages, the default; 8 x 8 likewise: two or three programs per SM); ``normpass``
    the default with the class features' last norm as a pass of its own before the class product; ``resident96``
    the default with the 96-channel convolutions as four resident-weight ones (``FusedConfig.resident_96``); ``96p2``,
    ``96p2s2`` and ``96x8s4`` the default with the 96-channel convolutions on two stacked planes of 8 x 16 voxels
    (3 or 2 stages) or on one plane of 8 x 16 with 4 stages (the default: 16 x 16, 3 stages), ``96w4s2`` and
    ``96x8x8`` on one plane of 8 x 16 voxels, 4 warps, 2 stages, or 8 x 8, 4 warps, 3 stages (two programs per
    SM), ``up4w2s+96w4s2`` (and the other three pairs) both; ``cudnn`` runs every convolution on cuDNN."""
    from monai.networks.kernels.conv3d import ConvLaunch as L

    default = dict(FUSED_LAUNCHES)
    resident = dict(triton_launches=default, resident_conv=FusedConfig().resident_conv)
    tables = {
        "default": resident,
        "upcudnn": dict(resident, upsample_launches={}),
        "normpass": dict(resident, norm_in_product=False),
        "resident96": dict(resident, resident_96=True),
        "96p2": dict(resident, triton_launches={**default, 128: L(8, 16, 8, 3, 2, True)}),
        "96p2s2": dict(resident, triton_launches={**default, 128: L(8, 16, 8, 2, 2, True)}),
        "96x8s4": dict(resident, triton_launches={**default, 128: L(8, 16, 8, 4, 1, True)}),
        "96w4s2": dict(resident, triton_launches={**default, 128: L(8, 16, 4, 2, 1, True)}),
        "96x8x8": dict(resident, triton_launches={**default, 128: L(8, 8, 4, 3, 1, True)}),
        "up16x16": dict(resident, upsample_launches={64: L(16, 16, 8, 3, 1, True)}),
        "up8x16": dict(resident, upsample_launches={64: L(8, 16, 8, 3, 1, True)}),
        "up4w": dict(resident, upsample_launches={64: L(8, 16, 4, 3, 1, True)}),
        "upnoswap": dict(resident, upsample_launches={64: L(16, 16, 8, 3, 1, False)}),
        "up2s": dict(resident, upsample_launches={64: L(16, 16, 8, 2, 1, True)}),
        "up4w2s": dict(resident, upsample_launches={64: L(8, 16, 4, 2, 1, True)}),
        "up8x8": dict(resident, upsample_launches={64: L(8, 8, 4, 2, 1, True)}),
        "patches": dict(triton_launches=default, resident_conv="patches"),
        "noresident": dict(triton_launches=default, resident_conv="off"),
        "cudnn": dict(triton_launches={}, resident_conv="off", upsample_launches={}),
        "64s+128s": dict(triton_launches={64: L(16, 16, 4, 3, 1, True), 128: L(16, 16, 8, 3, 1, True)}),
        "64s2+128s": dict(triton_launches={64: L(8, 16, 4, 3, 2, True), 128: L(16, 16, 8, 3, 1, True)}),
        "64s2w8+128s": dict(triton_launches={64: L(8, 16, 8, 3, 2, True), 128: L(16, 16, 8, 3, 1, True)}),
        "64s2x16+128s": dict(triton_launches={64: L(16, 16, 8, 3, 2, True), 128: L(16, 16, 8, 3, 1, True)}),
        "64s4+128s": dict(triton_launches={64: L(8, 16, 8, 3, 4, True), 128: L(16, 16, 8, 3, 1, True)}),
        "64s2w8+128s2": dict(triton_launches={64: L(8, 16, 8, 3, 2, True), 128: L(8, 16, 8, 3, 2, True)}),
    }
    # each upsampling candidate beside each 96-channel one (both launches with two or more programs per SM)
    for up in ("up4w2s", "up8x8"):
        for c96 in ("96w4s2", "96x8x8"):
            tables[f"{up}+{c96}"] = dict(tables[c96], upsample_launches=tables[up]["upsample_launches"])
    return tables


def variant(name: str, cuda: bool) -> FusedConfig:
    """The run's configuration with the convolutions of ``--triton-conv`` choice ``name`` (the PyTorch reference
    kernels off the GPU); the experimental tables leave the 48-channel convolutions to the Triton kernel."""
    fields = {"resident_conv": "off", **conv_tables()[name]}
    return dataclasses.replace(BASE, kernels="triton" if cuda else "torch", **fields)


def forward(
    dev: torch.device, batch_sizes: list[int], roi: int, n_classes: int, repeats: int, tables: list[str]
) -> list[dict]:
    """The module path against the fused path, for each of ``tables`` (names from :py:func:`conv_tables`); the
    first fused variant is the row's "fused"."""
    cuda = dev.type == "cuda"
    net = build_net(not cuda, dev)
    labels = torch.tensor(everything_labels()[:n_classes])
    cv = labels.view(-1, 1).to(dev)

    def run(x):
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            return net(x, class_vector=cv, transpose=True)

    rows = []
    for bs in batch_sizes:
        x = torch.rand((bs, 1, roi, roi, roi), generator=torch.Generator().manual_seed(bs)).to(dev)
        row = {"sw_batch_size": bs}
        outputs, maps, clear = {}, {}, {}
        for path in ["modules"] + [f"fused[{t}]" for t in tables]:
            net.fuse(False if path == "modules" else variant(path[6:-1], cuda))  # fuse() again: new graphs
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            ms = bench(functools.partial(run, x), cuda, repeats)
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else float("nan")
            out = run(x)
            maps[path] = torch.stack([label_map(out[i].float(), labels) for i in range(bs)])
            if path == "fused[cudnn]":  # the reference of goal 4: where its labels are clear of near-ties
                clear[path] = torch.stack([clear_of_ties(out[i].float(), TIE_MARGIN) for i in range(bs)])
            if path in ("modules", f"fused[{tables[0]}]"):
                outputs[path] = out
            del out
            row[path] = {"ms_per_window": ms / bs, "peak_gib": peak}
        for t in tables:  # each variant's labels against the module path and the fused path on cuDNN
            result = row[f"fused[{t}]"]
            result["label_agreement"] = (maps[f"fused[{t}]"] == maps["modules"]).double().mean().item()
            text = f"labels equal to the modules' {100 * result['label_agreement']:.4f} %"
            if "cudnn" in tables and t != "cudnn":
                same = maps[f"fused[{t}]"] == maps["fused[cudnn]"]
                ok = clear["fused[cudnn]"]
                result["label_agreement_cudnn"] = same.double().mean().item()
                result["label_agreement_cudnn_clear"] = same[ok].double().mean().item()
                result["cudnn_clear_fraction"] = ok.double().mean().item()
                text += (
                    f", to the fused cuDNN path's {100 * result['label_agreement_cudnn']:.4f} % (on the "
                    f"{100 * result['cudnn_clear_fraction']:.2f} % of voxels whose logits clear ties by "
                    f"{TIE_MARGIN}: {100 * result['label_agreement_cudnn_clear']:.4f} %)"
                )
            if t != tables[0]:
                row.setdefault("variants", {})[t] = row.pop(f"fused[{t}]")
            timing = f"{result['ms_per_window']:7.2f} ms/window {result['peak_gib']:6.2f} GiB"
            print(f"bs {bs:3d}: fused[{t}] {timing}, {text}", flush=True)
        la, lb = maps["modules"], maps[f"fused[{tables[0]}]"]
        del maps, clear
        row["fused"], outputs["fused"] = row.pop(f"fused[{tables[0]}]"), outputs.pop(f"fused[{tables[0]}]")
        row["fused"]["table"] = tables[0]
        a, b = outputs["modules"].float(), outputs["fused"].float()
        diff = (a - b).abs()
        row.update(
            {
                "logit_max_abs_diff": diff.max().item(),
                "logit_mean_abs_diff": diff.mean().item(),
                "label_agreement": (la == lb).double().mean().item(),
            }
        )
        if cuda and bs <= 2:  # how far each fp16 path is from the float32 module path (TF32 off)
            net.fuse(False)
            tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            with torch.no_grad():
                ref = net(x, class_vector=cv, transpose=True).float()
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
            lr = torch.stack([label_map(ref[i], labels) for i in range(bs)])
            for path, out_, lab in (("modules", a, la), ("fused", b, lb)):
                row[path].update(
                    {
                        "rel_err_vs_fp32": ((out_ - ref).norm() / ref.norm()).item(),
                        "labels_equal_fp32": (lab == lr).double().mean().item(),
                    }
                )
            print(
                f"         vs float32: modules rel. err {row['modules']['rel_err_vs_fp32']:.2e} labels "
                f"{100 * row['modules']['labels_equal_fp32']:.4f} % | "
                f"fused rel. err {row['fused']['rel_err_vs_fp32']:.2e} "
                f"labels {100 * row['fused']['labels_equal_fp32']:.4f} %"
            )
            del ref
        m, f = row["modules"], row["fused"]
        print(
            f"bs {bs:3d}: modules {m['ms_per_window']:7.2f} ms/window {m['peak_gib']:6.2f} GiB | fused "
            f"{f['ms_per_window']:7.2f} ms/window {f['peak_gib']:6.2f} GiB | speed-up "
            f"{m['ms_per_window'] / f['ms_per_window']:.2f} | logits max {row['logit_max_abs_diff']:.4g} mean "
            f"{row['logit_mean_abs_diff']:.3g} | labels equal {100 * row['label_agreement']:.4f} %",
            flush=True,
        )
        rows.append(row)
        del outputs, a, b, x
    net.fuse(False)
    return rows


_KINDS = [  # the first kind whose keys a kernel's name contains
    ("3x3x3 convolution, resident weights (Gluon)", ("_resident_conv_kernel",)),
    ("norm statistics / residual add (Triton)", ("_stats_kernel",)),
    ("first convolution (Triton)", ("_single_channel_kernel",)),
    ("3x3x3 convolution (Triton)", ("_conv_kernel",)),
    ("norm apply (Triton)", ("_apply_kernel",)),
    ("transposed convolution", ("dgrad", "convTranspose", "conv_transpose")),
    ("convolution", ("conv", "xmma", "implicit", "sm90_", "cudnn", "fprop")),
    ("matmul", ("gemm", "cutlass", "ampere_", "sm80_")),
    ("elementwise / copy", ("elementwise", "vectorized", "copy", "fill", "reduce", "Memcpy", "Memset")),
]


def fused_forward(
    dev: torch.device, bs: int, roi: int, n_classes: int, config: FusedConfig | None = None
) -> Callable[[], torch.Tensor]:
    """One fp16 fused forward of ``bs`` random ``roi``-cubed windows of a random ``vista3d132`` (``config``, default
    the run's), as a callable."""
    net = build_net(False, dev).fuse(BASE if config is None else config)
    cv = torch.tensor(everything_labels()[:n_classes], device=dev).view(-1, 1)
    x = torch.rand((bs, 1, roi, roi, roi), generator=torch.Generator().manual_seed(0)).to(dev)

    def run():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            return net(x, class_vector=cv, transpose=True)

    return run


def memory_peak(dev: torch.device, bs: int, roi: int, n_classes: int, path: str) -> dict:
    """Record the allocator's history over one fused forward of ``bs`` windows, write the snapshot to ``path``
    (open it at https://pytorch.org/memory_viz) and return the peak above the weights and input."""
    run = fused_forward(dev, bs, roi, n_classes)
    run()  # compile and warm up first: the history then holds one forward
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    out = run()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    print(f"--- one fused forward of {bs} windows: peak {peak:.2f} GiB above the weights and input "
          f"({peak / bs:.3f} GiB per window), output {out.numel() * out.element_size() / 2**30:.2f} GiB; "
          f"snapshot {path}", flush=True)  # fmt: skip
    return {"sw_batch_size": bs, "peak_gib": peak, "snapshot": path}


def kernel_gaps(events) -> tuple[float, list[tuple[str, float, str, float]]]:
    """Microseconds from the first CUDA kernel's start to the last one's end, and each stretch in between with no
    kernel running: ``(name of the kernel that ends it, microseconds, name of the kernel that ended last before
    it, its start in microseconds from the first kernel's start)``."""
    from torch.autograd import DeviceType

    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    if not kernels:
        return 0.0, []
    gaps, end, last = [], kernels[0][1], kernels[0][2]
    for start, stop, name in kernels[1:]:
        if start > end:
            gaps.append((name, start - end, last, end - kernels[0][0]))
        if stop >= end:
            end, last = stop, name
    return end - kernels[0][0], gaps


def longest_gaps(gaps: list[tuple[str, float, str, float]], n: int = 12) -> list[tuple[str, float, str, float]]:
    """The ``n`` longest of :py:func:`kernel_gaps`' idle stretches ``gaps``, longest first."""
    return sorted(gaps, key=lambda g: -g[1])[:n]


def kind_of(kernel: str) -> str:
    """The kind (:data:`_KINDS`) of a CUDA kernel's name."""
    return next((k for k, keys in _KINDS if any(s.lower() in kernel.lower() for s in keys)), "other")


def idle_before_kinds(gaps: list[tuple[str, float, str, float]]) -> dict[str, tuple[int, float]]:
    """The GPU's idle time between kernels (:py:func:`kernel_gaps`' stretches ``gaps``), by the kind of the kernel
    that ends each: ``{kind: (gaps, ms)}``."""
    idle: dict[str, tuple[int, float]] = {}
    for name, us, *_ in gaps:
        n, ms = idle.get(kind_of(name), (0, 0.0))
        idle[kind_of(name)] = (n + 1, ms + us / 1e3)
    return dict(sorted(idle.items(), key=lambda kv: -kv[1][1]))


def profile(dev: torch.device, bs: int, roi: int, n_classes: int, config: FusedConfig) -> list[dict]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run = fused_forward(dev, bs, roi, n_classes, config)
    real_f = vista3d_fused.F

    class LayoutSpy:  # reports convolutions whose output cuDNN did not leave channels-last
        def __getattr__(self, name):
            fn = getattr(real_f, name)
            if name not in ("conv3d", "conv_transpose3d"):
                return fn

            def spy(x, w, *args):
                y = fn(x, w, *args)
                if not y.is_contiguous(memory_format=torch.channels_last_3d):
                    print(
                        f"  layout copy after {name}: in {tuple(x.shape)} -> out {tuple(y.shape)} strides {y.stride()}"
                    )
                return y

            return spy

    vista3d_fused.F = dispatch.F = LayoutSpy()  # the pointwise and transposed ones, and the 3x3x3 ones on cuDNN
    run()
    vista3d_fused.F = dispatch.F = real_f
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats(dev)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        run()
        torch.cuda.synchronize()
    after = torch.cuda.memory_stats(dev)
    # a cudaMalloc or cudaFree inside the forward (the caching allocator growing or releasing memory; a free waits
    # for the whole device) leaves the GPU idle while the host catches up
    counters = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
    print("--- the caching allocator during the profiled forward: "
          + ", ".join(f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in counters))  # fmt: skip
    print("--- operators by CUDA time, with input shapes")
    print(
        prof.key_averages(group_by_input_shape=True).table(
            sort_by="cuda_time_total", row_limit=15, max_name_column_width=40, max_shapes_column_width=80
        )
    )
    totals: dict[str, float] = {}
    names: dict[str, set] = {}
    for evt in prof.key_averages():
        if evt.device_type != DeviceType.CUDA:  # count kernels only: the operators that launched them repeat them
            continue
        us = getattr(evt, "self_device_time_total", None) or getattr(evt, "self_cuda_time_total", 0.0)
        if not us:
            continue
        kind = kind_of(evt.key)
        totals[kind] = totals.get(kind, 0.0) + us / 1e3
        names.setdefault(kind, set()).add(evt.key[:60])
    total = sum(totals.values())
    rows = [
        {"kind": k, "ms": v, "ms_per_window": v / bs, "share": v / total}
        for k, v in sorted(totals.items(), key=lambda kv: -kv[1])
    ]
    print(f"--- CUDA kernels of one fused forward of {bs} windows: {total:.1f} ms ({total / bs:.2f} ms / window)")
    # (one sweep of the events for the span, the idle time and its two summaries below)
    span_us, gaps = kernel_gaps(prof.events())
    span, busy = span_us / 1e3, (span_us - sum(g[1] for g in gaps)) / 1e3
    print(f"  first kernel start to last kernel end {span:.2f} ms, kernels running {busy:.2f} ms, GPU idle between "
          f"them {span - busy:.2f} ms ({(span - busy) / bs:.3f} ms / window)")  # fmt: skip
    for r in rows:
        print(f"  {r['kind']:28s} {r['ms']:8.2f} ms {r['ms_per_window']:7.2f} ms/window {100 * r['share']:5.1f} %")
    print("  idle GPU before each kind of kernel (gaps, ms):")
    for kind, (n, ms) in idle_before_kinds(gaps).items():
        print(f"    {kind:40s} {n:4d} gaps {ms:7.3f} ms")
    print("  the longest idle stretches (at ms from the first kernel: the kernel before -> the kernel after):")
    for after, us, before, at in longest_gaps(gaps):
        print(f"    {us:7.1f} us at {at / 1e3:7.3f} ms: {before[:60]} -> {after[:60]}")
    print(f"  without the profiler: {bench(run, True):.2f} ms per forward of {bs} windows")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--kernels", action="store_true", help="time single convolutions and norms")
    p.add_argument("--kernel-batch", type=int, default=14)
    p.add_argument("--conv", action="store_true", help="time the Triton convolution against cuDNN (48 and 96 channels)")
    p.add_argument("--forward", action="store_true", help="time the module and the fused forward")
    p.add_argument("--sw-batch-sizes", default="1,2,14")
    p.add_argument(
        "--triton-conv",
        default="default",
        help="comma-separated choices of convolutions for the fused forward (default, normpass, resident96, 96p2, "
        "96p2s2, 96x8s4, 96w4s2, 96x8x8, upcudnn, up16x16, up8x16, up4w, upnoswap, up2s, up4w2s, up8x8, up4w2s+96w4s2, "
        "up4w2s+96x8x8, up8x8+96w4s2, up8x8+96x8x8, patches, noresident, cudnn, "
        "64s+128s, 64s2+128s, 64s2w8+128s, 64s2x16+128s, 64s4+128s, 64s2w8+128s2: padded widths run through the "
        "Triton kernel, s = the swapped product, s2/s4 = two/four stacked planes per program, w8 = 8 warps, x16 = "
        "16x16 voxels; default and patches run the 48-channel convolutions through the resident-weight Gluon "
        "kernel (default: slab loads where the installed Triton builds them; patches: patch loads), noresident is "
        "default without it)",
    )
    p.add_argument("--roi", type=int, default=None)
    p.add_argument("--classes", type=int, default=117)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", default="", help="profile one fused forward of each of these window batches (1,14)")
    p.add_argument(
        "--profile-conv", default="default", choices=sorted(conv_tables()), help="the --triton-conv choice profiled"
    )
    p.add_argument(
        "--memory-snapshot",
        default=None,
        help="write the allocator's history of one fused forward (the largest --sw-batch-sizes) to this pickle",
    )
    p.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="let cuDNN time its algorithms (cudnn.benchmark) for the module path too (the fused path's own "
        "first-call autotuning is on by default; --no-fused-autotune turns it off)",
    )
    p.add_argument("--no-fused-autotune", action="store_true", help="FusedConfig(cudnn_autotune=False)")
    p.add_argument(
        "--graph-max-windows", type=int, default=None, help="replay CUDA graphs up to this window batch (default: 4)"
    )
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    global BASE
    BASE = dataclasses.replace(BASE, cudnn_autotune=not a.no_fused_autotune)
    if a.graph_max_windows is not None:
        BASE = dataclasses.replace(BASE, graph_max_windows=a.graph_max_windows)
    print(f"fused path: {BASE}", flush=True)
    roi = a.roi or (128 if cuda else 32)
    out: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}
    if a.kernels:
        out["kernels"] = kernels(dev, a.kernel_batch if cuda else 1, roi)
    if a.conv:
        batch = a.kernel_batch if cuda else 1
        out["conv"] = conv_variants(dev, batch, roi, 48) + conv_variants(dev, batch, roi // 2, 96)
    if a.forward:
        tables = a.triton_conv.split(",")
        unknown = set(tables) - set(conv_tables())
        if unknown:
            p.error(f"--triton-conv: unknown choice(s) {sorted(unknown)}; choose from {sorted(conv_tables())}")
        if len(set(tables)) < len(tables):
            p.error(f"--triton-conv: a choice named twice in {a.triton_conv!r}; name each once (a row per choice)")
        sizes = [int(b) for b in a.sw_batch_sizes.split(",")]
        out["forward"] = forward(dev, sizes, roi, a.classes, a.repeats, tables)
    if a.memory_snapshot and cuda:
        out["memory"] = memory_peak(dev, max(int(b) for b in a.sw_batch_sizes.split(",")), roi, a.classes,
                                    a.memory_snapshot)  # fmt: skip
    if a.profile and cuda:
        config = variant(a.profile_conv, cuda)
        print(f"--- profiles of {a.profile_conv!r}: {config}")
        out["profile"] = {bs: profile(dev, bs, roi, a.classes, config) for bs in map(int, a.profile.split(","))}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
