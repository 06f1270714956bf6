#!/usr/bin/env bash
# Score a study's finished runs while its last runs still train and a core would otherwise idle.
#
#   bash bench/study_prescore.sh STUDY_DIR TRAIN_PID SCORE_WT [JOBS]
#
# bench/study_queue.sh runs it beside each training step. While TRAIN_PID (that step) lives and fewer than JOBS
# (default 2) train.py processes train in STUDY_DIR/runs for two polls in a row (a minute apart: not the seconds
# between one run's end and the next one's start), it runs on one finished run the command the scoring step would
# run for it: SCORE_WT's own test.py on checkpoints/last.pt, beam 5 and greedy in one call, one thread
# (OMP_NUM_THREADS=1, as bench/study.py gives each of its two jobs), its output appended to the seed folder's
# study.log. The scoring step (bench/study.py --score-only in SCORE_WT) then skips every run whose scores are current
# (same sentences, no inference overrides, the checkpoint's step) and scores the rest itself, so nothing here can
# change a number: it only moves work into a core's idle time. Test variants (e.g. RoPE's scalings) are left to
# the scoring step. A finished run: its train.log says "stopping at step N: train.max_steps=N reached", it has
# checkpoints/last.pt, and no train.py names its seed folder; linked seed folders (symlinks, another study's runs)
# are skipped. STUDY_DIR/prescored.txt lists the runs tried, so a resumed queue does not run them again (a run
# whose test.py failed or was killed is scored by the scoring step). After TRAIN_PID ends it finishes the test.py
# under way, so the scoring step never scores a run at the same time.
set -u
# The whole script is one function, read before it runs: an edit to this file while it runs cannot change it.
main() {
    local study=${1:?STUDY_DIR} train=${2:?TRAIN_PID} score_wt=${3:?SCORE_WT} jobs=${4:-2}
    local tried="$study/prescored.txt" idle=0 seed run found
    mkdir -p "$study" && touch "$tried" || return 1
    while kill -0 "$train" 2>/dev/null; do
        if [ "$(pgrep -fc "train\.py .*$study/runs/")" -lt "$jobs" ]; then idle=$((idle + 1)); else idle=0; fi
        found=""
        if [ "$idle" -ge 2 ]; then
            for seed in "$study"/runs/*/seed*; do
                [ -d "$seed" ] && [ ! -L "$seed" ] || continue
                pgrep -f "train\.py .*$seed(/| |$)" > /dev/null && continue
                run=""
                for dir in "$seed"/*/; do  # the last run folder with a last.pt, as bench/study.py's find_run
                    dir=${dir%/}
                    [ -L "$dir" ] || [ ! -f "$dir/checkpoints/last.pt" ] || run=$dir
                done
                [ -n "$run" ] && grep -qE 'stopping at step ([0-9]+): train\.max_steps=\1 reached' "$run/train.log" \
                    2> /dev/null || continue
                grep -qxF "$run" "$tried" && continue
                found=$run
                break
            done
        fi
        if [ -z "$found" ]; then
            sleep "${PRESCORE_POLL:-60}"
            continue
        fi
        echo "$found" >> "$tried"
        echo "== $(date -Is) prescoring $found (a core is idle while the last runs train)"
        (cd "$score_wt" && OMP_NUM_THREADS=1 .venv/bin/python test.py --model_path "$found/checkpoints/last.pt" \
            --beam 5 1 >> "$(dirname "$found")/study.log" 2>&1) ||
            echo "== $(date -Is) prescoring $found failed (exit $?): the scoring step will score it"
        idle=0
    done
}
main "$@"; exit $?
