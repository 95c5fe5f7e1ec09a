# session 2026-12-05c, call 4: clicks after the labeller's background fix (the comparison of sides now runs); the GPU
# tests of the labeller, the point inferer's stitch and the masks
O=$OUT/call4; mkdir -p $O; cp gpu_call4.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"; } >> $O/log.txt
st() { name=$1; lim=$2; shift 2; s=$(date +%s); timeout $lim "$@" > $O/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt; }
st pytest 60 python3 -m pytest -q -p no:cacheprovider tests/utils/test_point_helpers.py tests/apps/vista3d/test_point_inferer.py tests/apps/vista3d/test_session.py
st clicks 150 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json
st click_profile 60 python3 tests/benchmarks/experiments/click_profile.py --device cuda --rows 20
cat $O/log.txt; tail -2 $O/pytest.txt; tail -10 $O/clicks.txt; grep "click stages" $O/click_profile.txt
