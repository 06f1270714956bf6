#!/bin/bash
# The candidates' study of the extrapolation study (README, "The candidates ... on a lent GPU") on one lent GPU:
# all 15 runs trained at once (one process each, --jobs 15), then scored, then the study folder packed without
# checkpoints. Run on the device machine from the checkout, with its own CUDA PyTorch and the missing packages
# carried as wheels in .whl/, the bench data in .gpu/data/bench (../shared/gpu/CHECKLIST.md says how):
#
#   TRAIN_UNTIL=500 SCORE_UNTIL=575 OUT=<folder> bash bench/gpu_study.sh
#
# TRAIN_UNTIL and SCORE_UNTIL are seconds from the start at which training and scoring are stopped (a SIGTERM:
# train.py saves last.pt, and the same command resumes them), so the packing fits in the lease; run it again to go
# on. Writes <folder>/log.txt, smi.csv (GPU utilization and memory every 20 s) and study.tar.xz.
set -u
START=$(date +%s)
el() { echo $(( $(date +%s) - START )); }
OUT=${OUT:?set OUT to the folder for the log and the packed study}
exec > >(tee -a "$OUT/log.txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HOME=/tmp/hf
export FR2EN_SHARED_DATA=${FR2EN_SHARED_DATA:-$PWD/.gpu/data}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'cores', __import__('os').cpu_count())"
grep -m1 'model name' /proc/cpuinfo
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
ARGS="--preset train-short-test-long --name extrapolation-candidates --variants sinusoidal+shape,kerple_log,fire,decoder-nope
      --seeds 3 --steps 2250 --eval-every 150 --checkpoint last --runs runs --jobs ${JOBS:-15}"
STUDY=runs/study_extrapolation-candidates
echo "== $(el) s: training"
# shellcheck disable=SC2086  # the option string splits into words on purpose
left=$(( ${TRAIN_UNTIL:-450} - $(el) ))
timeout -s TERM $(( left > 1 ? left : 1 )) python3 bench/study.py $ARGS --train-only
rc=$?
echo "== $(el) s: training rc $rc"
for f in "$STUDY"/runs/*/seed*/study.log; do
    echo "$f: $(grep -a -o 'step [0-9]*' "$f" | tail -n 1) | $(grep -a 'valid loss' "$f" | tail -n 1 | cut -c1-160)"
done
left=$(( ${SCORE_UNTIL:-560} - $(el) ))
if [ "$left" -gt 30 ]; then
    echo "== $(el) s: scoring"
    # shellcheck disable=SC2086
    timeout -s TERM "$left" python3 bench/study.py $ARGS --bootstrap 1000 --score-only
    rc=$?
    echo "== $(el) s: scoring rc $rc"
fi
kill %1 2>/dev/null
tar -cJf "$OUT/study.tar.xz" --exclude='*.pt' --exclude='cache' "$STUDY"
(cd "$OUT" && split -b 15M study.tar.xz study.tar.xz. && rm study.tar.xz)  # what a device call brings back: 16 MiB a file
ls -la "$OUT"
echo "== $(el) s: done"
