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
"""Input discovery for a batch: which images (NIfTI files, DICOM series) a folder, a list file or a list of paths
names."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from monai.apps.vista3d.config import OUTPUT_POSTFIX
from monai.apps.vista3d.errors import OutputCollisionError, Vista3DInputError
from monai.apps.vista3d.io.dicom_files import is_series_folder
from monai.apps.vista3d.io.input_kind import NIFTI_SUFFIXES, input_kind, looks_like_label_map
from monai.apps.vista3d.io.nifti_write import is_vista3d_output
from monai.apps.vista3d.io.paths import output_path

__all__ = ["read_input_list", "collect_inputs", "plan_outputs"]


def _is_nifti(path: Path) -> bool:
    return path.name.lower().endswith(NIFTI_SUFFIXES)


def _find_nifti(folder: Path, skip: Callable[[Path], bool] | None = None) -> list[Path]:
    """The images under ``folder``, recursively, sorted: ``.nii`` / ``.nii.gz`` files, and DICOM series folders (a
    folder with DICOM files directly inside is one image); hidden entries are ignored.

    A broken symbolic link is listed too (it fails as its image, saying so). ``skip(path)`` leaves files and
    folders out (the outputs of an earlier run).
    """
    found = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or (skip is not None and skip(p)):
            continue
        if _is_nifti(p) and (p.is_file() or (p.is_symlink() and not p.exists())):
            found.append(p)
        elif p.is_dir() and is_series_folder(p):
            found.append(p)
    return sorted(found)


def _is_image(path: Path) -> bool:
    """Whether a file given directly is an image of any kind (NIfTI, DICOM, a zip of a series; NRRD and others too,
    which then fail as their image with what to do) rather than a list of images."""
    return input_kind(path) != "other"  # (a list of images is text: "other")


def _own_outputs(output_dir: str | os.PathLike | None, postfix: str) -> Callable[[Path], bool]:
    """What a folder search must leave out so that a run never reads the outputs of an earlier one.

    Every label map and mask this program wrote, in any folder, by the mark in its header
    (:func:`~monai.apps.vista3d.io.nifti.is_vista3d_output`); and under ``output_dir`` what it names as an output,
    ``<name>/<name>_<postfix>.nii.gz`` (the outputs of versions that did not mark them yet). An image named
    explicitly is never left out.
    """
    root = None if output_dir is None else Path(os.path.abspath(output_dir))

    def skip(p: Path) -> bool:
        full = Path(os.path.abspath(p))
        if root is not None and full.is_relative_to(root) and (full / f"{full.name}_{postfix}.dcm").is_file():
            return True  # an image's output folder holding its DICOM SEG, not a series
        if not _is_nifti(full):
            return False
        if root is not None and full.is_relative_to(root) and full.name == f"{full.parent.name}_{postfix}.nii.gz":
            return True
        return is_vista3d_output(full)

    return skip


def _collect(
    inputs: str | os.PathLike | Sequence[str | os.PathLike], skip: Callable[[Path], bool] | None = None
) -> list[tuple[Path, Path]]:
    """``(image, subfolder)`` pairs: an image found in a given folder keeps its path relative to that folder.

    A folder search also leaves out other tools' label maps (:func:`~.input_kind.looks_like_label_map`), with one
    warning that says how many and names the first.
    """
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    found: list[tuple[Path, Path]] = []
    label_maps: list[Path] = []
    for item in items:
        src = Path(item)
        if src.is_dir() and is_series_folder(src):
            found.append((src, Path()))  # a DICOM series given directly: one image, named after its folder
        elif src.is_dir():
            for p in _find_nifti(src, skip):
                if _is_nifti(p) and looks_like_label_map(p):
                    label_maps.append(p)
                else:
                    found.append((p, p.parent.relative_to(src)))
        elif src.is_file() and not _is_image(src) and isinstance(inputs, (str, os.PathLike)):
            found += [(p, Path()) for p in read_input_list(src)]
        else:
            found.append((src, Path()))
    if label_maps:
        warnings.warn(
            f"left out {len(label_maps)} label map(s) found in the input folders, e.g. {label_maps[0]} (a label "
            "intent, or a first slice of at most 32 whole values, the smallest 0); name a file to segment it anyway",
            stacklevel=3)
    return found


def read_input_list(path: str | os.PathLike) -> list[Path]:
    """The paths of a text file, one per line (``#`` starts a comment line); relative ones are taken from the
    file's folder."""
    src = Path(path)
    try:
        lines = [ln.strip() for ln in src.read_text().splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise Vista3DInputError(f"{src}: cannot read it as a list of image paths ({e}); give a text file.") from None
    return [Path(ln) if Path(ln).is_absolute() else src.parent / ln for ln in lines if ln and not ln.startswith("#")]


def collect_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Image paths from a list of paths and folders, a text file (one path per line, ``#`` comments), or a folder.

    A folder is searched recursively for ``.nii`` and ``.nii.gz`` files and DICOM series folders (hidden files and
    folders, the label maps and masks this program wrote, and other tools' label maps, with a warning, are skipped);
    a folder that holds DICOM files itself is one image.
    """
    return [p for p, _ in _collect(inputs, _own_outputs(None, ""))]


def plan_outputs(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    postfix: str = OUTPUT_POSTFIX,
) -> list[tuple[Path, Path]]:
    """``(image, output)`` for every input, each output unique; checked before any work starts.

    An image given directly goes to ``output_dir/<name>/<name>_<postfix>.nii.gz`` (the bundle's naming); an
    image found in a given folder keeps its subfolder under ``output_dir`` (``cts/p1/ct.nii.gz`` ->
    ``output_dir/p1/ct/ct_<postfix>.nii.gz``), so patient folders that all hold ``ct.nii.gz`` stay apart. The
    same file given twice is segmented once. A folder search leaves out the outputs of an earlier run under
    ``output_dir`` (an output folder inside, or equal to, the input folder is never read back as input).

    Raises:
        OutputCollisionError: two different images would be written to the same output.
    """
    plan: list[tuple[Path, Path]] = []
    seen: dict[Path, Path] = {}
    for path, sub in _collect(inputs, _own_outputs(output_dir, postfix)):
        out = output_path(path, Path(output_dir) / sub, postfix)
        key = Path(os.path.abspath(out))
        if key in seen:
            if _same_input(seen[key], path):
                continue
            raise OutputCollisionError(
                f"{seen[key]} and {path} would both be written to {out}; nothing was started. Give their common "
                "folder as the input instead (its subfolders are kept under the output folder), or rename one."
            )
        seen[key] = path
        plan.append((path, out))
    return plan


def _same_input(a: Path, b: Path) -> bool:
    try:
        return os.path.abspath(a) == os.path.abspath(b) or os.path.samefile(a, b)
    except OSError:
        return False
