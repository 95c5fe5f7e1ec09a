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
"""gzip for NIfTI files: a threaded reader and a block-parallel writer, both standard single-member gzip.

Reading inflates on a background thread (zlib and isal release the GIL), so the consumer's conversion
overlaps it. Writing compresses independent blocks on a few threads and joins them into one deflate stream
(as pigz does), the CRC-32 combined from the blocks'. When ``isal`` (python-isal,
Intel ISA-L) is installed it is used automatically; ``VISTA3D_GZIP_CODEC=zlib`` forces the standard library.

A large file on a machine with many cores is inflated by ``rapidgzip`` instead (parallel decompression of an
ordinary single-member gzip file), when it is installed: see :func:`use_rapidgzip` and
``VISTA3D_GZIP_READER``.
"""

from __future__ import annotations

import os
import pathlib
import queue
import struct
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from monai.apps.vista3d.errors import Vista3DInputError

from .handoff import get_from

__all__ = [
    "GZIP_MAGIC",
    "available_cores",
    "gzip_codec",
    "crc32_combine",
    "Gunzip",
    "ParallelGunzip",
    "ParallelInflateError",
    "gzip_reader_choice",
    "rapidgzip_chunk_bytes",
    "use_rapidgzip",
    "write_gzip",
]

#: the first two bytes of every gzip file
GZIP_MAGIC = b"\x1f\x8b"
_BLOCK = 8 << 20  # bytes per independently compressed block when writing


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def gzip_codec() -> Any:
    """The zlib-compatible module used for gzip: ``isal.isal_zlib`` when it imports, else ``zlib``.

    isal (python-isal, Intel ISA-L) is installed with the package on the platforms that have its wheels
    (x86-64 and ARM64 Linux, macOS and Windows); elsewhere, or when it fails to import, the standard library's
    zlib is used with the same results. ``VISTA3D_GZIP_CODEC=zlib`` forces the standard library, ``=isal``
    requires isal.
    """
    choice = os.environ.get("VISTA3D_GZIP_CODEC", "").strip().lower() or "auto"  # set but empty: as unset
    if choice not in ("auto", "zlib", "isal"):
        raise Vista3DInputError(f"VISTA3D_GZIP_CODEC={choice!r}: use 'auto', 'zlib' or 'isal'.")
    if choice == "zlib":
        return zlib
    try:
        from isal import (
            isal_zlib,  # a requirement where wheels exist: 2-3x faster gzip, same format
        )
    except (ImportError, OSError) as e:  # not installed, or its compiled library does not load here
        if choice == "isal":
            raise Vista3DInputError(
                f"VISTA3D_GZIP_CODEC=isal but isal cannot be imported ({e}); pip install isal, or unset it."
            ) from None
        return zlib
    return isal_zlib


def _codec_errors(codec: Any) -> tuple[type[BaseException], ...]:
    return (zlib.error, codec.error, EOFError, OSError)


_PIECE = 256 << 10  # compressed bytes read per step
_OUT = 256 << 10  # most output bytes per decompress call: chunks stay in cache and reuse heap memory
#: most inflated chunks waiting for the consumer (32 MiB): inflating goes on while the consumer converts a slab
_QUEUE_CHUNKS = 128


class _Reader:
    """``read`` and ``skip`` on top of a ``readinto`` that fills its buffer unless the stream ends."""

    #: the bytes read are inflated (a reader of an uncompressed file says False)
    compressed = True

    def readinto(self, buf: np.ndarray) -> int:
        raise NotImplementedError

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end of the stream)."""
        buf = bytearray(n)
        return bytes(buf[: self.readinto(np.frombuffer(buf, dtype=np.uint8))])

    def skip(self, n: int | None = None) -> int:
        """Discard the next ``n`` bytes (``None``: up to the end, so that the CRC and length are checked)."""
        scratch, done = np.empty(min(n if n is not None else _SCRATCH, _SCRATCH), dtype=np.uint8), 0
        while n is None or done < n:
            got = self.readinto(scratch if n is None else scratch[: n - done])
            if not got:
                break
            done += got
        return done


_SCRATCH = 4 << 20  # bytes per read when discarding


class Gunzip(_Reader):
    """Decompress a gzip file (one or more members) on a background thread, yielding output chunks.

    Decompression (zlib and isal release the GIL) then overlaps the consumer's float32 conversion; the
    whole file is checked (CRC, length), so a corrupt or truncated file raises at the end at the latest.
    Read it either by iterating over the chunks or with ``readinto``/``read``/``skip``, not both.
    """

    def __init__(self, path: pathlib.Path):
        self.path = path
        self._codec = gzip_codec()  # a bad VISTA3D_GZIP_CODEC raises here, in the caller's thread
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vista3d-gunzip", daemon=True)
        self._thread.start()
        self._chunks = self._generate()  # one generator: iterating again resumes, never waits past the end
        self._left = np.frombuffer(b"", dtype=np.uint8)  # what readinto has not handed on yet of the current chunk

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        codec = self._codec
        try:
            with open(self.path, "rb") as f:
                d, started = codec.decompressobj(31), False
                while not self._stop.is_set():
                    piece = f.read(_PIECE)
                    if not piece:
                        break
                    while piece:
                        if d.eof:  # another member follows (bgzip-style files), or zero padding
                            piece = piece.lstrip(b"\x00")
                            if not piece:
                                break
                            d, started = codec.decompressobj(31), False
                        started = True
                        out = d.decompress(piece, _OUT)
                        if out and not self._put(out):
                            return
                        piece = d.unused_data if d.eof else d.unconsumed_tail
                if started and not d.eof:  # output held back by the size limit, or a truncated stream
                    out = d.flush()
                    if out and not self._put(out):
                        return
                    if not d.eof:
                        raise EOFError("incomplete or truncated stream")
            self._put(None)
        except BaseException as e:  # handed to the consumer
            self._put(e)

    def __iter__(self):
        return self._chunks

    def _generate(self):
        while True:
            item = get_from(self._queue, self._thread, f"inflate ({self.path.name})")
            if item is None:
                return
            if isinstance(item, BaseException):
                if isinstance(item, _codec_errors(self._codec)):
                    raise Vista3DInputError(
                        f"{self.path}: corrupt or truncated gzip file ({item}); re-export or re-download it "
                        "(check with 'gzip -t')."
                    ) from None
                raise item
            yield item

    def readinto(self, buf: np.ndarray) -> int:
        """Fill the 1-D uint8 array ``buf`` with the next bytes; fewer only at the end of the stream."""
        n = 0
        while n < len(buf):
            if not len(self._left):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._left = np.frombuffer(chunk, dtype=np.uint8)
            take = min(len(self._left), len(buf) - n)
            buf[n : n + take] = self._left[:take]  # a numpy copy releases the GIL: inflating goes on
            self._left = self._left[take:]
            n += take
        return n

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _import_rapidgzip() -> Any:
    try:
        import rapidgzip  # a requirement where wheels exist: parallel inflate of single-member gzip
    except (ImportError, OSError):  # not installed, or its compiled library does not load here
        return None
    return rapidgzip


#: smallest compressed file, and fewest cores, for which ``VISTA3D_GZIP_READER=auto`` picks rapidgzip: its
#: parallel inflate costs ~3x isal's CPU time per byte (measured on a 2-core AMD EPYC VM), so it needs many
#: cores to win, and files large enough to give every thread chunks (see :func:`rapidgzip_chunk_bytes`).
RAPIDGZIP_MIN_BYTES = 32 << 20
RAPIDGZIP_MIN_CORES = 8


def rapidgzip_chunk_bytes(compressed_bytes: int, threads: int) -> int:
    """rapidgzip's chunk of compressed input for a file of ``compressed_bytes`` on ``threads`` threads: its
    default 4 MiB, halved down to 1 MiB until every thread has at least 4 chunks.

    A CT's few dozen MB in 4 MiB chunks leave most of a many-core host's threads idle: a 45.7 MB CT on 16 threads
    inflated in 0.060 s with 1 MiB chunks, 0.073 s with 2 MiB and 0.079 s with 4 MiB (H100 host, docs/benchmarks.md).
    """
    chunk = 4 << 20
    while chunk > 1 << 20 and compressed_bytes < 4 * max(1, threads) * chunk:
        chunk //= 2
    return chunk


def gzip_reader_choice() -> str:
    """``VISTA3D_GZIP_READER``: ``auto`` (default; see :func:`use_rapidgzip`), ``stream`` (:class:`Gunzip`
    always) or ``rapidgzip`` (:class:`ParallelGunzip` first for every file, whatever its size and the cores;
    rapidgzip must import)."""
    choice = os.environ.get("VISTA3D_GZIP_READER", "auto").lower()
    if choice not in ("auto", "rapidgzip", "stream"):
        raise Vista3DInputError(f"VISTA3D_GZIP_READER={choice!r}: use 'auto', 'rapidgzip' or 'stream'.")
    if choice == "rapidgzip" and _import_rapidgzip() is None:
        raise Vista3DInputError("VISTA3D_GZIP_READER=rapidgzip but rapidgzip cannot be imported; pip install it.")
    return choice


def use_rapidgzip(path: pathlib.Path, choice: str | None = None) -> bool:
    """Whether ``path`` is inflated by :class:`ParallelGunzip` rather than :class:`Gunzip`.

    ``auto``: when rapidgzip imports, ``VISTA3D_GZIP_CODEC`` is not ``zlib``, the process has at least
    :data:`RAPIDGZIP_MIN_CORES` cores and the file has at least :data:`RAPIDGZIP_MIN_BYTES`.
    """
    choice = gzip_reader_choice() if choice is None else choice
    if choice != "auto":
        return choice == "rapidgzip"
    if os.environ.get("VISTA3D_GZIP_CODEC", "auto").lower() == "zlib" or _import_rapidgzip() is None:
        return False
    return available_cores() >= RAPIDGZIP_MIN_CORES and path.stat().st_size >= RAPIDGZIP_MIN_BYTES


class ParallelInflateError(Vista3DInputError):
    """rapidgzip refused a file: corrupt, truncated, or a form it does not read (zero padding after the end)."""


def _inflate_error(path: pathlib.Path, why: Any) -> ParallelInflateError:
    why = (str(why).strip().splitlines() or ["error"])[0][:200]
    return ParallelInflateError(
        f"{path}: corrupt or truncated gzip file ({why}); re-export or re-download it (check with 'gzip -t')."
    )


class ParallelGunzip(_Reader):
    """Inflate a gzip file on ``threads`` threads with rapidgzip, which checks each member's CRC and length.

    Its threads decode chunks ahead of the reader (prefetching), so the consumer's conversion of what it has
    read overlaps the inflating of the rest; ``readinto`` copies straight into the consumer's buffer.
    rapidgzip can report the end of a truncated stream without an error, so at the end the number of bytes
    read is also checked against the length in the file's last 4 bytes (the gzip trailer; for a file of
    several members, the last one's: such a file is refused here too, and read by :class:`Gunzip`).
    """

    def __init__(self, path: pathlib.Path, threads: int | None = None):
        self.path, self._total, self._file = path, 0, None
        threads = available_cores() if threads is None else max(1, int(threads))
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            self._isize = struct.unpack("<I", f.read(4))[0]
        try:
            chunk = rapidgzip_chunk_bytes(path.stat().st_size, threads)
            self._file = _import_rapidgzip().RapidgzipFile(str(path), parallelization=threads, chunk_size=chunk)
        except (RuntimeError, ValueError) as e:
            raise _inflate_error(path, e) from None

    def readinto(self, buf: np.ndarray) -> int:
        """Fill the 1-D uint8 array ``buf`` with the next bytes; fewer only at the end of the stream."""
        if self._file is None:
            raise ValueError(f"{self.path}: read after close")
        mv, n = buf.data.cast("B"), 0
        try:
            while n < len(mv):
                got = self._file.readinto(mv[n:])
                if not got:
                    break
                n += got
        except (RuntimeError, ValueError) as e:  # rapidgzip's errors for a bad stream, CRC or length
            raise _inflate_error(self.path, e) from None
        self._total += n
        if n < len(mv) and self._total % 2**32 != self._isize:
            raise _inflate_error(self.path, f"{self._total} bytes inflated, the gzip trailer says {self._isize}")
        return n

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_CRC_POLY = 0xEDB88320


def _gf2_times(mat: list[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _crc32_shift(nbytes: int) -> list[int]:
    """GF(2) operator that advances a CRC-32 over ``nbytes`` zero bytes (zlib's crc32_combine, as a matrix)."""
    odd = [_CRC_POLY] + [1 << n for n in range(31)]  # one zero bit
    even = [_gf2_times(odd, odd[n]) for n in range(32)]  # two
    odd = [_gf2_times(even, even[n]) for n in range(32)]  # four
    total = [1 << n for n in range(32)]
    while nbytes:
        even = [_gf2_times(odd, odd[n]) for n in range(32)]
        if nbytes & 1:
            total = [_gf2_times(even, total[n]) for n in range(32)]
        nbytes >>= 1
        if not nbytes:
            break
        odd = [_gf2_times(even, even[n]) for n in range(32)]
        if nbytes & 1:
            total = [_gf2_times(odd, total[n]) for n in range(32)]
        nbytes >>= 1
    return total


def crc32_combine(crc1: int, crc2: int, len2: int, _cache: dict = {}) -> int:  # noqa: B006 (memo)
    """CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (what zlib's C API offers)."""
    if len2 not in _cache:
        if len(_cache) > 16:
            _cache.clear()
        _cache[len2] = _crc32_shift(len2)
    return _gf2_times(_cache[len2], crc1) ^ crc2


def write_gzip(f: Any, pieces: Sequence[Any], level: int, threads: int, codec: Any) -> None:
    """Write ``pieces`` to ``f`` as one standard gzip member, compressing blocks in parallel.

    Each block is an independent raw deflate stream ended by a sync flush (the last by Z_FINISH), so their
    concatenation is one valid deflate stream; the CRC-32 is combined from per-block CRCs.

    Args:
        f: binary file open for writing.
        pieces: buffers, split into blocks of 8 MiB, or callables that return one block's buffer; a callable
            runs on the compressing thread, so producing the bytes (a cast, a transposition) is parallel too,
            and an exception it raises propagates here.
        level: deflate level (isal: 0-3).
        threads: compressing threads (1: all on the calling thread).
        codec: ``zlib`` or ``isal.isal_zlib``.
    """
    if codec is not zlib:
        level = min(level, 3)  # ISA-L has levels 0..3 (all compress; 0 is its fastest)
    combine = getattr(codec, "crc32_combine", crc32_combine)
    blocks: list[Any] = []
    for piece in pieces:
        if callable(piece):
            blocks.append(piece)
            continue
        mv = memoryview(piece).cast("B")
        blocks.extend(mv[i : i + _BLOCK] for i in range(0, len(mv), _BLOCK))
    last = len(blocks) - 1

    def work(i: int) -> tuple[bytes, int, int]:
        block = blocks[i]
        data = memoryview(block() if callable(block) else block).cast("B")
        c = codec.compressobj(level, codec.DEFLATED, -15)
        body = c.compress(data) + c.flush(codec.Z_FINISH if i == last else codec.Z_SYNC_FLUSH)
        return body, codec.crc32(data), len(data)

    f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # gzip header: deflate, no name, mtime 0, OS unknown
    crc, total = 0, 0
    if threads > 1 and len(blocks) > 1:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="vista3d-gzip")
        results = pool.map(work, range(len(blocks)))
    else:
        pool, results = None, map(work, range(len(blocks)))
    try:
        for i, (body, c, n) in enumerate(results):
            f.write(body)
            crc = combine(crc, c, n) if i else c
            total += n
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    f.write(struct.pack("<II", crc & 0xFFFFFFFF, total & 0xFFFFFFFF))
