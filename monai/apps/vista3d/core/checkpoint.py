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
"""The VISTA3D network of the pipeline and its checkpoint: build ``vista3d132``, load a state dict strictly."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import warnings
from pathlib import Path

import torch

from monai.apps.vista3d.errors import CheckpointError

__all__ = ["build_network", "load_checkpoint", "network_from_checkpoint"]

_EXPECTED = (
    "expected a VISTA3D state dict, e.g. models/model.pt of the VISTA3D bundle from the MONAI model zoo "
    "(downloaded by you; this package downloads nothing)."
)


def _plain(e: BaseException) -> str:
    """The first sentence of an error, without terminal escapes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first.split('. ')[0]}".rstrip(": ")


def _is_nifti(head: bytes) -> bool:
    return (len(head) >= 348 and head[344:348] in (b"n+1\x00", b"ni1\x00")) or head[4:8] in (b"n+2\x00", b"ni2\x00")


def _not_a_checkpoint(path: Path) -> str | None:
    """What the file is when it plainly is no torch checkpoint (None when it may be one)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        return "is empty (0 bytes)"
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                inner = g.read(544)
        except (OSError, EOFError):
            inner = b""
        if _is_nifti(inner):
            return "is a NIfTI image (.nii.gz), not a checkpoint"
        return "is a gzip file, not a checkpoint"
    if _is_nifti(head):
        return "is a NIfTI image (.nii), not a checkpoint"
    if head.startswith(b"version https://git-lfs"):
        return "is a Git LFS pointer (a small text file), not the checkpoint itself; fetch it with git lfs pull"
    if head.lstrip().startswith((b"<!DOCTYPE", b"<html", b"<HTML")):
        return "is an HTML page (a download that saved a web page), not a checkpoint"
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return "is a text file, not a checkpoint"
    return None


def _holds_objects(e: pickle.UnpicklingError) -> bool:
    """Whether torch's safe loader refused a pickle for the Python objects in it (not for unreadable bytes)."""
    text = str(e)
    return "GLOBAL" in text or "global" in text


def _whole_width(sd: dict, first_conv: torch.Tensor) -> bool:
    """Whether every tensor of ``sd`` has its shape in a ``vista3d132`` of the first convolution's width.

    Only then is the checkpoint another width of the network; one wrongly shaped tensor is a damaged checkpoint.
    """
    from monai.networks.nets import vista3d132

    width = int(first_conv.shape[0])
    if width < 8 or width % 8:
        return False
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in vista3d132(encoder_embed_dim=width).state_dict().items()}
    return all(k in shapes and shapes[k] == v.shape for k, v in sd.items())


def build_network(network_kwargs: dict | None = None) -> torch.nn.Module:
    """``vista3d132(**network_kwargs)`` of this fork, in eval mode (random weights)."""
    from monai.networks.nets import vista3d132

    return vista3d132(**(network_kwargs or {})).eval()


def network_from_checkpoint(
    path: str | os.PathLike, network_kwargs: dict | None = None, device: torch.device | None = None
) -> torch.nn.Module:
    """``vista3d132(**network_kwargs)`` holding the weights of ``path``, in eval mode on ``device`` (None: the CPU).

    The network is built on the meta device and takes the checkpoint's tensors as they are read (memory-mapped
    where the file is torch's zip format), so no random initialisation is computed only to be overwritten: about
    a second of a fresh process for the published network. The weights are checked for NaN and Inf where they
    end up: on a GPU that pass costs milliseconds, on the CPU a pass over the file (0.1-0.5 s for the published
    network in a fresh process, beside the image's load).

    Raises:
        CheckpointError: as :func:`load_checkpoint`.
    """
    from monai.networks.nets import vista3d132

    with torch.device("meta"):
        network = vista3d132(**(network_kwargs or {}))
    _check_keys(network, _read_state_dict(Path(path)), Path(path), assign=True)
    left = [k for k, v in [*network.named_parameters(), *network.named_buffers()] if v.is_meta]
    if left:  # a tensor no state dict holds (none in vista3d132): it would have no values
        raise CheckpointError(f"checkpoint {str(path)!r} leaves {len(left)} tensors without values: {left[:3]}")
    if device is not None:
        network = network.to(device)
    _check_finite(network.state_dict(), Path(path))
    return network.eval()


def load_checkpoint(network: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Load a VISTA3D checkpoint strictly, saying which keys or shapes do not match.

    Accepts a plain state dict (the bundle's ``models/model.pt``) or one nested under ``"state_dict"``,
    ``"model"`` or ``"network"``; a ``"module."`` prefix (DataParallel) is dropped.

    Raises:
        CheckpointError: the file cannot be read, or its keys or shapes differ from the network's.
    """
    path = Path(path)
    sd = _read_state_dict(path)
    _check_finite(sd, path)
    _check_keys(network, sd, path, assign=False)
    return network


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of the checkpoint at ``path``, unwrapped and without a DataParallel prefix."""
    if path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is a folder; {_EXPECTED}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a file; {_EXPECTED}")
    what = _not_a_checkpoint(path)
    if what is not None:
        raise CheckpointError(f"checkpoint {str(path)!r} {what}; {_EXPECTED}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols
            with open(path, "rb") as f:
                zipped = f.read(4) == b"PK\x03\x04"
            # torch's zip format maps the file instead of copying it (the legacy format cannot be mapped)
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except pickle.UnpicklingError as e:
        if not _holds_objects(e):
            raise CheckpointError(
                f"checkpoint {str(path)!r} is not a torch checkpoint: neither torch's zip format nor a pickle of "
                f"tensors (random or damaged bytes); download it again; {_EXPECTED}"
            ) from None
        name = re.search(r"GLOBAL ([\w.]+)", str(e))
        held = f" ({name.group(1)})" if name else ""
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds pickled Python objects{held}, not only tensors: a whole network saved "
            f"with torch.save(model) or another program's pickle; save model.state_dict() instead; {_EXPECTED}"
        ) from None
    except Exception as e:  # any other unreadable file is reported the same way
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"  # torch's own format: a zip archive that no longer reads
        if zipped or isinstance(e, EOFError):
            raise CheckpointError(
                f"checkpoint {str(path)!r} is truncated or damaged ({_plain(e)}); download it again; {_EXPECTED}"
            ) from None
        raise CheckpointError(f"cannot read checkpoint {str(path)!r} ({_plain(e)}); {_EXPECTED}") from None
    for key in ("state_dict", "model", "network"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a {type(sd).__name__}, not a state dict of tensors; {_EXPECTED}"
        )
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module.") :]: v for k, v in sd.items()}
    return sd


def _check_finite(sd: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse weights that hold NaN or Inf: every label map they give is meaningless."""
    named = [(k, v) for k, v in sd.items() if v.is_floating_point() and v.numel()]
    if not named:
        return
    # a finite sum proves a tensor finite in one pass (0.09 s for the 218 M values of vista3d132 on one CPU core,
    # the elementwise test 1.2 s); all sums are read back at once (one device sync on a GPU), and the elementwise
    # test runs only where a sum is not finite (NaN, Inf, or an overflow of finite values)
    sums = torch.stack([v.sum(dtype=torch.float32) for _, v in named]).isfinite().tolist()
    bad = [k for (k, v), finite in zip(named, sums) if not finite and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" (+{len(bad) - 2} more)" if len(bad) > 2 else ""
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds NaN or Inf weights in {len(bad)} tensor(s): {', '.join(bad[:2])}{more}; "
            f"it is damaged or was saved after training diverged: use another checkpoint; {_EXPECTED}"
        )


def _check_keys(network: torch.nn.Module, sd: dict[str, torch.Tensor], path: Path, assign: bool) -> None:
    """Load ``sd`` into ``network`` strictly (``assign``: take its tensors, cast to the network's dtypes), or say
    which keys or shapes do not match."""
    own = network.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    shapes = [f"{k}: checkpoint {tuple(sd[k].shape)} vs network {tuple(own[k].shape)}"
              for k in own if k in sd and sd[k].shape != own[k].shape]

    def _few(items: list[str]) -> str:
        return ", ".join(items[:3]) + (f" (+{len(items) - 3} more)" if len(items) > 3 else "")

    width = "image_encoder.encoder.conv_init.weight"  # [encoder_embed_dim, 1, 3, 3, 3]
    if width in sd and width in own and sd[width].shape[0] != own[width].shape[0] and _whole_width(sd, sd[width]):
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a vista3d132 with encoder_embed_dim={sd[width].shape[0]}, the network "
            f"was built with {own[width].shape[0]}; set encoder_embed_dim={sd[width].shape[0]} (the published "
            "checkpoint uses 48)."
        )
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys: {_few(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_few(unexpected)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatches: {_few(shapes)}")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match the VISTA3D network: " + "; ".join(problems)
            + " (is it a vista3d132 checkpoint, e.g. the bundle's models/model.pt?)"
        )
    if assign:  # a float16 checkpoint still gives the float32 network load_state_dict's copy would
        sd = {k: v.to(own[k].dtype) for k, v in sd.items()}
    network.load_state_dict(sd, strict=True, assign=assign)
