"""PR edits for VISTA3D clicks on the GPU: the point windows stitched where the network runs, and connected
components labelled on the tensor's device.

``point_based_window_inferer(..., device=None)`` stitches on ``device`` (None: the CPU, as before).
``label_connected_components`` labels a boolean tensor on its own device with the numbering of
``skimage.measure.label``; the click post-processing (``keep_merge_components_with_points``,
``keep_components_with_positive_points``) uses it for tensors off the CPU when cuCIM is not there, instead of a
round trip through the host. The labeller below is this repository's own code.
"""

from __future__ import annotations

import ast

from tools.upstream_prs.edits import (
    EditError,
    add_docstring_arg,
    add_parameter,
    extend_all,
    find_def,
    insert_after,
    insert_before,
    node_span,
    replace_span,
    edit_calls,
    find_statements,
    insert_elif,
    one_statement,
    wrap_in_else,
)

VISTA3D_INFERER = "monai/apps/vista3d/inferer.py"
TRANSFORMS_UTILS = "monai/transforms/utils.py"

# --- point_based_window_inferer(device=) -------------------------------------------------------------------------


def _cpu_literals(func: ast.AST) -> list[ast.Constant]:
    """The ``"cpu"`` of every ``device="cpu"`` keyword and every ``.to("cpu")`` call in ``func``."""
    hits = []
    for n in ast.walk(func):
        if not isinstance(n, ast.Call):
            continue
        for kw in n.keywords:
            if kw.arg == "device" and isinstance(kw.value, ast.Constant) and kw.value.value == "cpu":
                hits.append(kw.value)
        is_to = isinstance(n.func, ast.Attribute) and n.func.attr == "to"
        if is_to and len(n.args) == 1 and isinstance(n.args[0], ast.Constant) and n.args[0].value == "cpu":
            hits.append(n.args[0])
    return hits


def point_inferer_device(source: str) -> str:
    name = "point_based_window_inferer"
    literals = _cpu_literals(find_def(source, name))
    if len(literals) < 3:  # the two stitching buffers and the copy of each window's output
        raise EditError(f"{name} no longer stitches on the CPU in the places this edit changes")
    for lit in sorted(literals, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        source = replace_span(source, node_span(source, lit), "stitch_device")
    source = add_parameter(source, name, "device: torch.device | str | None = None", allow_kwargs=True)
    source = add_docstring_arg(
        source,
        name,
        "device: the device the windows' outputs are stitched on and the result is returned on. Defaults to "
        "None: the CPU. Passing the network's device (e.g. that of ``inputs`` on a GPU) keeps the stitching, "
        "the fill from ``prev_mask`` and the result there, without copying every window's output to the host.",
    )
    func = find_def(source, name)
    first = func.body[1] if isinstance(func.body[0], ast.Expr) else func.body[0]  # after the docstring
    return insert_before(
        source, first, 'stitch_device = torch.device("cpu") if device is None else torch.device(device)'
    )


# --- label_connected_components and its use by the click post-processing -----------------------------------------

_LABELLER = '''
def _min_over_axis(x: torch.Tensor, axis: int) -> torch.Tensor:
    """The minimum of each element and its two neighbours along ``axis`` (one neighbour at the ends)."""
    n = x.shape[axis]
    out = x.clone()
    if n > 1:
        lo, hi = x.narrow(axis, 0, n - 1), x.narrow(axis, 1, n - 1)
        out.narrow(axis, 0, n - 1).copy_(torch.minimum(lo, hi))
        tail = out.narrow(axis, 1, n - 1)
        tail.copy_(torch.minimum(tail, lo))
    return out


def _neighbourhood_min(x: torch.Tensor, axis_groups: list[tuple[int, ...]]) -> torch.Tensor:
    """
    The minimum over each element's neighbourhood: the union of the 3^c cubes spanned by each group of c axes.

    An offset is at most ``c`` orthogonal hops away exactly when its non-zero entries lie within ``c`` axes, so
    the neighbourhood of connectivity ``c`` is that union; the minimum over one cube is one pass per axis.
    """
    result = x
    for group in axis_groups:
        y = x
        for axis in group:
            y = _min_over_axis(y, axis)
        result = torch.minimum(result, y)
    return result


def _foreground_box(mask: torch.Tensor) -> tuple[slice, ...] | None:
    """The smallest box holding every ``True`` of ``mask`` (None if there is none), read from the device once."""
    if mask.ndim == 1:
        profiles = [mask]
    else:
        profiles = [mask.amax(dim=[d for d in range(mask.ndim) if d != axis]) for axis in range(mask.ndim)]
    flat = torch.cat(profiles).cpu().numpy()
    box, start = [], 0
    for size in mask.shape:
        hit = np.flatnonzero(flat[start : start + size])
        if len(hit) == 0:
            return None
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
        start += size
    return tuple(box)


def _first_voxel_labels(mask: torch.Tensor, connectivity: int) -> torch.Tensor:
    """
    Each voxel of ``mask`` labelled with the flat index of its component's first voxel in raster order.

    A voxel's label is always the flat index of a voxel of its component. Each round a voxel takes the smallest
    label of its neighbourhood and hooks its old label's entry to it too, so that a whole tree moves at once;
    then every label is replaced by its label's label (pointer jumping), twice. Background voxels hold
    ``mask.numel()``, and so does one extra entry that they point to. The rounds run in pairs; the loop ends when
    the second of a pair changes nothing, which is one read from the device per pair.
    """
    numel = mask.numel()
    dtype = torch.int32 if numel < 2**31 - 1 else torch.int64
    axis_groups = list(itertools.combinations(range(mask.ndim), connectivity))
    big = torch.tensor(numel, dtype=dtype, device=mask.device)
    positions = torch.arange(numel, device=mask.device)
    labels = torch.cat([torch.where(mask.reshape(-1), positions.to(dtype), big), big[None]])
    while True:
        for _ in range(2):
            before = labels.clone()
            near = _neighbourhood_min(labels[:numel].view(mask.shape), axis_groups)
            near = torch.where(mask, near, big).reshape(-1)
            labels[:numel] = torch.minimum(labels[:numel], near)
            # hook the old label's entry; voxels that saw nothing lower hook their own entry (a no-op), so that
            # the many voxels of a settled region do not all write to one address
            lower = near < before[:numel]
            labels.scatter_reduce_(0, torch.where(lower, before[:numel].long(), positions), near, reduce="amin")
            labels = labels[labels.long()]
            labels = labels[labels.long()]
        if torch.equal(labels, before):
            return labels[:numel].view(mask.shape)


def label_connected_components(
    img: torch.Tensor, connectivity: int | None = None, return_num: bool = False
) -> torch.Tensor | tuple[torch.Tensor, int]:
    """
    Label the connected components of a tensor on its own device, numbered as ``skimage.measure.label`` numbers
    them: 0 for the background, then 1, 2, ... in the raster (C) order of each component's first voxel.

    Unlike ``skimage.measure.label`` (and ``cucim.skimage.measure.label``), it runs on any torch device without
    copying the tensor elsewhere; the work is plain torch operations in a few rounds of pointer hooking and
    jumping, so a CUDA tensor is labelled on its GPU. The result is read from the device a few times (the
    foreground's bounding box, and once every two rounds to detect the end).

    Args:
        img: tensor of any number of dimensions; non-zero values are the foreground.
        connectivity: maximum number of orthogonal hops between neighbours, 1 to ``img.ndim``, as in
            ``skimage.measure.label``. Defaults to None: ``img.ndim`` (e.g. 26-connectivity in 3D).
        return_num: whether to also return the number of components.

    Returns:
        an int64 tensor of labels with the shape and device of ``img``, and the number of components if
        ``return_num`` is True.

    Raises:
        ValueError: when ``connectivity`` is not in ``[1, img.ndim]``.
    """
    mask = img if img.dtype == torch.bool else img != 0
    connectivity = mask.ndim if connectivity is None else int(connectivity)
    if mask.ndim > 0 and not 1 <= connectivity <= mask.ndim:
        raise ValueError(f"connectivity must be in [1, {mask.ndim}] for a {mask.ndim}D input, got {connectivity}.")
    # axes of size 1 have no neighbours along them: without them the components and their order are the same
    squeezed = mask.reshape([s for s in mask.shape if s > 1])
    if squeezed.ndim == 0:  # a single voxel
        single = mask.to(torch.int64)
        return (single, int(single.sum())) if return_num else single
    out = torch.zeros(squeezed.shape, dtype=torch.int64, device=mask.device)
    box = _foreground_box(squeezed)
    num = 0
    if box is not None:  # every component is inside the foreground's box, in the same raster order
        sub = squeezed[box]
        roots = _first_voxel_labels(sub, max(1, min(connectivity, sub.ndim)))
        firsts = torch.unique(roots[sub])
        out[box] = torch.where(sub, torch.searchsorted(firsts, roots) + 1, 0)
        num = int(firsts.numel())
    out = out.reshape(mask.shape)
    return (out, num) if return_num else out
'''


def _keep_merge_on_device(source: str) -> str:
    """``keep_merge_components_with_points``: a branch for torch tensors off the CPU (cuCIM's comes first)."""
    name = "keep_merge_components_with_points"

    def is_use_cp(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "use_cp"

    source = insert_elif(
        source,
        one_statement(source, name, is_use_cp, "'if use_cp:'"),  # type: ignore[arg-type]
        'isinstance(img_pos, torch.Tensor) and img_pos.device.type != "cpu"',
        """
        # label on the tensors' own device, without a round trip through the host
        img_pos_, img_neg_ = img_pos.bool(), torch.as_tensor(img_neg, device=img_pos.device).bool()
        label = label_connected_components
        lib = torch
        """,
    )

    def numpy_receiver(text: str, call: ast.Call) -> str:  # np.zeros_like(x) -> lib.zeros_like(x): any of the three
        if getattr(call.func.value, "id", None) != "np":  # type: ignore[attr-defined]
            raise EditError(f"{name}: zeros_like is no longer called on np")
        receiver_end = node_span(text, call.func.value)[1]  # type: ignore[attr-defined]
        return "lib" + text[receiver_end : node_span(text, call)[1]]

    return edit_calls(source, name, "zeros_like", numpy_receiver)


def _keep_components_on_device(source: str) -> str:
    """``keep_components_with_positive_points``: label a prediction off the CPU where it is."""
    name = "keep_components_with_positive_points"

    def calls(stmt: ast.stmt, attr: str) -> bool:
        return isinstance(stmt, ast.Assign) and any(
            isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == attr
            for n in ast.walk(stmt.value)
        )

    first = one_statement(source, name, lambda s: calls(s, "convert_data_type"), "the copy of the mask to numpy")
    last = find_statements(source, name, lambda s: calls(s, "from_numpy") and "features" in ast.unparse(s.targets))
    same_block = any(
        {first.lineno, last[0].lineno} <= {s.lineno for s in block} for block in _blocks(source, name) if len(last) == 1
    )
    if not same_block:
        raise EditError(f"{name}: the labelling no longer ends by moving the features back to the image's device")
    return wrap_in_else(
        source,
        first,
        last[0],
        'img_.device.type != "cpu"',
        """
        # label on the prediction's own device
        pos_mask = img_ > 0
        features = label_connected_components(img_, connectivity=3)
        """,
    )


def _blocks(source: str, qualname: str) -> list[list[ast.stmt]]:
    return [n.body for n in ast.walk(find_def(source, qualname)) if isinstance(getattr(n, "body", None), list)]


def transforms_device_labeller(source: str) -> str:
    source = extend_all(source, "label_connected_components")
    source = _keep_merge_on_device(source)
    source = _keep_components_on_device(source)
    return insert_after(source, "get_largest_connected_component_mask", _LABELLER)
