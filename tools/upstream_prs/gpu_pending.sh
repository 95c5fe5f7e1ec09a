#!/usr/bin/env bash
# The GPU measurements of the PR write-ups (docs/prs/02, 03, 23, 24), on a machine with a CUDA GPU and no network.
#
#   bash tools/upstream_prs/gpu_pending.sh WEEKLY_SDIST DOCS_FROM OUT_DIR
#
# WEEKLY_SDIST: monai_weekly-1.7.dev2643.tar.gz; DOCS_FROM: a folder holding upstream's docs/source and tests/
# (from a git checkout; the sdist has neither); OUT_DIR: where the outputs go. Builds the branches from the sdist,
# runs the new tests that need a GPU, then each write-up's GPU command with the branch and the untouched
# tree, same machine, same run. Needs python with torch (CUDA), numpy, scipy, scikit-image and parameterized;
# packages installed elsewhere (pip install --target DIR) are found through PYTHONPATH, which is kept.
# Without black and isort there, the branches are built unformatted: the same code as the formatted branches
# (docs/notes/cpu-2026-12-06-prs/h100_branches_vs_formatted.txt), a different diffstat in build.txt.
set -euo pipefail
sdist=$(realpath "$1"); docs=$(realpath "$2"); out=$(realpath "$3")
work=$(mktemp -d)
mkdir -p "$work/weekly" "$out"
tar xzf "$sdist" --no-same-owner --strip-components=1 -C "$work/weekly"
python tools/upstream_prs/build.py --monai-src "$work/weekly" --tests-from "$docs" \
    --author "vista3d bench <bench@localhost>" > "$out/build.txt" 2>&1 || true  # the table says what was built
git clone -q "$work/weekly" "$work/untouched"
for b in vista3d-release-cached-memory-option inferer-sliding-window-timing vista3d-point-inferer-device \
    transforms-connected-components-on-device; do
    git clone -q --branch "$b" "$work/weekly" "$work/$b"
done
# the two click PRs together, for measuring only (each PR stays an independent branch)
git clone -q --branch vista3d-point-inferer-device "$work/weekly" "$work/clicks-both"
git -C "$work/clicks-both" -c user.name=bench -c user.email=bench@localhost pull -q --no-rebase --no-edit \
    "$work/weekly" transforms-connected-components-on-device
# the new tests' GPU cases (skipped on the CPU machines), with upstream's test helpers copied in
for t in inferer-sliding-window-timing:tests.inferers.test_sliding_window_timing \
    vista3d-point-inferer-device:tests.apps.vista3d.test_point_based_window_inferer_device \
    transforms-connected-components-on-device:tests.transforms.test_label_connected_components; do
    b=${t%%:*}
    cp -rn "$docs/tests" "$work/$b/" 2>/dev/null || true
    (cd "$work/$b" && PYTHONPATH=".:${PYTHONPATH:-}" python -m unittest -v "${t#*:}") > "$out/gpu-tests-$b.txt" 2>&1 || true
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" || true
bench="python tools/upstream_prs/bench.py"
u="untouched=$work/untouched"
$bench cache --device cuda --size 128 --windows 4 --classes 117 --repeats 10 --tree "$u" \
    --tree "branch=$work/vista3d-release-cached-memory-option" > "$out/cache.txt" 2>&1 || true
$bench timing --device cuda --size 256 --roi 128 --classes 117 --sw-batch-size 4 --repeats 10 --tree "$u" \
    --tree "branch=$work/inferer-sliding-window-timing" > "$out/timing.txt" 2>&1 || true
$bench clicks --device cuda --amp --image 512 512 200 --roi 128 --repeats 5 --tree "$u" \
    --tree "branch=$work/vista3d-point-inferer-device" --tree "both=$work/clicks-both" > "$out/clicks.txt" 2>&1 || true
$bench labeller --device cuda --image 300 250 200 --repeats 5 \
    --tree "branch=$work/transforms-connected-components-on-device" > "$out/labeller.txt" 2>&1 || true
rm -rf "$work"
