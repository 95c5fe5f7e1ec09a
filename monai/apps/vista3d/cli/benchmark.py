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
"""What ``vista3d benchmark`` and ``vista3d --timing`` print: the stage table, the benchmark's timed runs, its
tables and its JSON. The command line (:mod:`monai.apps.vista3d.cli.main`) resolves the flags into a
:class:`BenchSetup` and drives the pipeline; the runs and their reporting live here."""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from monai.apps.vista3d.config import DEFAULT_EMBED_DIM
from monai.utils.profiling import WINDOW_STAGES

__all__ = ["BenchSetup", "stage_table", "total_seconds", "bench_segment", "best_of", "print_header", "print_tables",
           "write_json"]


@dataclass(frozen=True)
class BenchSetup:
    """What ``benchmark`` runs: the phantom, the window settings and the batch sizes swept, on ``device``."""

    device: torch.device
    size: tuple[int, int, int]
    spacing: tuple[float, float, float]
    sws: tuple[Any, ...]
    roi: tuple[int, ...]
    embed_dim: int
    amp: bool
    n_classes: int

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def reduced(self) -> bool:
        """Smaller than the bundle's network or window (the CPU default)."""
        return self.roi != (128, 128, 128) or self.embed_dim != DEFAULT_EMBED_DIM


def stage_table(timings: dict[str, float]) -> str:
    """The ``--timing`` table: each pipeline stage's seconds and share, the sliding window's under inference."""
    from monai.apps.vista3d.core.results import STAGES

    total = total_seconds(timings)
    rows = [f"{'stage':<28}{'seconds':>10}{'share':>8}"]
    for s in STAGES:
        if s not in timings:
            continue
        rows.append(f"{s:<28}{timings[s]:>10.3f}{100 * timings[s] / max(total, 1e-12):>7.1f}%")
        if s == "inference":
            for k in (*WINDOW_STAGES, "other"):
                v = timings.get(f"inference/{k}")
                if v is not None:
                    rows.append(f"  {'sliding-window ' + k:<26}{v:>10.3f}")
    rows.append(f"{'total':<28}{total:>10.3f}")
    return "\n".join(rows)


def total_seconds(timings: dict[str, float]) -> float:
    """The pipeline stages' seconds added up (their sub-stages, ``inference/...``, are inside ``inference``)."""
    from monai.apps.vista3d.core.results import STAGES

    return sum(timings.get(s, 0.0) for s in STAGES)


def bench_segment(pipe: Any, src: Path, out_dir: Path, prompt: Any, setup: BenchSetup) -> tuple[Any, float | None]:
    """One timed ``segment_file`` of the phantom: its result and the peak GPU memory in GiB (None on the CPU)."""
    if setup.cuda:
        torch.cuda.reset_peak_memory_stats(setup.device)
    result = pipe.segment_file(src, out_dir, prompt, overwrite=True)
    return result, torch.cuda.max_memory_allocated(setup.device) / 2**30 if setup.cuda else None


def best_of(segment: Callable, pipe: Any, repeats: int, sw: Any) -> dict[str, Any]:
    """The fastest of ``repeats`` runs at window batch ``sw``: its stage times, windows and peak memory."""
    best: dict[str, float] | None = None
    for _ in range(repeats):
        result, peak = segment(pipe)
        t = dict(result.timings, total=total_seconds(result.timings))
        if best is None or t["total"] < best["total"]:
            best = t
    return {"sw_batch_size": sw, "used": result.sw_batch_size, "windows": result.windows, "timings": best,
            "peak_gpu_gib": peak}


def print_header(setup: BenchSetup, overlap: float) -> None:
    size, roi = setup.size, setup.roi
    print(f"VISTA3D pipeline benchmark on {setup.device} ({torch.get_num_threads()} CPU threads, torch "
          f"{torch.__version__}, {platform.machine()})")
    print(f"phantom {size[0]}x{size[1]}x{size[2]} int16 .nii.gz at {setup.spacing} mm; {setup.n_classes} classes; "
          f"roi {roi[0]}x{roi[1]}x{roi[2]}, overlap {overlap}, amp {'on' if setup.amp else 'off'}")
    if setup.reduced:
        print(f"NOTE: reduced settings (vista3d132(encoder_embed_dim={setup.embed_dim}), roi {roi[0]}^3) so that the "
              "CPU default finishes in minutes; the bundle uses encoder_embed_dim=48, roi 128^3 (the CUDA default).")


def print_tables(runs: list[dict], streamed: dict[str, Any], shape_pre: tuple[int, ...], cuda: bool) -> None:
    print(f"network input after preprocessing: {shape_pre[0]}x{shape_pre[1]}x{shape_pre[2]} voxels, "
          f"{runs[0]['windows']} windows")
    print()
    print(f"per-stage times (sw_batch_size {runs[0]['sw_batch_size']}):")
    print(stage_table(runs[0]["timings"]))
    print()
    print("latency vs sw_batch_size:")
    header = f"{'sw_batch_size':>13}{'windows':>9}{'inference s':>13}{'forward s':>11}{'total s':>10}{'win/s':>8}"
    print(header + (f"{'peak GiB':>10}" if cuda else ""))
    for r in runs:
        t = r["timings"]
        sw_text = str(r["sw_batch_size"]) if r["sw_batch_size"] != "auto" else f"auto ({r['used']})"
        line = (f"{sw_text:>13}{r['windows']:>9}{t['inference']:>13.3f}"
                f"{t.get('inference/forward', float('nan')):>11.3f}{t['total']:>10.3f}"
                f"{r['windows'] / max(t['inference'], 1e-12):>8.2f}")
        print(line + (f"{r['peak_gpu_gib']:>10.2f}" if cuda else ""))
    peak_text = f", peak {streamed['peak_gpu_gib']:.2f} GiB" if cuda else ""
    print(f"streamed label map (segment's default), sw_batch_size {streamed['sw_batch_size']}: total "
          f"{streamed['total']:.3f} s, inference {streamed['timings']['inference']:.3f} s{peak_text}")


def write_json(args: argparse.Namespace, setup: BenchSetup, shape_pre: tuple[int, ...], runs: list[dict],
               streamed: dict[str, Any]) -> None:
    result = {
        "device": str(setup.device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "phantom_shape": setup.size, "spacing": setup.spacing, "roi_size": setup.roi,
        "encoder_embed_dim": setup.embed_dim, "overlap": args.overlap, "amp": setup.amp,
        "n_classes": setup.n_classes, "network_input_shape": shape_pre, "reduced": setup.reduced, "runs": runs,
        "streamed": streamed,
    }
    Path(args.json).write_text(json.dumps(result, indent=2))
    if not args.quiet:
        print(f"wrote {args.json}")
