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
"""Triton's own cache key: found once per process, off the thread that launches kernels, and kept on disk.

Every kernel in Triton's cache is found under a key that starts with a hash of Triton's install
(``triton.runtime.cache.triton_key``: its runtime cache module, the sources of its compiler, backends and language,
and its shared library of ~470 MB), computed once per process before its first kernel: 0.34-0.7 s of a fresh
process on an H100 host with Triton 3.6. It changes only when those files do, so :func:`known_triton_key` keeps it
in ``monai-triton-key.json`` of the kernel cache folder under a stamp of those files (each one's path, size,
modification time and inode, and Triton's version). A process whose install has a stamp on file takes that key, as
Triton's own worker processes take their parent's; any other lets Triton compute it and adds it to the file. The
key, and so every kernel found with it, is the one Triton would compute.

:func:`prefetch_cache_key` finds the key on a daemon thread while the caller does other work (a fused network's
checkpoint read); :func:`wait_for_cache_key` is called before the first kernel.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import tempfile
import threading

from monai.utils.triton_support import interpreting, kernel_cache_dir, triton

__all__ = ["KEY_FILE", "install_stamp", "known_triton_key", "prefetch_cache_key", "wait_for_cache_key"]

#: the file's name in the kernel cache folder
KEY_FILE = "monai-triton-key.json"
_FORMAT = 1
_KEPT = 8  # stamps kept in the file: installs (virtual environments) that share one kernel cache folder


def _hashed_files(root: str) -> list[str]:
    """The files Triton's key is made of, and more: its runtime cache module and every module and shared library of
    its compiler, backends, language and ``_C`` folders (Triton reads a subset of these)."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    files = [os.path.join(root, "runtime", "cache.py")]
    for sub in ("compiler", "backends", "language", "_C"):
        for folder, _, names in os.walk(os.path.join(root, sub)):
            files += [os.path.join(folder, n) for n in names if n.endswith(suffixes)]
    return sorted(files)


def install_stamp() -> str:
    """A digest of Triton's version and of the path, size, modification time and inode of each file its key is made
    of (2 ms for ~75 files): a reinstall or an edit of any of them changes it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(triton.runtime.cache.__file__)))
    digest = hashlib.sha256(str(triton.__version__).encode())
    for path in _hashed_files(root):
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return digest.hexdigest()


def _read_keys(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):  # none yet, or damaged: the next key written replaces it
        return {}
    keys = data.get("keys") if isinstance(data, dict) and data.get("format") == _FORMAT else None
    return {s: k for s, k in keys.items() if isinstance(k, str)} if isinstance(keys, dict) else {}


def _write_keys(path: str, keys: dict[str, str]) -> None:
    """Replace the file whole (a reader sees the old file or the new one); where the folder cannot be written nothing
    is kept, and the next process hashes again, as without the file."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".monai-triton-key-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": _FORMAT, "keys": keys}, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


def known_triton_key(folder: str | None = None) -> str:
    """Triton's cache key for this process: the one kept in ``folder`` (default: the kernel cache folder) for this
    install's stamp, made the process's own (``triton.runtime.cache.triton_key`` returns it from then on); where
    none is kept, the one Triton computes, which is then kept.

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed: it has no kernel cache key")
    path = os.path.join(folder or kernel_cache_dir(), KEY_FILE)
    try:
        stamp, keys = install_stamp(), _read_keys(path)
    except OSError:  # a file of Triton's went away while it was stamped: what Triton computes holds, kept nowhere
        return str(triton.runtime.cache.triton_key())
    key = keys.get(stamp)
    if key is not None:
        triton.runtime.cache.triton_key = lambda: key
        return key
    key = str(triton.runtime.cache.triton_key())
    others = [s for s in keys if s != stamp][-(_KEPT - 1):]
    _write_keys(path, {**{s: keys[s] for s in others}, stamp: key})
    return key


_cache_key_thread: threading.Thread | None = None
_cache_key_lock = threading.Lock()


def prefetch_cache_key() -> threading.Thread | None:
    """Find Triton's cache key (:func:`known_triton_key`) on a daemon thread, once per process; returns that thread
    (the same one on every call), ``None`` where there is no key to find (no Triton, a Triton without
    ``triton.runtime.cache.triton_key``, or its interpreter, which looks up no compiled kernels).

    Where Triton has to hash itself, reading and hashing its large library lets other threads run, but its walk over
    its modules holds the GIL, so a caller that knows kernels will follow starts it where its own thread mostly waits
    (a fused network's checkpoint read: started before a command's imports it slowed them, 0.64-1.24 s against
    0.54-0.56 s to the first image's load on an H100 host); the first kernel's launch waits for it
    (:func:`wait_for_cache_key`). Only the time moves: the kernels and their results are the same.
    """
    global _cache_key_thread
    key = getattr(getattr(getattr(triton, "runtime", None), "cache", None), "triton_key", None)
    if key is None or interpreting():
        return None
    with _cache_key_lock:
        if _cache_key_thread is None:
            _cache_key_thread = threading.Thread(target=known_triton_key, name="triton-cache-key", daemon=True)
            _cache_key_thread.start()
        return _cache_key_thread


def wait_for_cache_key() -> None:
    """Wait until :func:`prefetch_cache_key`'s key is found, where it was started; call it before launching kernels.

    Triton keeps its hash only once it is computed: a kernel launched while the thread still hashes would hash
    Triton's files again on its own thread (0.34-0.39 s on an H100 host, measured as the first forward of a fresh
    process), where waiting costs only what is left of the first hash.
    """
    thread = _cache_key_thread
    if thread is not None and thread.is_alive():
        thread.join()
