# Device calls after the NRRD writer (main at the commits "vista3d serve: NRRD answers from the app's own
# writer" and "benchmarks: the cold-start benchmark byte-compiles both packages"), 2026-12-06, nvidia-h100-x1:
# NVIDIA H100 80GB HBM3, torch 2.11.0+cu130; .wheels carried.
python3 -c "import sys,os;print('dont_write_bytecode', sys.flags.dont_write_bytecode, os.environ.get('PYTHONDONTWRITEBYTECODE'), sys.pycache_prefix)"
ls /opt/torch/.venv/lib/python3.12/site-packages/torch/__pycache__      # env.txt: PYTHONDONTWRITEBYTECODE=1, no torch pycs
bash tests/benchmarks/run_h200.sh $OUT setup; export PYTHONPATH=$PWD:/tmp/deps
python3 -m pytest -q -p no:cacheprovider tests/apps/vista3d/test_nrrd_write.py tests/inferers/test_sliding_window_timing.py tests/apps/vista3d/server/test_monailabel_jobs.py
python3 tests/benchmarks/vista3d_slicer_clicks.py --device cuda --weights-size published --json $OUT/slicer_clicks.json
#   (first run: slicer_clicks_before_fix.txt, the benchmark itself read the mask, now on the GPU, with .numpy(); fixed, rerun)
python3 tests/benchmarks/vista3d_cold_start.py --device cuda --upstream /tmp/up --repeats 2 --workdir /tmp/cold --json $OUT/cold_start.json
grep -o '"sw_batch_size[^,]*' /tmp/cold/out/summary.json     # log.txt: auto resolved to 18 windows
python3 -m pytest -q -p no:cacheprovider -n 12 tests/apps/vista3d/server tests/apps/vista3d/test_io.py tests/apps/vista3d/test_nrrd_write.py tests/apps/vista3d/test_batch_workers.py --ignore=tests/apps/vista3d/server/test_openapi.py
#   -> 439 passed in 17.88 s
# last call (at 876d512, the session's device time nearly spent): the whole suite, cut by the call's 190 s limit at
# 96 % of the tests, with no failure among those that ran (pytest_gpu_cut_at_96pc.txt)
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu
