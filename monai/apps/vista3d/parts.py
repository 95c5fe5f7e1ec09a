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
"""Independent parts of one batch, for a cluster: the split, the output claims and the merged summary.

A batch of ``n`` images is cut into ``N`` parts numbered from 0 (as nnU-Net's ``-part_id`` and SLURM's
``SLURM_ARRAY_TASK_ID``). Every process computes the same split from the inputs alone (:func:`split_parts`:
sorted by a stable key such as the output path relative to the output folder, balanced by voxel count), so N
processes started anywhere, at any time, need no communication. Parts may share an output folder:

- each output is *claimed* before its image is read (:func:`claim`, :class:`OutputClaims`): a POSIX record lock
  (``fcntl.lockf``) on a hidden ``.<output name>.lock`` beside it, which the operating system drops when its
  process ends, so a killed part never blocks its rerun; an output claimed by another live process is reported
  ``busy``, not redone, and one written meanwhile is skipped;
- each part writes its own summary (:func:`~.layout.part_summary_name`); a second process given the same part by mistake
  writes another file (:func:`claim_summary`), so neither summary replaces the other;
- :func:`merge_summaries` and :func:`format_summary` make one table of all the parts' summaries.

The locks need a file system whose locks every machine sees (local disks; NFSv4 or NFSv3 with ``lockd``; Lustre
mounted with ``flock``; GPFS), and "written since this run started" compares file times with this machine's
clock, so the machines' clocks should agree (NTP).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import operator
import os
import re
import socket
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .layout import OutputLayout, lock_path, own_summary_name, summary_kind

__all__ = [
    "Claim",
    "OutputClaims",
    "OutputTaken",
    "claim",
    "claim_owner",
    "claim_summary",
    "format_summary",
    "keep_earlier_done",
    "merge_summaries",
    "missing_folders",
    "parse_part",
    "check_part",
    "part_keys",
    "split_parts",
]

# the status of an image in merged summaries: the first of these that any summary reports for its output
_PRECEDENCE = ("done", "skipped", "failed", "busy")


def check_part(part: Sequence[int]) -> tuple[int, int]:
    """``(i, n)`` checked: ``n >= 1`` parts numbered ``0 .. n-1``.

    Raises:
        ValueError: ``i`` or ``n`` out of range, or not two integers.
    """
    try:
        i, n = (operator.index(v) for v in part)  # integers only: 1.5 is not a part number
    except (TypeError, ValueError):
        raise ValueError(f"part must be (i, N), two integers, got {part!r}") from None
    if n < 1:
        raise ValueError(f"part {i}/{n} does not exist: N must be 1 or more")
    if not 0 <= i < n:
        raise ValueError(f"part {i}/{n} does not exist: parts are numbered from 0, so I must be in 0..{n - 1}")
    return i, n


def parse_part(text: str) -> tuple[int, int]:
    """``"i/N"`` as ``(i, N)``: part ``i`` of ``N``, numbered from 0 (``"0/4"`` .. ``"3/4"``).

    Raises:
        ValueError: not of the form ``i/N``, or ``i`` not in ``0..N-1``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if m is None:
        raise ValueError(f"part must be I/N, e.g. 0/4 (the first of 4 parts, numbered from 0), got {text!r}")
    return check_part((int(m.group(1)), int(m.group(2))))


def split_parts(keys: Sequence[str], sizes: Sequence[int], n: int) -> list[list[int]]:
    """Split items into ``n`` parts balanced by size, the same whatever the order of the items.

    The items are ordered by ``keys`` (unique strings, e.g. output paths relative to the output folder), then
    the largest goes onto the least-loaded part (ties by key, then by part), as ranks are sharded.

    Args:
        keys: one unique key per item; only their order matters.
        sizes: one size per item (voxels); 0 counts as 1.
        n: number of parts (>= 1).

    Returns:
        Per part, the indices into ``keys`` of its items, in increasing order.
    """
    # imported here, not at the top: the claim tests load this file alone, without the package
    from .distributed import shard_by_size  # the rank balance of one machine

    if len(keys) != len(sizes):
        raise ValueError(f"{len(keys)} keys for {len(sizes)} sizes")
    if len(set(keys)) != len(keys):
        raise ValueError("the keys of a split must be unique")
    check_part((0, n))
    order = sorted(range(len(keys)), key=lambda j: keys[j])
    return [sorted(order[k] for k in shard) for shard in shard_by_size([sizes[j] for j in order], n)]


def part_keys(outputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike | None = None) -> list[str]:
    """The split's keys of ``outputs``: each one's path relative to ``output_dir`` (its absolute path when it is
    not under it), so that processes that see the shared folder under different mount points agree."""
    keys = []
    for out in outputs:
        p = Path(os.path.abspath(out))
        try:
            keys.append(p.relative_to(os.path.abspath(output_dir)).as_posix() if output_dir is not None else str(p))
        except ValueError:
            keys.append(str(p))
    return keys


def _owner() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class Claim:
    """A held claim on one output path (see :func:`claim`); :meth:`release` (or the end of a ``with``) drops it.

    Attributes:
        path: the claimed path.
        lock: its lock file.
    """

    def __init__(self, path: Path, lock: Path, fd: int, created: list[Path]) -> None:
        self.path, self.lock, self._fd, self._created = path, lock, fd, created

    @property
    def held(self) -> bool:
        """Whether this claim is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file, drop the lock, and remove the folders the claim created if they are empty."""
        if self._fd is None:
            return
        try:
            os.unlink(self.lock)  # before unlocking: a process waiting on this file then sees it is stale
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing the file drops the lock
        self._fd = None
        for folder in self._created:  # deepest first; stops at the first folder that holds something
            try:
                folder.rmdir()
            except OSError:
                break

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            try:
                self.release()
            except Exception:  # at interpreter exit; the lock goes with the process anyway
                pass


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first (what writing into it would create)."""
    folder = Path(folder)
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def claim(path: str | os.PathLike, attempts: int = 5) -> Claim | None:
    """Claim ``path`` for this process, without waiting: the claim, or ``None`` when another process holds it.

    The claim is an exclusive ``fcntl.lockf`` lock on ``.<name>.lock`` beside ``path`` (missing folders are
    created), which the operating system drops when the process ends, however it ends; the lock file of a killed
    process stays on disk but does not block. The lock file holds the owner's pid and host, for messages. A
    process must claim a path at most once at a time (POSIX locks are per process).

    Raises:
        OSError: the lock file cannot be created or the file system does not support locks.
    """
    p = Path(path)
    lock = lock_path(p)
    created = missing_folders(p.parent)
    for _ in range(max(1, attempts)):
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its folder was removed by a claim released meanwhile
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.write(fd, f"{_owner()}\n".encode())
            return Claim(p, lock, fd, created)
        os.close(fd)  # the lock file was released and removed after this process opened it: open the new one
    return None


def claim_owner(path: str | os.PathLike) -> str:
    """Who claimed ``path`` (``"pid P on HOST"``) as its lock file says, or ``""``."""
    try:
        return lock_path(path).read_text().strip()
    except OSError:
        return ""


def claim_summary(path: str | os.PathLike, started: float) -> tuple[Path, Claim | None]:
    """The summary file a part writes now, claimed: ``path``, or another name when ``path`` is another process's.

    ``path`` is another process's when that process holds its claim (it is writing it) or wrote it at or after
    ``started`` (the ``time.time()`` at which this run began: a second process given the same part). The other
    name puts ``.<host>-<pid>`` before ``.json``, so that neither summary replaces the other; a summary of an
    earlier run is replaced. Release the claim once the file is written.
    """
    p = Path(path)
    held = claim(p)
    if held is not None:
        try:
            mine = p.stat().st_mtime < started
        except FileNotFoundError:
            mine = True
        if mine:
            return p, held
        held.release()
    other = own_summary_name(p)
    return other, claim(other)


class OutputTaken(Exception):
    """An output that this process will not write: another live process claimed it (``status`` "busy"), or it
    was written since the run was planned (``status`` "skipped")."""

    def __init__(self, status: str, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.status, self.owner = status, owner


# errors of a file system without locks (some FUSE mounts): outputs are then written unclaimed, with a warning
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _remove_stale(output: Path) -> None:
    """Remove the temporary files of a killed writer of ``output``; call it holding the claim (so no live process
    is writing them)."""
    for stale in output.parent.glob(OutputLayout.temp_glob(glob.escape(str(output)))):
        stale.unlink(missing_ok=True)


class OutputClaims:
    """One process's claims on the outputs it writes: taken before an image is read, released once its file is
    written (or it failed). Taking a claim removes the temporary files a killed writer of that output left.

    An output written since the run was planned is skipped once claimed: it exists and did not at the plan, or
    its file time is at or after ``started`` (an output that the plan redoes, with ``overwrite`` or for a missing
    class mask, is written over only if older).

    Args:
        started: when the run was planned (``time.time()``).
    """

    def __init__(self, started: float = 0.0) -> None:
        self.started = started
        self._held: dict[Path, Claim | None] = {}
        self._lock = threading.Lock()
        self.warned = False

    def take(self, output: Path, existed: bool = False) -> None:
        """Claim ``output`` (which ``existed`` when the run was planned, or not).

        Raises:
            OutputTaken: ``"busy"``: another live process holds it; ``"skipped"``: written since the plan.
        """
        try:
            held = claim(output)
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
            if not self.warned:
                self.warned = True
                warnings.warn(f"{output.parent}: the file system does not support locks ({e.strerror}); outputs "
                              "are written without claims, so two processes may segment one image", stacklevel=2)
            held = None
        else:
            if held is None:
                owner = claim_owner(output)
                raise OutputTaken("busy", f"claimed by another process ({owner or 'owner unknown'})", owner)
        with self._lock:
            self._held[output] = held
        if held is not None:
            _remove_stale(output)
        try:
            written = output.stat().st_mtime
        except FileNotFoundError:
            return
        if not existed or written >= self.started:
            self.release(output)
            raise OutputTaken("skipped", "written by another process since this run started")

    def sweep(self, output: Path) -> None:
        """Remove what a killed writer left beside the finished ``output`` (its lock file, temporary files),
        unless a live process holds its claim. Cheap when there is no lock file."""
        if not lock_path(output).exists():
            return
        try:
            held = claim(output)
        except OSError:
            return
        if held is not None:
            _remove_stale(output)
            held.release()

    def release(self, output: Path) -> None:
        """Drop the claim on ``output`` (and its lock file), if this process holds it."""
        with self._lock:
            held = self._held.pop(output, None)
        if held is not None:
            held.release()

    def release_all(self) -> None:
        """Drop every claim still held (at the end of a run, however it ends), the last taken first: a folder
        that an earlier claim created is then empty again when that claim removes it."""
        for output in reversed(list(self._held)):
            self.release(output)

    def claiming(self, load: Callable[..., Any], outputs: Sequence[Path]) -> Callable[..., Any]:
        """``load`` that first claims the next of ``outputs``: the i-th call is for the i-th output. Call it at the
        plan: the outputs that exist now are those the plan redoes."""
        upcoming = iter([(out, out.exists()) for out in outputs])

        def claimed_load(*args: Any, **kwargs: Any) -> Any:
            self.take(*next(upcoming))
            return load(*args, **kwargs)

        return claimed_load


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def merge_summaries(folder: str | os.PathLike, check_disk: bool = True) -> dict[str, Any]:
    """Merge the summaries in ``folder`` (``summary.json``, every ``summary.part-*-of-*.json`` and the
    ``summary.<host>-<pid>.json`` of runs that finished at once) into one, checked against the disk.

    An image (its output) counts once, with the first of done, skipped, failed, busy that any summary reports
    for it: an image failed or busy in one run and done in a later one is done. With ``check_disk`` an image
    reported done or skipped counts as an output only when its label map and masks are on disk and whole
    (:func:`~.io.output_problem`); the others are listed in ``not_on_disk`` (output -> what is wrong).

    Returns:
        ``{"parts": [...], "totals": {...}, "missing_parts": [...], "failed_parts": [...],
        "interrupted_parts": [...], "unreadable": [...], "not_on_disk": {...}}``. Each part row: ``file``, ``part`` (``[i, N]`` or
        ``None`` for ``summary.json``), ``images``, ``done``, ``skipped``, ``failed``, ``busy``, ``seconds`` (its
        wall time), ``volumes_per_minute``, ``host``, ``interrupted`` (stopped before its end).
        ``totals``: ``inputs`` (images in the batch, as the summaries report it), the distinct images ``done``,
        ``skipped``, ``failed``, ``busy`` (claimed by a process that did not report it), ``unreported``
        (in no summary) and ``not_on_disk`` (reported, but its files are missing or incomplete),
        ``complete`` (every image done or skipped), ``seconds`` (the parts' wall times added
        up), ``span_seconds`` (first start to last end) and ``volumes_per_minute`` (done per minute of that
        span). ``missing_parts``: ``"i/N"`` of every ``N`` seen whose summary is absent; ``failed_parts``: those
        with a failed image; ``interrupted_parts``: those stopped before their end (Ctrl-C, SIGTERM).
    """
    root = Path(folder)
    files = sorted(p for p in root.glob("summary*.json") if summary_kind(p.name) is not False)
    rows, unreadable = [], []
    seen: dict[int, set[int]] = {}
    status: dict[str, str] = {}
    inputs, starts, ends = 0, [], []
    files_of: dict[str, list[str]] = {}
    for f in files:
        data = _read_summary(f)
        if data is None:
            unreadable.append(f.name)
            continue
        kind = summary_kind(f.name)
        part = list(kind) if kind else None
        if part is not None:
            seen.setdefault(part[1], set()).add(part[0])
        records = data.get("per_image") or []
        counts = {s: sum(r.get("status") == s for r in records) for s in _PRECEDENCE}
        for r in records:
            key, s = str(r.get("output")), r.get("status")
            if s in _PRECEDENCE and (key not in status or _PRECEDENCE.index(s) < _PRECEDENCE.index(status[key])):
                status[key] = s
                files_of[key] = [key, *(r.get("masks") or [])]
        inputs = max(inputs, int(data.get("inputs", data.get("images", len(records))) or 0))
        wall = float(data.get("wall_seconds") or 0.0)
        if data.get("finished") is not None:
            ends.append(float(data["finished"]))
            starts.append(float(data.get("started", data["finished"] - wall)))
        rows.append({
            "file": f.name, "part": part, "images": len(records), **counts, "seconds": round(wall, 3),
            "volumes_per_minute": round(60.0 * counts["done"] / wall, 3) if wall > 0 else None,
            "host": data.get("host"), "interrupted": bool(data.get("interrupted")),
        })
    on_disk = {} if not check_disk else _check_on_disk(status, files_of, root)
    for key in on_disk:  # reported done or skipped, but not (or no longer) on disk: not an output
        del status[key]
    totals: dict[str, Any] = {s: sum(v == s for v in status.values()) for s in _PRECEDENCE}
    totals["inputs"] = max(inputs, len(status))
    totals["unreported"] = totals["inputs"] - len(status) - len(on_disk)
    totals["not_on_disk"] = len(on_disk)
    totals["complete"] = bool(status) and totals["done"] + totals["skipped"] == totals["inputs"]
    totals["seconds"] = round(sum(r["seconds"] for r in rows), 3)
    span = max(ends) - min(starts) if ends else sum(r["seconds"] for r in rows)
    totals["span_seconds"] = round(span, 3)
    totals["volumes_per_minute"] = round(60.0 * totals["done"] / span, 3) if span > 0 else None
    missing = [f"{i}/{n}" for n in sorted(seen) for i in range(n) if i not in seen[n]]
    def named(key: str) -> list[str]:
        return sorted({"/".join(map(str, r["part"])) if r["part"] else r["file"] for r in rows if r[key]})

    return {"parts": rows, "totals": totals, "missing_parts": missing, "failed_parts": named("failed"),
            "interrupted_parts": named("interrupted"), "unreadable": unreadable, "not_on_disk": on_disk}


def _check_on_disk(status: dict[str, str], files_of: dict[str, list[str]], root: Path) -> dict[str, str]:
    """``{output: what is wrong}`` for each image reported done or skipped whose files are not all whole on disk
    (the label map and its masks; relative paths are taken from the working folder, then from ``root``)."""
    from .io import output_problem

    wrong = {}
    for key, s in status.items():
        if s not in ("done", "skipped"):
            continue
        for f in files_of.get(key, [key]):
            p = Path(f)
            if not p.is_absolute() and not p.exists() and (root / p).exists():
                p = root / p
            problem = output_problem(p)
            if problem is not None:
                wrong[key] = f"{f}: {problem}"
                break
    return wrong


def keep_earlier_done(path: str | os.PathLike, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with each image skipped now (its output existed) but done in the summary at ``path`` (the one
    this run replaces) given its earlier record back, marked ``"earlier_run": true``, so that a rerun keeps what
    was done as done."""
    old = _read_summary(Path(path))
    if old is None:
        return records
    done = {str(r.get("output")): r for r in old.get("per_image") or [] if r.get("status") == "done"}
    kept = []
    for r in records:
        prev = done.get(str(r.get("output")))
        if r.get("status") == "skipped" and prev is not None:
            r = {**prev, "index": r.get("index"), "rank": r.get("rank"), "earlier_run": True}
        kept.append(r)
    return kept


def format_summary(merged: dict[str, Any]) -> str:
    """The table of :func:`merge_summaries`' result: a row per summary, the totals, then what is missing."""
    head = f"{'part':<12}{'images':>8}{'done':>7}{'skipped':>9}{'failed':>8}{'busy':>6}{'seconds':>10}{'vol/min':>9}"
    lines = [head]
    for r in merged["parts"]:
        name = "/".join(map(str, r["part"])) if r["part"] else "all"
        if r["part"] and not r["file"].endswith(f"-of-{r['part'][1]}.json"):
            name += "*"  # a second process of the same part
        if not r["part"] and r["file"] != "summary.json":
            name += "*"  # a whole run that finished while another one's summary was being written
        vpm = f"{r['volumes_per_minute']:.2f}" if r["volumes_per_minute"] is not None else "-"
        lines.append(f"{name:<12}{r['images']:>8}{r['done']:>7}{r['skipped']:>9}{r['failed']:>8}{r['busy']:>6}"
                     f"{r['seconds']:>10.1f}{vpm:>9}")
    t = merged["totals"]
    vpm = f"{t['volumes_per_minute']:.2f}" if t["volumes_per_minute"] is not None else "-"
    lines.append(f"{'total':<12}{t['inputs']:>8}{t['done']:>7}{t['skipped']:>9}{t['failed']:>8}{t['busy']:>6}"
                 f"{t['seconds']:>10.1f}{vpm:>9}")
    lines.append(f"{t['done'] + t['skipped']} of {t['inputs']} image(s) have an output; volumes per minute over "
                 f"{t['span_seconds']:.1f} s from the first start to the last end")
    if any(r["part"] and not r["file"].endswith(f"-of-{r['part'][1]}.json") for r in merged["parts"]):
        lines.append("*: a second process given the same part")
    if any(not r["part"] and r["file"] != "summary.json" for r in merged["parts"]):
        lines.append("all*: a whole run that ran at the same time as another into this folder")
    if merged.get("not_on_disk"):
        lines.append(f"not on disk: {len(merged['not_on_disk'])} image(s) reported done whose files are missing or "
                     "incomplete: " + "; ".join(merged["not_on_disk"].values()) + " (rerun to redo them)")
    if t["unreported"] or t["busy"]:
        lines.append(f"not finished: {t['unreported'] + t['busy']} image(s) in no summary or claimed by a process "
                     "that did not finish them; rerun their part")
    if merged["missing_parts"]:
        lines.append(f"missing parts (no summary): {', '.join(merged['missing_parts'])}")
    if merged["failed_parts"]:
        lines.append(f"parts with failed images: {', '.join(merged['failed_parts'])}")
    if merged.get("interrupted_parts"):
        lines.append(f"parts stopped before their end: {', '.join(merged['interrupted_parts'])}")
    if merged["unreadable"]:
        lines.append(f"unreadable summaries: {', '.join(merged['unreadable'])}")
    return "\n".join(lines)
