"""The PR series: for each PR its branch name, write-up, the edits to upstream files and its new files.

The edits are written here (``small_prs.py``, ``timing_pr.py``, ``clicks_prs.py``) against upstream's structure
and found by class and function name; the new files (tests in upstream's layout) are this repository's own, under
``payload/<branch>/``. Every PR is independent: each branch is one commit on the untouched upstream tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools.upstream_prs import clicks_prs, small_prs, timing_pr
from tools.upstream_prs.edits import EditError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VISTA3D = "monai/networks/nets/vista3d.py"
SEGRESNET_DS = "monai/networks/nets/segresnet_ds.py"

# the commands whose output a write-up quotes; BRANCH and UNTOUCHED are checkouts of the branch and of its base
BENCH = "python tools/upstream_prs/bench.py"


@dataclass(frozen=True)
class PR:
    branch: str  # also the folder of its new files under payload/
    writeup: str  # path in this repository
    edits: dict[str, Callable[[str], str]]  # upstream file -> edit of its text
    upstream_tests: tuple[str, ...]  # upstream's tests of the touched modules, run unchanged on the branch
    measured: tuple[str, ...] = ()  # the commands (run on the branch) whose output the write-up quotes

    @property
    def payload(self) -> Path:
        return HERE / "payload" / self.branch

    @property
    def new_files(self) -> list[Path]:
        """The PR's new files, as paths relative to the upstream tree."""
        files = [p for p in sorted(self.payload.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
        return [p.relative_to(self.payload) for p in files]

    @property
    def new_tests(self) -> tuple[str, ...]:
        return tuple(str(p) for p in self.new_files if p.name.startswith("test_") and p.suffix == ".py")

    @property
    def tests(self) -> tuple[str, ...]:
        return self.upstream_tests + self.new_tests

    def edited(self, tree: Path) -> dict[str, str]:
        """The edited text of each file the PR changes in ``tree``, nothing written; ``EditError`` if it does not
        apply there (a file or function moved, or a new file of the PR already exists)."""
        out = {}
        for rel, edit in self.edits.items():
            path = tree / rel
            if not path.is_file():
                raise EditError(f"{rel} does not exist")
            try:
                out[rel] = edit(path.read_text())
            except EditError as e:
                raise EditError(f"{rel}: {e}") from None
        for rel in self.new_files:
            if (tree / rel).exists():
                raise EditError(f"{rel} already exists upstream")
        return out

    def apply(self, tree: Path) -> None:
        """Edit ``tree`` in place and add the new files; raises ``EditError`` (and writes nothing) if it does not
        apply."""
        for rel, text in self.edited(tree).items():
            (tree / rel).write_text(text)
        for rel in self.new_files:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text((self.payload / rel).read_text())


PRS = (
    PR(
        "vista3d-class-head-single-channel",
        "docs/prs/01-class-head-single-channel.md",
        {VISTA3D: small_prs.class_head_reshape},
        ("tests/networks/nets/test_vista3d.py",),
        (f"{BENCH} class-head --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
    PR(
        "vista3d-release-cached-memory-option",
        "docs/prs/02-release-cached-memory-option.md",
        {VISTA3D: small_prs.vista3d_release_option},
        ("tests/networks/nets/test_vista3d.py",),
        (f"{BENCH} cache --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
    PR(
        "segresnetds2-shared-bottleneck",
        "docs/prs/22-segresnetds2-shared-bottleneck.md",
        {SEGRESNET_DS: small_prs.segresnet_shared_bottleneck},
        ("tests/networks/nets/test_segresnet_ds.py", "tests/networks/nets/test_vista3d.py"),
        (f"{BENCH} bottleneck --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
    PR(
        "inferer-sliding-window-timing",
        "docs/prs/03-sliding-window-timing.md",
        {
            timing_pr.INFERER: timing_pr.inferer_timing,
            timing_pr.INFERERS_INIT: timing_pr.inferers_init_export,
            timing_pr.INFERERS_RST: timing_pr.inferers_rst,
        },
        ("tests/inferers/test_sliding_window_inference.py",),
        (f"{BENCH} timing --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
    PR(
        "vista3d-point-inferer-device",
        "docs/prs/23-point-inferer-device.md",
        {clicks_prs.VISTA3D_INFERER: clicks_prs.point_inferer_device},
        ("tests/apps/vista3d/test_point_based_window_inferer.py",),
        (f"{BENCH} clicks --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
    PR(
        "transforms-connected-components-on-device",
        "docs/prs/24-connected-components-on-device.md",
        {clicks_prs.TRANSFORMS_UTILS: clicks_prs.transforms_device_labeller},
        (
            "tests/integration/test_vista3d_utils.py",
            "tests/transforms/test_keep_largest_connected_component.py",
            "tests/apps/vista3d/test_vista3d_transforms.py",
        ),
        (f"{BENCH} labeller --tree branch=BRANCH",),
    ),
    PR(
        "vista3d-meta-device-build",
        "docs/prs/25-vista3d-meta-device-build.md",
        {VISTA3D: small_prs.vista3d_meta_build},
        ("tests/networks/nets/test_vista3d.py",),
        (f"{BENCH} meta-build --tree untouched=UNTOUCHED --tree branch=BRANCH",),
    ),
)
