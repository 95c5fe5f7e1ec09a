# Four device calls at main 36f0f8e (2026-12-06, asked as nvidia-h100-x1: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130,
# Triton 3.6.0). Calls 1, 2, 4 carried .wheels (upstream monai 1.6.1, nibabel, parameterized, isal, rapidgzip, the
# serve wheels, pynrrd, pydicom, highdicom, pyjpegls); call 3 carried .upstream (monai-weekly 1.7.dev2643's sdist,
# upstream's docs/ and tests/ from a clone, parameterized and scikit-image wheels).
# call 1
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu dicom_statistics
python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 10 --clicks 5 --json $OUT/clicks.json
# call 2
bash tests/benchmarks/run_h200.sh $OUT setup slicer_clicks
python3 tests/benchmarks/vista3d_cold_start.py --device cuda --upstream /tmp/up --repeats 2 --workdir /tmp/cold --json $OUT/cold_start.json
# call 3 (-> prs/)
pip install -q --no-index --no-deps --target /tmp/site .upstream/whl/*.whl; export PYTHONPATH=/tmp/site
bash tools/upstream_prs/gpu_pending.sh .upstream/monai_weekly-1.7.dev2643.tar.gz .upstream/up $OUT
# call 4 (-> agreement/)
python3 -m pytest -q -p no:cacheprovider -x tests/inferers/test_sliding_window_timing.py tests/benchmarks/test_benchmark_scripts.py -k "keys_and_types or dicom_read"
python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --workdir /tmp/sp --out $OUT --top 40
python3 tests/benchmarks/vista3d_trained_agreement.py --device cuda --upstream /tmp/up --checkpoint /tmp/trained_vista3d.pt --steps 560 --train-seconds 140 --json $OUT/trained_agreement.json
python3 tests/benchmarks/vista3d_click_agreement.py --device cuda --upstream /tmp/up --checkpoint /tmp/trained_vista3d.pt --point-steps 400 --train-seconds 110 --json $OUT/click_agreement.json
