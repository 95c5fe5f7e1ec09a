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
"""Every name a run writes, in one room: label maps, per-class masks, summaries, part summaries, claims and the
temporary files of atomic writes; and the checks that a name can be written.

:class:`OutputLayout` answers each name of a run that writes into a folder; the functions below it answer the names
that do not depend on the folder (a claim's lock beside its output, a part's summary, the summary of a second
process given the same part, which of a folder's files are summaries). ``claims.py`` and ``summary_merge.py``
claim and merge by them.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from monai.apps.vista3d.config import OUTPUT_POSTFIX
from monai.apps.vista3d.errors import OutputPathError
from monai.apps.vista3d.labels import label_name

__all__ = [
    "OutputLayout",
    "output_path",
    "check_output",
    "check_output_folder",
    "MIN_FREE_BYTES",
    "check_name_lengths",
    "class_file_name",
    "class_mask_dir",
    "class_mask_paths",
    "summary_path_for",
    "temp_prefix",
    "temp_name",
    "TEMP_TOKEN_BYTES",
    "TEMP_SUFFIX",
    "lock_path",
    "part_summary_name",
    "own_summary_name",
    "summary_kind",
    "same_file",
    "extra_output_paths",
]

#: the suffix of the temporary file of an atomic write, ``.<name>.<random>.part``, renamed onto ``<name>`` when
#: complete (claims.py removes a crashed run's by this pattern)
TEMP_SUFFIX = ".part"


#: bytes of randomness in the temporary name of an atomic write (written as twice as many hex digits)
TEMP_TOKEN_BYTES = 4


def temp_prefix(name: str) -> str:
    """The start of the temporary name of an atomic write of ``name``: ``.<name>.`` (hidden, beside it)."""
    return f".{name}."


def temp_name(name: str, token: str) -> str:
    """The temporary name of an atomic write of ``name``: ``.<name>.<token>.part``."""
    return f"{temp_prefix(name)}{token}{TEMP_SUFFIX}"


def output_path(image: str | os.PathLike, output_dir: str | os.PathLike, postfix: str = OUTPUT_POSTFIX) -> pathlib.Path:
    """The bundle's output name: ``output_dir/<name>/<name>_<postfix>.nii.gz`` for ``<name>.nii[.gz]``, a DICOM series
    folder ``<name>``, ``<name>.zip`` or ``<name>.dcm``."""
    name = pathlib.Path(image).name
    for ext in (".nii.gz", ".nii", ".gz", ".zip", ".dcm", ".dicom"):
        if name.lower().endswith(ext):
            name = name[: -len(ext)]
            break
    return pathlib.Path(output_dir) / name / f"{name}_{postfix}.nii.gz"


def check_output(input_path: str | os.PathLike | None, path: str | os.PathLike, overwrite: bool = False) -> None:
    """Check, before any work, that a result can be written to ``path``; creates nothing.

    Raises:
        OutputPathError: ``path`` is the input file, exists (without ``overwrite``), or its folder cannot be
            created or written.
    """
    p = pathlib.Path(path)
    if not p.name.endswith((".nii", ".nii.gz")):
        raise OutputPathError(f"{p}: an output file name must end with .nii.gz or .nii, in lower case; e.g. "
                              "seg.nii.gz.")
    folder = _nearest_existing(p.parent)
    check_name_lengths(p, folder)
    if same_file(p, None if input_path is None else str(input_path)):
        raise OutputPathError(f"{p}: the output path is the input file; choose another output folder or name.")
    if p.exists() and not overwrite:
        raise OutputPathError(f"{p}: exists; pass overwrite=True to replace it.")
    if not folder.is_dir():
        raise OutputPathError(f"cannot create the output folder {p.parent}: {folder} is a file.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"the output folder {folder} is not writable; choose another one.")


def _nearest_existing(folder: pathlib.Path) -> pathlib.Path:
    """``folder`` if it exists, else its nearest parent that does (the one a write into ``folder`` starts from)."""
    while not os.path.exists(folder) and folder != folder.parent:  # (os.path: no error for too long a name)
        folder = folder.parent
    return folder


#: free bytes the file system of a run's output folder must have when the run starts (a label map of a 512^3 CT is
#: ~1-10 MB compressed; a disk this full fails the first save)
MIN_FREE_BYTES = 64 << 20


def check_output_folder(folder: str | os.PathLike) -> None:
    """Check, before any work, that a run can write into ``folder`` (created if missing); creates nothing.

    Raises:
        OutputPathError: a file stands where the folder or one of its parents should be, the nearest existing folder
            is not writable (a read-only folder or file system), or its file system is full.
    """
    p = pathlib.Path(folder)
    existing = _nearest_existing(p)
    check_name_lengths(p / "x", existing)
    if not existing.is_dir():
        raise OutputPathError(f"cannot create the output folder {p}: {existing} is a file; choose another output "
                              "folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"the output folder {existing} is not writable; choose another one.")
    try:
        free = shutil.disk_usage(existing).free
    except OSError:  # not every file system says
        return
    if free < MIN_FREE_BYTES:
        raise OutputPathError(f"the output folder {p} is on a full file system ({free / 2**20:.3g} MiB free); free "
                              "space or choose another folder.")


def check_name_lengths(p: pathlib.Path, existing: pathlib.Path | None = None) -> None:
    """Refuse names the file system will not take (the temporary name of an atomic write is longer still).

    Args:
        p: the file to be written (its missing folders are checked too).
        existing: the nearest existing folder above ``p`` (found when not given).

    Raises:
        OutputPathError: a name longer than the file system of ``existing`` takes.
    """
    if existing is None:
        existing = _nearest_existing(p.parent)
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not every platform or file system says
        return
    for part in p.relative_to(existing).parts if p.is_relative_to(existing) else (p.name,):
        # save_label_map writes ".<name>.<random>.part" first, then renames it
        longest = len(os.fsencode(part)) + (_TMP_EXTRA if part == p.name else 0)
        if longest > name_max:
            raise OutputPathError(
                f"{p}: the name {part[:24]}... is {len(os.fsencode(part))} bytes; this file system takes names of "
                f"at most {name_max - (_TMP_EXTRA if part == p.name else 0)} bytes for an output; choose a shorter "
                "name or folder."
            )


#: what the temporary name of an atomic write adds to the output's name
_TMP_EXTRA = len(temp_name("", "0" * 2 * TEMP_TOKEN_BYTES))




def extra_output_paths(label_map: str | os.PathLike, postfix: str = OUTPUT_POSTFIX) -> dict[str, pathlib.Path]:
    """The files an image may get beside its label map: ``statistics`` (JSON), ``preview`` (PNG) and ``seg`` (DICOM
    SEG).

    In the run's layout (``out/<name>/<name>_<postfix>.nii.gz``, the image's own folder) they are
    ``statistics.json``, ``preview.png`` and ``<name>_<postfix>.dcm``; beside a label map named otherwise
    (``-o seg.nii.gz``) ``seg.statistics.json``, ``seg.preview.png`` and ``seg.dcm``, so that other files in its
    folder are never touched.
    """
    p = pathlib.Path(label_map)
    stem = p.name[: -len(".nii.gz")] if p.name.endswith(".nii.gz") else p.name.rsplit(".", 1)[0]
    if p.name == f"{p.parent.name}_{postfix}.nii.gz":
        return {"statistics": p.with_name("statistics.json"), "preview": p.with_name("preview.png"),
                "seg": p.with_name(f"{stem}.dcm")}
    return {"statistics": p.with_name(f"{stem}.statistics.json"), "preview": p.with_name(f"{stem}.preview.png"),
            "seg": p.with_name(f"{stem}.dcm")}


def class_file_name(label_id: int) -> str:
    """File name of a class's mask: its name in the label list, spaces as underscores (``left_kidney.nii.gz``).

    Ids without a name get ``label_<id>.nii.gz``.
    """
    return f"{label_name(label_id).replace(' ', '_')}.nii.gz"


def class_mask_dir(image: str | os.PathLike, output_dir: str | os.PathLike) -> pathlib.Path:
    """The folder of an image's per-class masks, ``output_dir/<name>`` for ``<name>.nii[.gz]``.

    The folder of the label map of :func:`output_path`, so an image's results stay together.
    """
    return output_path(image, output_dir).parent


def class_mask_paths(folder: str | os.PathLike, label_ids: Any) -> dict[int, pathlib.Path]:
    """Label id -> ``folder/<class name>.nii.gz``, the files :func:`save_class_masks` writes into ``folder``.

    ``folder`` is :func:`class_mask_dir` of the image (the label map's folder). An image is done when every one of
    these files exists: the set is renamed into place only once all of them have been written.
    """
    folder = pathlib.Path(folder)
    return {int(i): folder / class_file_name(int(i)) for i in label_ids}


def same_file(a: pathlib.Path, b: str | None) -> bool:
    if not b:
        return False
    try:
        if a.resolve() == pathlib.Path(b).resolve():
            return True
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def summary_path_for(output_dir: str | os.PathLike | None, outputs: Sequence[pathlib.Path]) -> pathlib.Path:
    """Where a run's summary goes: ``output_dir/summary.json``; for one output file ``seg.nii.gz``, beside it
    as ``seg.summary.json`` (so that runs into one folder keep their own, and no ``summary.json`` of the user's
    is touched)."""
    if output_dir is not None:
        return pathlib.Path(output_dir) / "summary.json"
    first = pathlib.Path(outputs[0])
    stem = first.name[: -len(".nii.gz")] if first.name.endswith(".nii.gz") else first.stem
    return first.with_name(f"{stem}.summary.json")


@dataclass(frozen=True)
class OutputLayout:
    """The names of a run that writes into ``output_dir`` (the bundle's layout, ``<name>/<name>_<postfix>.nii.gz``).

    Example::

        layout = OutputLayout("out")
        layout.label_map("ct.nii.gz")  # out/ct/ct_trans.nii.gz
        layout.masks("ct.nii.gz", [1])  # {1: out/ct/liver.nii.gz}
    """

    output_dir: pathlib.Path
    postfix: str = OUTPUT_POSTFIX

    def label_map(self, image: str | os.PathLike) -> pathlib.Path:
        """The label map of ``image``."""
        return output_path(image, self.output_dir, self.postfix)

    def mask_dir(self, image: str | os.PathLike) -> pathlib.Path:
        """The folder of ``image``'s per-class masks: its label map's."""
        return self.label_map(image).parent

    def masks(self, image: str | os.PathLike, label_ids: Any) -> dict[int, pathlib.Path]:
        """Label id -> the mask file of that class for ``image``."""
        return class_mask_paths(self.mask_dir(image), label_ids)

    def summary(self) -> pathlib.Path:
        """The run's summary."""
        return summary_path_for(self.output_dir, [])

    @staticmethod
    def temp_glob(path: str | os.PathLike) -> str:
        """The pattern of the temporary files of atomic writes of ``path`` (in its folder)."""
        return f"{temp_prefix(pathlib.Path(path).name)}*{TEMP_SUFFIX}"


def lock_path(path: str | os.PathLike) -> pathlib.Path:
    """The lock file that claims ``path``: ``.<name>.lock`` in the same folder."""
    p = pathlib.Path(path)
    return p.with_name(f".{p.name}.lock")


def part_summary_name(part: Sequence[int]) -> str:
    """The summary file of part ``(i, N)``: ``summary.part-<i>-of-<N>.json`` (``part`` checked by its parser,
    :func:`~monai.apps.vista3d.batch.parts.check_part`)."""
    i, n = (int(v) for v in part)
    return f"summary.part-{i}-of-{n}.json"


def own_summary_name(path: str | os.PathLike) -> pathlib.Path:
    """The name a summary takes when ``path`` belongs to another live process (a second process given the same
    part, or two whole runs ending at once): ``.<host>-<pid>`` before ``.json``."""
    p = pathlib.Path(path)
    return p.with_name(f"{p.name[: -len('.json')]}.{socket.gethostname()}-{os.getpid()}.json")


# summary.part-<i>-of-<N>.json, or summary.part-<i>-of-<N>.<host>-<pid>.json from a second process given part i
_PART_SUMMARY = re.compile(r"^summary\.part-(\d+)-of-(\d+)(?:\.([^/]+))?\.json$")
# summary.<host>-<pid>.json: a whole run that finished while another whole run's summary.json was being written
_RUN_SUMMARY = re.compile(r"^summary\.(?!part-)[^/]+\.json$")


def summary_kind(name: str) -> tuple[int, int] | None | Literal[False]:
    """What the file ``name`` of an output folder is: ``(i, N)`` for a part's summary, ``None`` for a whole run's
    (``summary.json``, ``summary.<host>-<pid>.json``), ``False`` for anything else."""
    if m := _PART_SUMMARY.match(name):
        return int(m.group(1)), int(m.group(2))
    return None if name == "summary.json" or _RUN_SUMMARY.match(name) else False
