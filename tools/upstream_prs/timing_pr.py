"""PR edits: ``SlidingWindowInferer(timing=True)`` reports the network's seconds and the rest of each call.

The timer wraps the network handed to upstream's unchanged window loop; on CUDA it synchronises only the device
the windows are on (the one the network runs on) and records how long those synchronisations took.
"""

from __future__ import annotations

import ast

from tools.upstream_prs.edits import (
    EditError,
    add_docstring_arg,
    add_from_import,
    add_import,
    add_parameter,
    append_to_body,
    extend_all,
    find_def,
    insert_after,
    insert_before,
    node_span,
    replace_span,
)

INFERER = "monai/inferers/inferer.py"
INFERERS_INIT = "monai/inferers/__init__.py"
INFERERS_RST = "docs/source/inferers.rst"

_TIMER = '''
class _WindowTimer:
    """
    Stands in for the network of one sliding-window pass: counts its calls and windows and adds up their seconds.

    Where the windows are on a CUDA device, that device (and only that one) is synchronised before and after each
    network call, so that a call is charged its own GPU work (the wait after the call is the network's). The waits
    before each call and at the end of the pass are for work queued outside the network (copies, stitching):
    they are part of ``other`` and are also added up in ``sync``, so that the time they take can be seen.
    """

    def __init__(self, network: Callable[..., Any], sw_batch_size: int, device: torch.device) -> None:
        self.network = network
        self.sw_batch_size = sw_batch_size
        self.devices = {device} if device.type == "cuda" else set()
        self.forward = 0.0
        self.sync = 0.0
        self.batches = 0
        self.windows = 0
        self._sync(count=False)  # work queued before the pass is not the pass's
        self.start = time.perf_counter()

    def _sync(self, count: bool = True) -> None:
        """Wait for the devices; with ``count``, add the wait to ``sync``."""
        if not self.devices:
            return
        start = time.perf_counter()
        for device in self.devices:
            torch.cuda.synchronize(device)
        if count:
            self.sync += time.perf_counter() - start

    def __call__(self, window_data: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if window_data.is_cuda and window_data.device not in self.devices:  # e.g. a sw_device other than the input's
            self.devices.add(window_data.device)
        self._sync()
        start = time.perf_counter()
        out = self.network(window_data, *args, **kwargs)
        self._sync(count=False)  # waiting here is the network's own GPU work: charged to forward
        self.forward += time.perf_counter() - start
        self.batches += 1
        self.windows += int(window_data.shape[0])
        return out

    def finish(self) -> dict[str, Any]:
        """The pass's timings: seconds (``total``, ``forward``, ``other``, ``sync``), counts and settings."""
        self._sync()
        total = time.perf_counter() - self.start
        return {
            "total": total,
            "forward": self.forward,
            "other": total - self.forward,
            "sync": self.sync,
            "windows": self.windows,
            "batches": self.batches,
            "sw_batch_size": self.sw_batch_size,
            "synchronized": [str(d) for d in sorted(self.devices, key=str)],
        }


def format_window_timings(timings: dict[str, Any]) -> str:
    """
    One log line for the ``timings`` of a ``SlidingWindowInferer(timing=True)`` call.

    Args:
        timings: the inferer's ``timings`` after a call.

    Returns:
        e.g. ``"total 40.1 ms | forward 31.0 ms (77%), other 9.1 ms (23%) | sync 0.2 ms | windows 8, batches 2"``.
    """
    total = timings["total"]
    stages = ", ".join(
        f"{k} {timings[k] * 1e3:.1f} ms ({100 * timings[k] / total if total > 0 else 0:.0f}%)"
        for k in ("forward", "other")
    )
    counts = ", ".join(f"{k} {timings[k]}" for k in ("windows", "batches", "sw_batch_size"))
    return f"total {total * 1e3:.1f} ms | {stages} | sync {timings['sync'] * 1e3:.1f} ms | {counts}"
'''


def inferer_timing(source: str) -> str:
    source = add_import(source, "time")
    source = extend_all(source, "format_window_timings")
    source = add_parameter(source, "SlidingWindowInferer.__init__", "timing: bool = False")
    source = append_to_body(
        source,
        "SlidingWindowInferer.__init__",
        "self.timing = timing\nself.timings: dict[str, Any] = {}  # the last call's, filled when timing is True",
    )
    source = add_docstring_arg(
        source,
        "SlidingWindowInferer",
        "timing: after each call, store in ``self.timings`` the seconds of the sliding-window pass (``total``), of "
        "the network calls (``forward``), of the rest (``other``: padding, slicing, stitching, copies) and of "
        "the part of ``other`` spent waiting for the device before each network call and at the end (``sync``), "
        "with the counts of windows and batches, and log them as one INFO line (see "
        ":py:func:`format_window_timings`). Where the windows are on a CUDA device, that device is synchronised "
        "around each network call. Defaults to False: nothing is measured.",
    )
    func = find_def(source, "SlidingWindowInferer.__call__")
    ret = func.body[-1]
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)):
        raise EditError("SlidingWindowInferer.__call__ no longer ends by returning a call")
    if getattr(ret.value.func, "id", None) != "sliding_window_inference":
        raise EditError("SlidingWindowInferer.__call__ no longer returns sliding_window_inference(...)")
    if not any(getattr(a, "id", None) == "network" for a in ret.value.args):
        raise EditError("SlidingWindowInferer.__call__ no longer passes `network` to sliding_window_inference")
    # `return sliding_window_inference(...)` -> `result = sliding_window_inference(...)`, the timer around it
    start, value_start = node_span(source, ret)[0], node_span(source, ret.value)[0]
    source = replace_span(source, (start, value_start), "result = ")
    source = insert_before(
        source,
        find_def(source, "SlidingWindowInferer.__call__").body[-1],
        """
        timer = None
        if self.timing:  # the window loop calls the network once per batch of windows
            timer = _WindowTimer(network, self.sw_batch_size, torch.device(self.sw_device or inputs.device))
            network = timer
        """,
    )
    source = append_to_body(
        source,
        "SlidingWindowInferer.__call__",
        """
        if timer is not None:
            self.timings = timer.finish()
            logger.info(f"{type(self).__name__}: {format_window_timings(self.timings)}")
        return result
        """,
    )
    return insert_after(source, "SlidingWindowInfererAdapt", _TIMER)


def inferers_init_export(source: str) -> str:
    return add_from_import(source, ".inferer", ["format_window_timings"])


def inferers_rst(text: str) -> str:
    anchor = ".. autofunction:: monai.inferers.sliding_window_inference\n"
    if text.count(anchor) != 1:
        raise EditError("no '.. autofunction:: monai.inferers.sliding_window_inference' line to add beside")
    return text.replace(anchor, anchor + "\n.. autofunction:: monai.inferers.format_window_timings\n")
