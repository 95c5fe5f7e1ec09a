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
"""The batch's summary: the result schema, the JSON written atomically, and the summary file's name."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monai.apps.vista3d.core.feasibility import os_message
from monai.apps.vista3d.errors import OutputPathError, Vista3DOutputError
from monai.apps.vista3d.io.paths import TEMP_SUFFIX, check_name_lengths, temp_prefix

from .claims import claim_summary
from .image_record import ImageRecord
from .summary_merge import done_now, keep_earlier_done

__all__ = [
    "SUMMARY_MARK",
    "check_summary_path",
    "BatchResult",
    "counting_reporter",
    "print_record",
    "remove_empty",
    "stopped_records",
    "write_summary",
]


def remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed save created, deepest first, as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


#: the key that marks a JSON summary as this program's (another file of that name is never replaced)
SUMMARY_MARK = ("written_by", "monai.apps.vista3d")


def check_summary_path(path: str | os.PathLike) -> None:
    """Refuse, before any work, a summary path that holds a file this program did not write.

    Raises:
        OutputPathError: the file exists and is not a summary written by ``run_batch``.
    """
    p = Path(path)
    check_name_lengths(p)
    if not os.path.lexists(p):
        return
    try:
        ours = json.loads(p.read_text()).get(SUMMARY_MARK[0]) == SUMMARY_MARK[1]
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise OutputPathError(
            f"{p}: exists and is not a summary written by vista3d, so it is not replaced; move it, or choose "
            "another output folder."
        )


def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` atomically (a temporary file renamed); on failure nothing is left and one line says why."""
    tmp = path.with_name(f"{temp_prefix(path.name)}{os.getpid()}{TEMP_SUFFIX}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise Vista3DOutputError(
            f"{path}: the summary could not be written ({os_message(e)}); the label maps written are kept."
        ) from None


def counting_reporter(report: Callable[[dict[str, Any]], None] | None, n: int) -> Callable[[ImageRecord], None] | None:
    """``report`` called with each record's entry (a dict) that also carries ``progress``: ``(k, n)``."""
    if report is None:
        return None
    count = [0]

    def counted(rec: ImageRecord) -> None:
        count[0] += 1
        report(dict(rec.as_dict(), progress=(count[0], n)))

    return counted


def print_record(rec: dict[str, Any]) -> None:
    extra = f": {rec['error']}" if rec["error"] else ""
    print(f"[rank {rec['rank']}] {rec['status']} {rec['image']}{extra}", flush=True)


@dataclass
class BatchResult:
    """What :func:`run_batch` did, over every rank.

    Attributes:
        records: one dict per image, in input order: ``image``, ``output``, ``status`` ("done", "skipped",
            "failed", or "busy": claimed by another process, which writes it), ``error`` (one line, or None),
            ``seconds``, ``windows``, ``rank``, ``voxels``, per-stage ``stages`` of the images that ran.
        world_size: processes that shared the work.
        host: the machine of rank 0.
        wall_seconds: the run's wall clock on this rank, from the plan to the last save.
        summary_path: the JSON summary rank 0 wrote (None on the other ranks).
        interrupted: the run was stopped (Ctrl-C, SIGTERM, an error); images it did not finish are
            "interrupted", and under ``torchrun`` the other ranks' images are "unknown".
        part: ``(i, N)`` of a run of one part, else None.
        inputs: images of the whole batch (of every part).
        started: ``time.time()`` when the run began.
        settings: how the outputs were made (see :class:`~monai.apps.vista3d.batch.provenance.Provenance`): the
            resolved job, the weights' size and SHA-256, the versions of this package and torch.
    """

    records: list[dict[str, Any]]
    world_size: int = 1
    host: str = ""
    wall_seconds: float = 0.0
    summary_path: Path | None = None
    interrupted: bool = False
    part: tuple[int, int] | None = None
    inputs: int = 0
    started: float = 0.0
    settings: dict[str, Any] | None = None

    def count(self, status: str) -> int:
        """Images whose status is ``status``."""
        return sum(r["status"] == status for r in self.records)

    @property
    def done(self) -> int:
        return self.count("done")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def volumes_per_minute(self) -> float | None:
        """Images this run segmented per minute of its wall clock (skipped ones, and those a rerun keeps as an earlier
        run's, took none of it)."""
        return round(60.0 * done_now(self.records) / self.wall_seconds, 3) if self.wall_seconds > 0 else None

    @property
    def exit_code(self) -> int:
        """The command line's status: 0 when no image failed, else 1."""
        return 1 if self.failed else 0

    def summary(self) -> dict[str, Any]:
        """The JSON summary (what ``summary.json`` holds)."""
        return {
            SUMMARY_MARK[0]: SUMMARY_MARK[1],
            "interrupted": self.interrupted,
            "images": len(self.records),
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "world_size": self.world_size,
            "host": self.host,
            "wall_seconds": round(self.wall_seconds, 3),
            "volumes_per_minute": self.volumes_per_minute,
            "busy": self.count("busy"),
            "part": list(self.part) if self.part else None,
            "inputs": self.inputs,
            "started": round(self.started, 3),
            "finished": round(self.started + self.wall_seconds, 3),
            "settings": self.settings,
            "per_image": self.records,
        }


def write_summary(path: Path, result: BatchResult) -> Path:
    """Write ``result``'s summary (rank 0); returns the file written. It goes to another name when another process
    (of the same part, or another whole run) wrote ``path`` since this run began (see
    :func:`~.claims.claim_summary`); images done by the run whose summary it replaces stay done."""
    try:
        path, held = claim_summary(path, result.started)  # whole runs too: two at once keep both summaries
    except OSError as e:  # its folder cannot be created or written (a full disk)
        raise Vista3DOutputError(
            f"{path}: the summary could not be written ({os_message(e)}); the label maps written are kept."
        ) from None
    try:
        _write_json(path, dataclasses.replace(result, records=keep_earlier_done(path, result.records)).summary())
    finally:
        if held is not None:
            held.release()
    return path


def stopped_records(
    records: dict[int, ImageRecord], paths: list[Path], outs: list[Path], sizes: list[int], pool: list[int]
) -> list[dict]:
    """The entry of every image of the run's part (``pool``) when the run was stopped: this rank's as far as they
    got, the others' unknown."""
    every = []
    for i in sorted(pool):
        rec = records.get(i)
        if rec is None:
            rec = ImageRecord.new(i, paths[i], outs[i], None, sizes[i])
            rec.status, rec.error = "unknown", "on another rank, which was stopped too"
        elif rec.status is None:
            rec = dataclasses.replace(rec, status="interrupted",
                                      error="the run was stopped before this image was finished")
        every.append(rec.as_dict())
    return every
