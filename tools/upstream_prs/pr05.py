"""PR 05: ``monai.apps.vista3d.inferer.sliding_window_label_inference``, a label map without the all-class logits.

The function below is this repository's own code, written for MONAI 1.6.1's VISTA3D app module: it reuses 1.6.1's
window plan (``dense_patch_slices`` with ``_get_scan_interval``) and importance map, so its labels equal
``VistaPostTransformd`` applied to ``sliding_window_inference``'s logits, bit for bit. ``label_inference_edit``
puts it after ``point_based_window_inferer``, names it in ``__all__`` and adds the imports it needs.
"""

from __future__ import annotations

from tools.upstream_prs.edits import add_from_import, add_import, extend_all, insert_after

VISTA3D_INFERER = "monai/apps/vista3d/inferer.py"

_LABEL_INFERENCE = '''
def sliding_window_label_inference(
    inputs: torch.Tensor | MetaTensor,
    roi_size: Sequence[int] | int,
    sw_batch_size: int,
    predictor: Callable[..., torch.Tensor],
    overlap: Sequence[float] | float = 0.25,
    mode: BlendMode | str = BlendMode.CONSTANT,
    sigma_scale: Sequence[float] | float = 0.125,
    padding_mode: PytorchPadMode | str = PytorchPadMode.CONSTANT,
    cval: float = 0.0,
    sw_device: torch.device | str | None = None,
    device: torch.device | str | None = None,
    label_prompt: Sequence[int] | torch.Tensor | None = None,
    with_coord: bool = False,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """
    Sliding-window inference straight to a VISTA3D label map, without holding the full-size logits of every class.

    ``sliding_window_inference`` followed by ``VistaPostTransformd`` keeps ``C`` full-size float channels (for the
    117 classes of a 512^3 CT, 63 GB in float32) only to reduce them to one label per voxel. Here the padded volume
    is cut into tiles at every window border. A tile adds up its windows' weighted logits and, as soon as its last
    window is in, is normalised, turned into labels and freed. The windows run in ``sliding_window_inference``'s
    order, which completes the volume slab by slab along the first spatial dimension, so that only the tiles of
    about one window's depth are held (on ``sw_device``) at any time.

    The labels equal ``VistaPostTransformd`` applied to the logits of ``sliding_window_inference`` called with the
    same arguments, on every voxel: each voxel's weighted window logits are added in the same order and dtype
    (that of ``inputs``) and divided by the same weight sum.

    Args:
        inputs: input image, ``[N, C_in, *spatial]`` with 2 or 3 spatial dimensions.
        roi_size: the spatial window size, as in ``sliding_window_inference``.
        sw_batch_size: the number of windows per ``predictor`` call.
        predictor: called as ``predictor(windows, *args, **kwargs)`` (with ``with_coord``,
            ``predictor(windows, window_slices, *args, **kwargs)``); returns ``[n, C, *roi_size]`` logits for
            ``n`` windows, e.g. ``functools.partial(vista3d, class_vector=...)``.
        overlap: amount of overlap between windows along each spatial dimension, in ``[0, 1)``.
        mode: ``"constant"`` or ``"gaussian"`` blending of overlapping windows.
        sigma_scale: the standard deviation coefficient of the Gaussian window, as in ``sliding_window_inference``.
        padding_mode: padding mode of ``inputs`` where ``roi_size`` is larger than them.
        cval: fill value of ``"constant"`` padding.
        sw_device: device of the windows and of the held tiles; defaults to the device of ``inputs``.
        device: device of the returned label map; defaults to the device of ``inputs``.
        label_prompt: the label id of each output channel (``VistaPostTransformd``'s ``label_prompt``);
            None numbers the channels ``1..C``.
        with_coord: whether to pass the window slices to ``predictor``.
        args: optional positional arguments of ``predictor``.
        kwargs: optional keyword arguments of ``predictor``; a ``condition`` tensor is windowed like ``inputs``.

    Returns:
        ``[N, 1, *spatial]`` labels on ``device``: 0 where no channel's logit is positive, else the label id of the
        channel with the highest logit; ``torch.uint8`` where every label id is in ``[0, 255]``, else
        ``torch.int32``. A ``MetaTensor`` input gives a ``MetaTensor`` with its metadata.

    Raises:
        ValueError: when ``roi_size`` or ``overlap`` do not fit ``inputs``, when ``predictor`` does not return one
            ``[n, C, *roi_size]`` tensor, or when ``label_prompt`` does not have ``C`` entries.
    """
    num_spatial_dims = len(inputs.shape) - 2
    if isinstance(roi_size, Sequence) and len(roi_size) != num_spatial_dims:
        raise ValueError(
            f"roi_size {roi_size} has {len(roi_size)} dimensions, inputs of shape {tuple(inputs.shape)} have "
            f"{num_spatial_dims} spatial ones."
        )
    overlap = ensure_tuple_rep(overlap, num_spatial_dims)
    if any(o < 0 or o >= 1 for o in overlap):
        raise ValueError(f"overlap must be >= 0 and < 1, got {overlap}.")
    meta = inputs if isinstance(inputs, MetaTensor) else None
    image = inputs.as_tensor() if isinstance(inputs, MetaTensor) else inputs
    batch_size, _, *image_size_ = image.shape
    compute_dtype = image.dtype
    sw_device = sw_device or image.device
    device = device or image.device
    condition = kwargs.pop("condition", None)
    roi_size = fall_back_tuple(roi_size, image_size_)
    image_size = tuple(max(s, r) for s, r in zip(image_size_, roi_size))
    pad_before = [(r - s) // 2 if r > s else 0 for s, r in zip(image_size_, roi_size)]
    pad_size: list[int] = []  # torch.nn.functional.pad's order: the last dimension first
    for d in reversed(range(num_spatial_dims)):
        pad_size += [pad_before[d], image_size[d] - image_size_[d] - pad_before[d]]
    if any(pad_size):
        pad_mode = look_up_option(padding_mode, PytorchPadMode)
        image = torch.nn.functional.pad(image, pad=pad_size, mode=pad_mode, value=cval)
        if condition is not None:
            condition = torch.nn.functional.pad(condition, pad=pad_size, mode=pad_mode, value=cval)

    # the window plan and weights of sliding_window_inference, so that every sum is the same
    scan_interval = _get_scan_interval(image_size, roi_size, num_spatial_dims, overlap)
    slices = dense_patch_slices(image_size, roi_size, scan_interval)
    weight = compute_importance_map(roi_size, mode=mode, sigma_scale=sigma_scale, device=sw_device, dtype=compute_dtype)
    weight = weight.to(device=sw_device, dtype=compute_dtype).reshape(1, *roi_size)
    bounds, window_tiles, last_window = _window_tiles(slices, image_size)

    num_win = len(slices)
    labels: torch.Tensor | None = None
    ids = None if label_prompt is None else torch.as_tensor(label_prompt).reshape(-1)
    sums: dict[tuple[int, ...], torch.Tensor] = {}
    counts: dict[tuple[int, ...], torch.Tensor] = {}
    for start in range(0, num_win * batch_size, sw_batch_size):
        batch = range(start, min(start + sw_batch_size, num_win * batch_size))
        window_slices = [[slice(i // num_win, i // num_win + 1), slice(None), *slices[i % num_win]] for i in batch]
        windows = torch.cat([image[tuple(s)] for s in window_slices]).to(sw_device)
        if condition is not None:
            kwargs["condition"] = torch.cat([condition[tuple(s)] for s in window_slices]).to(sw_device)
        if with_coord:
            logits = predictor(windows, window_slices, *args, **kwargs)
        else:
            logits = predictor(windows, *args, **kwargs)
        if not isinstance(logits, torch.Tensor) or logits.shape[0] != len(batch) or logits.shape[2:] != roi_size:
            raise ValueError(
                f"predictor must return one [n, C, *roi_size] tensor for n windows of size {roi_size}, got "
                f"{tuple(getattr(logits, 'shape', ())) or type(logits).__name__} for {len(batch)} windows; "
                "use sliding_window_inference for other outputs."
            )
        if labels is None:
            ids = torch.arange(1, logits.shape[1] + 1) if ids is None else ids
            if ids.numel() != logits.shape[1]:
                raise ValueError(f"label_prompt has {ids.numel()} entries for {logits.shape[1]} logit channels.")
            dtype = torch.uint8 if ids.numel() == 0 or (ids.min() >= 0 and ids.max() <= 255) else torch.int32
            labels = torch.zeros((batch_size, 1, *image_size_), dtype=dtype, device=device)
            ids = ids.to(device=sw_device, dtype=torch.int64)
        logits *= weight  # in place, as sliding_window_inference weighs them: the same rounding in any dtype
        for j, i in enumerate(batch):
            b, w = divmod(i, num_win)
            for t in window_tiles[w]:
                box = [(bounds[d][k], bounds[d][k + 1]) for d, k in enumerate(t)]
                local = tuple(slice(lo - s.start, hi - s.start) for (lo, hi), s in zip(box, slices[w]))
                if t not in sums:
                    size = [hi - lo for lo, hi in box]
                    sums[t] = torch.zeros((logits.shape[1], *size), dtype=compute_dtype, device=sw_device)
                    counts[t] = torch.zeros((1, *size), dtype=compute_dtype, device=sw_device)
                sums[t] += logits[(j, slice(None), *local)]
                counts[t] += weight[(slice(None), *local)]
                if last_window[t] != w:
                    continue
                # the tile has all its windows: the labels of its part of the unpadded image, then free it
                tile = sums.pop(t) / counts.pop(t)
                src = [
                    slice(max(p, lo) - lo, min(p + n, hi) - lo) for (lo, hi), p, n in zip(box, pad_before, image_size_)
                ]
                if any(s.start >= s.stop for s in src):
                    continue  # the tile is all padding
                dst = [slice(lo + s.start - p, lo + s.stop - p) for (lo, _), s, p in zip(box, src, pad_before)]
                best, channel = tile[(slice(None), *src)].max(dim=0)  # the first channel among equal maxima
                tile_labels = torch.where(best > 0, ids[channel], 0)
                labels[(b, 0, *dst)] = tile_labels.to(device=device, dtype=labels.dtype)
    if meta is not None:
        return MetaTensor(labels, meta=copy.deepcopy(meta.meta))  # the input's affine and metadata
    return labels  # type: ignore[return-value]


def _window_tiles(
    slices: Sequence[Sequence[slice]], image_size: Sequence[int]
) -> tuple[list[list[int]], list[list[tuple[int, ...]]], dict[tuple[int, ...], int]]:
    """
    Cut the padded image at every window border into tiles.

    Returns:
        the cuts along each dimension, the tiles (indices between cuts) each window covers, and for each tile the
        last window covering it in the order of ``slices``.
    """
    bounds: list[list[int]] = []
    for d, size in enumerate(image_size):
        bounds.append(sorted({0, size, *(s[d].start for s in slices), *(s[d].stop for s in slices)}))
    window_tiles: list[list[tuple[int, ...]]] = []
    last_window: dict[tuple[int, ...], int] = {}
    for w, window in enumerate(slices):
        ranges = [range(bounds[d].index(s.start), bounds[d].index(s.stop)) for d, s in enumerate(window)]
        window_tiles.append(list(itertools.product(*ranges)))
        for t in window_tiles[-1]:
            last_window[t] = w
    return bounds, window_tiles, last_window
'''


def label_inference_edit(source: str) -> str:
    source = add_import(source, "itertools")
    source = add_from_import(source, "collections.abc", ["Callable", "Sequence"])
    source = add_from_import(source, "monai.data.utils", ["compute_importance_map", "dense_patch_slices"])
    source = add_from_import(source, "monai.inferers.utils", ["_get_scan_interval"])
    source = add_from_import(
        source, "monai.utils", ["BlendMode", "PytorchPadMode", "ensure_tuple_rep", "fall_back_tuple", "look_up_option"]
    )
    source = extend_all(source, "sliding_window_label_inference")
    return insert_after(source, "point_based_window_inferer", _LABEL_INFERENCE)
