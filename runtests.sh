#!/usr/bin/env bash
# Test runner in the spirit of MONAI's runtests.sh.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
    cat <<USAGE
Usage: ./runtests.sh [--unittests] [--quick] [--network] [--coverage] [-h|--help] [-- PYTEST_ARGS...]

  --unittests   run the unit test suite under tests/ (the default)
  --quick       skip tests marked slow (those that build full-size networks or run subprocesses)
  --network     also run the tests marked network (they download, e.g. pip installs the oldest supported
                Triton to build the GPU kernels with it); without it no test touches the network
  --coverage    measure line coverage of monai/ (needs the 'coverage' package)
  -h, --help    show this help

The exit code is non-zero when any test fails.
USAGE
}

quick=0
coverage=0
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --unittests) shift ;;
        --quick) quick=1; shift ;;
        --network) export MONAI_NETWORK_TESTS=1; shift ;;
        --coverage) coverage=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; extra+=("$@"); break ;;
        *) echo "runtests.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

PYTHON="${PYTHON:-python}"
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
