"""Shared pytest configuration: the ``slow`` marker, skipped by ``./runtests.sh --quick``, and one temporary folder
for everything the suite would otherwise leave in the home directory."""

import atexit
import os
import shutil
import tempfile

# Triton's kernel cache (~/.triton) and the tests' own download cache (~/.cache/monai-tests) go to a folder of this
# session, removed at its end; set before torch or Triton is imported, and inherited by the tests' child processes.
_SESSION_DIR = tempfile.mkdtemp(prefix="monai-tests-")
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["TRITON_HOME"] = _SESSION_DIR
os.environ["TRITON_CACHE_DIR"] = os.path.join(_SESSION_DIR, "triton-cache")
os.environ["MONAI_TRITON_CACHE"] = os.path.join(_SESSION_DIR, "monai-tests")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_SESSION_DIR, "inductor")  # else /tmp/torchinductor_<user>

import pytest  # noqa: E402
import torch  # noqa: E402

# Keep the suite fast and repeatable on the 2-core CI machines.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Without a GPU the Triton kernels run in Triton's CPU interpreter; it must be chosen before they are first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: builds full-size networks or runs subprocesses")
    config.addinivalue_line("markers", "network: downloads (pip); runs only with MONAI_NETWORK_TESTS=1 (--network)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MONAI_NETWORK_TESTS", "") not in ("1", "true", "True"):  # unit tests stay offline by default
        offline = pytest.mark.skip(reason="needs the network: opt in with ./runtests.sh --network")
        for item in items:
            if "network" in item.keywords:
                item.add_marker(offline)
    if os.environ.get("QUICKTEST", "") not in ("1", "true", "True"):
        return
    skip = pytest.mark.skip(reason="skipped by --quick")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_patch_left_started():
    """Fail a test that leaves a ``mock.patch(...).start()`` running (stopped here, so the next tests of the same
    process, e.g. of one pytest-xdist worker, run as they would alone)."""
    from unittest import mock

    active = getattr(mock._patch, "_active_patches", None)  # the patches started and not stopped (CPython 3.8+)
    before = list(active) if active is not None else []
    yield
    if active is None:
        return
    leaked = [p for p in active if not any(p is q for q in before)]
    for p in reversed(leaked):
        p.stop()
    if leaked:
        names = ", ".join(str(getattr(p, "attribute", None) or getattr(p, "in_dict", p)) for p in leaked)
        pytest.fail(f"the test left {len(leaked)} mock patch(es) started ({names}); stop them with addCleanup(p.stop)")
