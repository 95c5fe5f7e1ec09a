#!/usr/bin/env bash
# Test runner in the spirit of MONAI's runtests.sh.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
    cat <<USAGE
Usage: ./runtests.sh [--unittests] [--codeformat] [--quick] [--network] [--coverage] [-h|--help] [-- PYTEST_ARGS...]

  --unittests   run the unit test suite under tests/ (the default when --codeformat is not given)
  --codeformat  lint and type-check monai/: ruff check (pycodestyle, pyflakes, isort, bugbear, naming, ...) and
                mypy, both configured in pyproject.toml (needs the dev extra: pip install -e ".[dev]");
                with --unittests the tests run after it
  --quick       skip tests marked slow (those that build full-size networks or run subprocesses)
  --network     also run the tests marked network (they download, e.g. pip installs the oldest supported
                Triton to build the GPU kernels with it); without it no test touches the network
  --coverage    measure line coverage of monai/ (needs the 'coverage' package)
  -h, --help    show this help

The exit code is non-zero when any test fails or any lint or type finding is reported.
USAGE
}

unittests=0
codeformat=0
quick=0
coverage=0
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --unittests) unittests=1; shift ;;
        --codeformat) codeformat=1; shift ;;
        --quick) quick=1; unittests=1; shift ;;
        --network) export MONAI_NETWORK_TESTS=1; unittests=1; shift ;;
        --coverage) coverage=1; unittests=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra+=("$@"); unittests=1; break ;;
        *) echo "runtests.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python}"
if [[ $codeformat -eq 0 ]]; then
    unittests=1
fi

if [[ $codeformat -eq 1 ]]; then
    for tool in ruff mypy; do
        if ! "$PYTHON" -m "$tool" --version >/dev/null 2>&1; then
            echo "runtests.sh: --codeformat needs $tool: pip install -e \".[dev]\"" >&2
            exit 2
        fi
    done
    # both read their settings from pyproject.toml; each reports every finding before the exit code is decided
    status=0
    echo "ruff check monai"
    "$PYTHON" -m ruff check monai || status=1
    echo "mypy monai"
    "$PYTHON" -m mypy monai || status=1
    if [[ $status -ne 0 ]]; then
        echo "runtests.sh: --codeformat found problems (above)" >&2
        exit 1
    fi
fi
if [[ $unittests -eq 0 ]]; then
    exit 0
fi

args=(tests -q -p no:cacheprovider)
if [[ $quick -eq 1 ]]; then
    export QUICKTEST=1
fi
if [[ ${#extra[@]} -gt 0 ]]; then
    args+=("${extra[@]}")
fi

if [[ $coverage -eq 1 ]]; then
    if ! "$PYTHON" -c "import coverage" 2>/dev/null; then
        echo "runtests.sh: --coverage needs the 'coverage' package: pip install coverage" >&2
        exit 2
    fi
    "$PYTHON" -m coverage run --source monai -m pytest "${args[@]}"
    "$PYTHON" -m coverage report
else
    "$PYTHON" -m pytest "${args[@]}"
fi
