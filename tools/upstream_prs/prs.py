"""The PR series: for each PR, the edits to upstream files and the new files it adds.

The edits are written here against MONAI 1.6.1's structure and found by class and function name
(``edits.py``); the new files (tests, benchmarks) are this repository's own, under ``payload/prNN/``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.upstream_prs.edits import (
    EditError,
    add_docstring_arg,
    add_import,
    add_parameter,
    append_to_body,
    edit_calls,
    find_def,
    guard_statements,
    insert_after,
    insert_before,
    node_span,
    replace_span,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VISTA3D = "monai/networks/nets/vista3d.py"
SEGRESNET_DS = "monai/networks/nets/segresnet_ds.py"
INFERER = "monai/inferers/inferer.py"


@dataclass(frozen=True)
class PR:
    number: str
    writeup: str  # path in this repository
    edits: dict[str, Callable[[str], str]]  # upstream file -> edit of its text
    tests: tuple[str, ...]  # test files run on the branch: upstream's of the touched modules and the new ones

    @property
    def branch(self) -> str:
        return f"vista3d-pr-{self.number}"

    @property
    def payload(self) -> Path:
        return HERE / "payload" / f"pr{self.number}"

    def apply(self, tree: Path) -> None:
        """Edit ``tree`` in place; raises ``EditError`` naming the file and function that moved."""
        for rel, edit in self.edits.items():
            path = tree / rel
            if not path.is_file():
                raise EditError(f"{rel} does not exist")
            try:
                path.write_text(edit(path.read_text()))
            except EditError as e:
                raise EditError(f"{rel}: {e}") from None
        for src in sorted(self.payload.rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts:
                dst = tree / src.relative_to(self.payload)
                if dst.exists():
                    raise EditError(f"{dst.relative_to(tree)} already exists upstream")
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(src.read_text())


# --- PR 01: the class head keeps its [K, C] matrix whatever K and C are -------------------------------------


def class_head_reshape(source: str) -> str:
    """``ClassMappingClassify.forward``: ``emb.squeeze()`` -> ``emb.reshape(-1, c)``, ``c`` the channel count."""
    func = find_def(source, "ClassMappingClassify.forward")
    unpack = next(
        (
            n
            for n in ast.walk(func)
            if isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Tuple)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr == "shape"
        ),
        None,
    )
    if unpack is None or len(unpack.targets[0].elts) != 5:  # type: ignore[attr-defined]
        raise EditError("ClassMappingClassify.forward no longer unpacks the 5-d feature shape")
    channels = unpack.targets[0].elts[1].id  # type: ignore[attr-defined]

    def rewrite(text: str, call: ast.Call) -> str:
        receiver = text[slice(*node_span(text, call.func.value))]  # type: ignore[attr-defined]
        return f"{receiver}.reshape(-1, {channels})"

    source = edit_calls(source, "ClassMappingClassify.forward", "squeeze", rewrite, nargs=0)
    func = find_def(source, "ClassMappingClassify.forward")
    product = next(s for s in func.body if "reshape(-1" in ast.get_source_segment(source, s))
    return insert_before(
        source, product, "# reshape, not squeeze(): [K, 1, C] -> [K, C] also when K or C is 1, one matmul for all"
    )


# --- PR 02: no empty_cache() per forward, no bottleneck copy; release_cached_memory=True keeps 1.6.1's calls ---

_RELEASE_PROPERTY = '''
@property
def release_cached_memory(self) -> bool:
    """Whether forward calls ``torch.cuda.empty_cache()`` between stages, as MONAI 1.6.1 always did."""
    return self._release_cached_memory

@release_cached_memory.setter
def release_cached_memory(self, value: bool) -> None:
    self._release_cached_memory = bool(value)
    if hasattr(self.point_head, "release_cached_memory"):  # the point head empties the cache too
        self.point_head.release_cached_memory = bool(value)
'''


def vista3d_release_option(source: str) -> str:
    source = guard_statements(source, "VISTA3D.forward", "empty_cache", "self.release_cached_memory")
    source = guard_statements(source, "PointMappingSAM.forward", "empty_cache", "self.release_cached_memory")
    source = append_to_body(source, "PointMappingSAM.__init__", "self.release_cached_memory = False")
    source = add_parameter(source, "VISTA3D.__init__", "release_cached_memory: bool = False")
    source = append_to_body(source, "VISTA3D.__init__", "self.release_cached_memory = release_cached_memory")
    source = add_docstring_arg(
        source,
        "VISTA3D",
        "release_cached_memory: call ``torch.cuda.empty_cache()`` between the stages of each forward, as MONAI "
        "1.6.1 did: lower reserved memory, slower repeated calls. Defaults to False.",
    )
    return insert_after(source, "VISTA3D.__init__", _RELEASE_PROPERTY)


def segresnet_shared_bottleneck(source: str) -> str:
    """``SegResNetDS2.forward``: both decoders read the bottleneck, neither writes it, so no ``clone()``."""

    def rewrite(text: str, call: ast.Call) -> str:
        return text[slice(*node_span(text, call.func.value))]  # type: ignore[attr-defined]

    source = edit_calls(source, "SegResNetDS2.forward", "clone", rewrite, nargs=0)
    func = find_def(source, "SegResNetDS2.forward")
    redundant = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "with_label"
        and len(n.body) == 1
        and isinstance(n.body[0], ast.Assign)
        and isinstance(n.body[0].value, ast.Name)
    ]
    for stmt in redundant:  # `if with_label: x_ = x` right after `x_ = x` says nothing: say why instead
        note = "# no copy: the decoders do not write into their input, so the point and class decoders share it"
        source = replace_span(source, node_span(source, stmt), note)
    return source


# --- PR 03: SlidingWindowInferer(timing=True) ------------------------------------------------------------------

_TIMER = '''
class _WindowTimer:
    """Wraps the network of one sliding-window pass: counts batches and windows, adds up the network's seconds.

    On CUDA the device is synchronised around each network call, so that the call is charged its own GPU work.
    """

    def __init__(self, network: Callable[..., Any], sw_batch_size: int) -> None:
        self.network = network
        self.sw_batch_size = sw_batch_size
        self.synchronized = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.forward = 0.0
        self.batches = 0
        self.windows = 0
        self._sync()
        self.start = time.perf_counter()

    def _sync(self) -> None:
        if self.synchronized:
            torch.cuda.synchronize()

    def __call__(self, window_data: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._sync()
        start = time.perf_counter()
        out = self.network(window_data, *args, **kwargs)
        self._sync()
        self.forward += time.perf_counter() - start
        self.batches += 1
        self.windows += int(window_data.shape[0])
        return out

    def finish(self) -> dict[str, Any]:
        """The pass's timings: seconds (``total``, ``forward``, ``other``), counts and settings."""
        self._sync()
        total = time.perf_counter() - self.start
        return {
            "total": total,
            "forward": self.forward,
            "other": total - self.forward,
            "windows": self.windows,
            "batches": self.batches,
            "sw_batch_size": self.sw_batch_size,
            "synchronized": self.synchronized,
        }


def format_window_timings(timings: dict[str, Any]) -> str:
    """One line for the log, e.g. ``total 40.1 ms | forward 31.0 ms (77%), other 9.1 ms (23%) | windows 8, ...``."""
    total = timings["total"]
    stages = ", ".join(
        f"{k} {timings[k] * 1e3:.1f} ms ({100 * timings[k] / total if total > 0 else 0:.0f}%)"
        for k in ("forward", "other")
    )
    counts = ", ".join(f"{k} {timings[k]}" for k in ("windows", "batches", "sw_batch_size", "synchronized"))
    return f"total {total * 1e3:.1f} ms | {stages} | {counts}"
'''


def inferer_timing(source: str) -> str:
    source = add_import(source, "time")
    source = add_parameter(source, "SlidingWindowInferer.__init__", "timing: bool = False")
    source = append_to_body(
        source,
        "SlidingWindowInferer.__init__",
        "self.timing = timing\nself.timings: dict[str, Any] = {}  # the last call's, filled when timing is True",
    )
    source = add_docstring_arg(
        source,
        "SlidingWindowInferer",
        "timing: after each call, store the seconds of the sliding-window pass (``total``), of the network calls "
        "(``forward``) and the rest (``other``: windowing, stitching, copies), with the counts of windows and "
        "batches, in ``self.timings`` and log them as one INFO line. On CUDA the device is synchronised around "
        "each network call. Defaults to False.",
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
        timer = _WindowTimer(network, self.sw_batch_size) if self.timing else None
        if timer is not None:
            network = timer  # the window loop calls the network once per batch of windows
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


PRS = (
    PR(
        "01",
        "docs/prs/01-broadcast-class-head.md",
        {VISTA3D: class_head_reshape},
        ("tests/networks/nets/test_vista3d.py", "tests/networks/nets/test_vista3d_class_head.py"),
    ),
    PR(
        "02",
        "docs/prs/02-no-class-only-allocation.md",
        {VISTA3D: vista3d_release_option, SEGRESNET_DS: segresnet_shared_bottleneck},
        (
            "tests/networks/nets/test_vista3d.py",
            "tests/networks/nets/test_segresnet_ds.py",
            "tests/networks/nets/test_vista3d_release_cached_memory.py",
        ),
    ),
    PR(
        "03",
        "docs/prs/03-sliding-window-timing.md",
        {INFERER: inferer_timing},
        ("tests/inferers/test_sliding_window_inference.py", "tests/inferers/test_sliding_window_timing.py"),
    ),
)
