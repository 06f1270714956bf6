#!/bin/bash
# One prepared GPU call (docs/pages/benchmarks/gpu.md, "Measuring a GPU"), about 8 minutes on an H100/H200: the base
# model trained eager and compiled at 4k / 16k / 32k target tokens per step in fp32 and bf16 (target tokens/s, MFU,
# peak memory), where the fastest setting's step goes, the study's small model with 16, 1 and 8 runs sharing the GPU,
# and Eole 0.6.4 on the same GPU (bench/gpu_bench.py says how each is measured). Run it from the project root with a
# CUDA build of PyTorch, the bench corpus in $FR2EN_SHARED_DATA/bench/fr-en (default .gpu/data), the Python packages
# the machine lacks as wheels in .whl/ (installed into /tmp/site without dependencies) and Eole's in .whl/eole/:
#
#   OUT=<folder> bash bench/gpu_bench.sh             # <folder>/gpu_bench.json, gpu_bench.md, log.txt, parts/
#   OUT=<folder> bash bench/gpu_bench.sh --dry-run   # the same path on the CPU: the demo corpus, a d 32 model
#
# Each part runs under its own time cap, in seconds: BASE_S (200), PROFILE_S (40), STUDY_S (140), EOLE_S (60; without
# Eole's wheel 5, its time going to the base model and the study); a part stopped by its cap keeps what it measured.
# PARTS (default "base profile study eole") picks parts; BASE_ARGS and STUDY_ARGS add options of bench/gpu_bench.py
# (e.g. BASE_ARGS="--modes eager,compile,reduce-overhead"); WORK keeps the runs and caches (default: a temporary
# folder, removed after); PYTHON is the interpreter (default python3).
set -u
DRY=""
for arg in "$@"; do
    case $arg in
        --dry-run) DRY="--dry-run" ;;
        *) echo "gpu_bench.sh: unknown argument $arg (the only one is --dry-run)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

main() {
    local start rc=0 made=""
    start=$(date +%s)
    el() { echo $(( $(date +%s) - start )); }
    if [ -z "$DRY" ]; then
        if ls .whl/*.whl >/dev/null 2>&1; then
            $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || return 1
            export PYTHONPATH=/tmp/site:$PWD HF_HOME=${HF_HOME:-/tmp/hf}
        fi
        export FR2EN_SHARED_DATA=${FR2EN_SHARED_DATA:-$PWD/.gpu/data}
        $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
            echo "gpu_bench.sh: CUDA is not available to $PY here: run it on a GPU machine, or with --dry-run"
            return 2
        }
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    fi
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
    local eole_wheels=${EOLE_WHEELS:-$PWD/.whl/eole} extra_base=0 extra_study=0 eole_s=60
    if ! ls "$eole_wheels"/eole-0.6.4-*.whl >/dev/null 2>&1; then
        eole_s=5 extra_base=40 extra_study=15
    fi
    export EOLE_WHEELS=$eole_wheels
    local base_s=${BASE_S:-$((200 + extra_base))} profile_s=${PROFILE_S:-40} study_s=${STUDY_S:-$((140 + extra_study))}
    eole_s=${EOLE_S:-$eole_s}
    if [ -n "$DRY" ]; then base_s=${BASE_S:-600} profile_s=${PROFILE_S:-300} study_s=${STUDY_S:-300} eole_s=${EOLE_S:-60}; fi
    local work=${WORK:-}
    if [ -z "$work" ]; then work=$(mktemp -d "${TMPDIR:-/tmp}/fr2en-gpu-bench.XXXXXX") && made=$work; fi
    local command="BASE_S=$base_s PROFILE_S=$profile_s STUDY_S=$study_s EOLE_S=$eole_s bash bench/gpu_bench.sh${DRY:+ $DRY}"
    echo "== $command"
    rm -rf "$OUT/parts"
    part() {  # name, cap in seconds, options: the part stops itself 10 s before its cap, the cap stops it anyway
        local name=$1 cap=$2 code
        shift 2
        echo "== $(el) s: $name (time cap $cap s)"
        # shellcheck disable=SC2086  # the options of BASE_ARGS / STUDY_ARGS split into words on purpose
        timeout -k 5 "$cap" $PY bench/gpu_bench.py "$name" --out "$OUT" --work "$work" \
            --budget $(( cap > 20 ? cap - 10 : cap )) $DRY "$@"
        code=$?
        if [ $code -ne 0 ]; then
            echo "== $name: ended with status $code$([ $code -eq 124 ] && echo ': its time cap')"
            rc=1
        fi
    }
    for name in ${PARTS:-base profile study eole}; do
        case $name in
            base) part base "$base_s" ${BASE_ARGS:-} ;;
            profile) part profile "$profile_s" ;;
            study) part study "$study_s" ${STUDY_ARGS:-} ;;
            eole) part eole "$eole_s" ;;
            *) echo "gpu_bench.sh: PARTS: unknown part $name (base, profile, study, eole)"; rc=1 ;;
        esac
    done
    $PY bench/gpu_bench.py report --out "$OUT" --command "$command" || rc=1
    [ -n "$made" ] && rm -rf "$made"
    echo "== $(el) s: done; $OUT/gpu_bench.md"
    return $rc
}

main 2>&1 | tee -a "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
