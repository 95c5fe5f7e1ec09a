# session 2026-12-05c, call 5: HEAD on the GPU after issue 33's room moves: the GPU tests of clicks, labeller and
# masks; clicks after 029503b; one fresh CLI run
O=$OUT/call5; mkdir -p $O; cp gpu_call5.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"; } >> $O/log.txt
st() { name=$1; lim=$2; shift 2; s=$(date +%s); timeout $lim "$@" > $O/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt; }
st pytest 45 python3 -m pytest -q -p no:cacheprovider tests/utils/test_point_helpers.py tests/apps/vista3d/test_point_inferer.py tests/apps/vista3d/test_session.py tests/apps/vista3d/test_streaming.py
st clicks 90 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json
W=/tmp/tl; python3 -c "import sys; sys.path.insert(0,'tests/benchmarks'); from pathlib import Path; from vista3d_cold_start import write_inputs; write_inputs(Path('$W'), False, 1, 0)"
st cli 50 python3 -m monai.apps.vista3d -i $W/cts/ct0.nii.gz -o $W/out --weights $W/model.pt --device cuda --timing --overwrite
cat $O/log.txt; tail -2 $O/pytest.txt; tail -9 $O/clicks.txt; tail -10 $O/cli.txt
