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
"""One table of the summaries that the parts and runs of a batch wrote into one output folder (``vista3d
summary``): every image counted once, checked against the disk, and the parts that are missing or failed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from monai.apps.vista3d.io.paths import summary_kind

__all__ = ["done_now", "merge_summaries", "format_summary", "keep_earlier_done"]

# the status of an image in merged summaries: the first of these that any summary reports for its output
_PRECEDENCE = ("done", "skipped", "failed", "busy")


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
    (:func:`~.nifti.output_problem`); the others are listed in ``not_on_disk`` (output -> what is wrong).

    Returns:
        ``{"parts": [...], "totals": {...}, "missing_parts": [...], "failed_parts": [...], "interrupted_parts":
        [...], "unreadable": [...], "not_on_disk": {...}}``. Each part row: ``file``, ``part`` (``[i, N]`` or
        ``None`` for ``summary.json``), ``images``, ``done``, ``skipped``, ``failed``, ``busy``, ``seconds``
        (its wall time), ``done_now`` (done by that run, not kept from an earlier one), ``volumes_per_minute``
        (``done_now`` per minute of its wall time), ``host``, ``interrupted`` (stopped before its end).
        ``totals``: ``inputs`` (images in the batch, as the summaries report it), the distinct images ``done``,
        ``skipped``, ``failed``, ``busy`` (claimed by a process that did not report it), ``unreported``
        (in no summary) and ``not_on_disk`` (reported, but its files are missing or incomplete),
        ``complete`` (every image done or skipped), ``seconds`` (the parts' wall times added
        up), ``span_seconds`` (first start to last end) and ``volumes_per_minute`` (the rows' ``done_now`` per
        minute of that span). ``missing_parts``: ``"i/N"`` of every ``N`` seen whose summary is absent;
        ``failed_parts``: those with a failed image; ``interrupted_parts``: those stopped before their end (Ctrl-C,
        SIGTERM).
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
            "volumes_per_minute": round(60.0 * done_now(records) / wall, 3) if wall > 0 else None,
            "done_now": done_now(records),
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
    made = sum(r["done_now"] for r in rows)  # an earlier run's images took none of this span
    totals["volumes_per_minute"] = round(60.0 * made / span, 3) if span > 0 else None
    missing = [f"{i}/{n}" for n in sorted(seen) for i in range(n) if i not in seen[n]]
    def named(key: str) -> list[str]:
        return sorted({"/".join(map(str, r["part"])) if r["part"] else r["file"] for r in rows if r[key]})

    return {"parts": rows, "totals": totals, "missing_parts": missing, "failed_parts": named("failed"),
            "interrupted_parts": named("interrupted"), "unreadable": unreadable, "not_on_disk": on_disk}


def _check_on_disk(status: dict[str, str], files_of: dict[str, list[str]], root: Path) -> dict[str, str]:
    """``{output: what is wrong}`` for each image reported done or skipped whose files are not all whole on disk
    (the label map and its masks; relative paths are taken from the working folder, then from ``root``)."""
    from monai.apps.vista3d.io.nifti_write import output_problem

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


def done_now(records: list[dict[str, Any]]) -> int:
    """Images of ``records`` done by the run that wrote them (not kept from an earlier run's summary)."""
    return sum(r.get("status") == "done" and not r.get("earlier_run") for r in records)


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
