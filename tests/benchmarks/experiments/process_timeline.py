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
"""Experiment: the ``vista3d`` command in this process, with a timeline of what it pays before its label map.

Runs ``python -m monai.apps.vista3d ARGS`` (its ``main``) in this process and prints, to stderr, when each
milestone was reached in seconds since the process started (from ``/proc/self/stat``, 10 ms ticks): the
interpreter up, ``import torch``, the CLI's imports, the CUDA context, each ``torch.load`` (on whichever thread),
the network's first forward called and returned (device synchronized), each CUDA graph captured, the label
map's line printed and the return of ``main``. ``KEY=VALUE`` pairs before ``--`` replace fields of the
``FusedConfig`` the command fuses with (``graph_max_windows=4``, ``cudnn_autotune=True``) to measure what each policy
costs a fresh process; ``exit=fast`` ends the process with ``os._exit`` once ``main`` has returned and the streams are
flushed, skipping the interpreter's teardown (time the process from outside to see what that teardown costs: on an
H100 at e74e066, 0.73 s passed between ``main``'s return and the exit); where the command has ``run`` (the program:
what it does before ``main`` and its exit), ``exit=fast`` runs ``main`` through it, as the ``vista3d`` program does.
They are for this experiment only, not user settings.

    python tests/benchmarks/experiments/process_timeline.py graph_max_windows=0 -- -i ct.nii.gz -o out --weights m.pt
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
import traceback
from pathlib import Path


def _since_start() -> float:
    """Seconds since this process started (the kernel's start time of the process; 10 ms resolution)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


_T0 = time.perf_counter() - _since_start()  # perf_counter at the process start
_EVENTS: list[tuple[float, str]] = []
_LOCK = threading.Lock()


def mark(what: str) -> None:
    with _LOCK:
        _EVENTS.append((time.perf_counter() - _T0, what))


mark("interpreter up, this script running")
import torch  # noqa: E402

mark("import torch")


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        out[key] = {"True": True, "False": False}.get(value, int(value) if value.lstrip("-").isdigit() else value)
    return out


def _wrap(owner, name: str, before, after: str | None, once: bool = False, sync: bool = False):
    """Mark each call of ``owner.name`` (the first only when ``once``): ``before`` (a string, or a function giving
    one at the call) and ``after`` its return."""
    original = getattr(owner, name)
    seen = []

    def wrapper(*args, **kwargs):
        first = not seen
        seen.append(1)
        if before and (first or not once):
            mark(f"{before() if callable(before) else before} [{threading.current_thread().name}]")
        out = original(*args, **kwargs)
        if after and (first or not once):
            if sync and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            mark(f"{after} [{threading.current_thread().name}]")
        return out

    setattr(owner, name, wrapper)


def _cuda_asked_for() -> str:
    """The mark of the first ``torch.cuda._lazy_init``: with the package's function that called it (the innermost
    frame in the ``monai`` package), where there is one."""
    import monai

    package = str(Path(monai.__file__).parent) + os.sep
    frames = [f for f in traceback.extract_stack() if f.filename.startswith(package)]
    return f"CUDA context asked for by {Path(frames[-1].filename).name}:{frames[-1].name}" if frames else \
        "CUDA context asked for"


def _time_triton_loads() -> list[float]:
    """Seconds of each Triton kernel's load (``JITFunction._do_compile``: from the cache when it holds the kernel)."""
    seconds: list[float] = []
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return seconds
    original = getattr(JITFunction, "_do_compile", None)
    if original is None:  # another Triton: nothing to time
        return seconds

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    JITFunction._do_compile = timed
    return seconds


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else 0
    config = _overrides(argv[:split])
    fast_exit = config.pop("exit", None) == "fast"
    cli = argv[split + 1:] if "--" in argv else argv
    from monai.apps.vista3d.cli import main as vista3d_main

    mark("import monai.apps.vista3d")
    from monai.networks.kernels import graph_cache
    from monai.networks.kernels.dispatch import FusedConfig
    from monai.networks.nets.vista3d import VISTA3D

    fuse = VISTA3D.fuse

    def fuse_with(self, cfg=None):
        if config:  # over what the command asked for (a one-CT process: no graphs, no cuDNN autotuning)
            cfg = dataclasses.replace(cfg or FusedConfig(), **config)
        return fuse(self, cfg)

    VISTA3D.fuse = fuse_with
    _wrap(VISTA3D, "fuse", "fuse called", "fuse returned")
    try:  # Triton hashes its own install once a process, before its first kernel is looked up in the cache
        from triton.runtime import cache as triton_cache

        _wrap(triton_cache, "triton_key", "triton_key called", "triton_key returned", once=True)
    except ImportError:
        pass
    from monai.apps.vista3d.batch import run as batch_run
    from monai.apps.vista3d.core import checkpoint, network_ready
    from monai.apps.vista3d.core.pipeline import Vista3DPipeline

    _wrap(checkpoint, "_check_finite", "finite check called", "finite check returned")
    _wrap(checkpoint, "_check_keys", "keys check called", None)
    _wrap(network_ready, "network_from_checkpoint", None, "checkpoint read into the network (CPU)")
    _wrap(network_ready, "on_device", None, "network on the device, fused")
    _wrap(batch_run, "load_for", "image load called", "image loaded", once=True)
    _wrap(batch_run, "timed_save", "save called", "saved", once=True)
    _wrap(Vista3DPipeline, "__init__", None, "pipeline built", once=True)
    _wrap(Vista3DPipeline, "segment", "segment called", "segment returned", once=True, sync=True)
    _wrap(Vista3DPipeline, "preprocess", "preprocess called", "preprocess returned", once=True)
    _wrap(Vista3DPipeline, "stream", "stream called", None, once=True)
    _wrap(torch.cuda, "_lazy_init", _cuda_asked_for, "CUDA context up", once=True)
    _wrap(batch_run, "check_image", "image checks called", "image checks returned", once=True)
    _wrap(batch_run._Work, "loader", "loader started", None, once=True)
    _wrap(batch_run._Work, "ready_segmenter", "network build started", None, once=True)
    _wrap(torch, "load", "torch.load called", "torch.load returned")
    _wrap(VISTA3D, "forward", "first forward called", "first forward returned", once=True, sync=True)
    _wrap(graph_cache.GraphCache, "_capture", "graph capture called", "graph captured", sync=True)
    # the first call of each library the first forward pays for (cuBLAS, cuDNN), and Triton's loads from its cache
    _wrap(torch.nn.functional, "linear", "first linear called", "first linear returned", once=True, sync=True)
    _wrap(torch.nn.functional, "conv3d", "first conv3d called", "first conv3d returned", once=True, sync=True)
    _wrap(torch.nn.functional, "conv_transpose3d", "first conv_transpose3d called", "first conv_transpose3d returned",
          once=True, sync=True)
    loads = _time_triton_loads()
    out = sys.stdout

    class Lines:
        def write(self, text):
            if " -> " in text:
                mark("label map line printed")
            return out.write(text)

        def __getattr__(self, name):
            return getattr(out, name)

    command_main = vista3d_main.main

    def timed_main(_argv=None) -> int:
        sys.stdout = Lines()
        try:
            return command_main(cli)
        finally:
            sys.stdout = out
            mark("main returned")
            out.flush()

    def print_timeline() -> None:
        previous = 0.0
        print(f"process timeline ({' '.join(argv[:split]) or 'defaults'}): seconds since start, step",
              file=sys.stderr)
        for t, what in _EVENTS:
            print(f"  {t:7.3f}  +{t - previous:6.3f}  {what}", file=sys.stderr)
            previous = t
        if loads:
            print(f"Triton kernels loaded (compiled or read from the cache): {len(loads)}, {sum(loads):.3f} s on the "
                  f"threads that launched them", file=sys.stderr)

    if fast_exit and hasattr(vista3d_main, "run"):  # the program itself: it runs the exit handlers, then os._exit
        vista3d_main.main = timed_main
        atexit.register(print_timeline)
        vista3d_main.run()
    code = timed_main()
    print_timeline()
    if fast_exit:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
