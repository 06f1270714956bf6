#!/usr/bin/env bash
# The second extrapolation study, look by look (the documentation's studies: "Pre-registration: the second
# extrapolation study"). It starts once its noise pilot (bench/pilot_noise.sh) is scored and the design the
# pre-registered rule gives (bench/pilot_design.py -> bench/studies/extrapolation-sequential/design.json and
# family.json) is committed; without that commit it refuses to start.
#
# - Training, from a worktree pinned at the pilot's commit 7186bb6 (the pilot's own, ../pilot-wt): every system to
#   the look's seeds per system, two runs at a time, one thread each; the chosen arm's pilot runs (sinusoidal and
#   RoPE, seeds 1-6, from PILOT_RUNS/study_pilot-<arm>) merged in first (--merge).
# - Scoring at each look, from a worktree pinned at the commit that committed design.json (../sequential-score-wt):
#   --family family.json, beam 5, greedy and the length-controlled decoding, 10,000 bootstrap resamples. The look's
#   results.json, report.md, figures, hypotheses and tb are copied to RUNS/looks/look-K.
# - After the first look, the natural-length arm (seeds 1-3), trained and scored the same way (RUNS/looks/natural).
# - After each look, bench/study_stop.py: the study stops at the first look at which every primary test is resolved
#   or futile, and otherwise at its last planned look.
#
#   bash bench/study_sequential.sh [RUNS_DIR]   # default ../sequential-runs; returns at once, log: RUNS_DIR/queue.log
#   PILOT_RUNS=../pilot-runs                    # where the pilot's arms are (the default)
#
# Resumable: run it again after any interruption; each step skips what is done.
set -u
# The whole script is one function, read before it runs: an edit to this file while it runs cannot change it.
main() {
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    RUNS=$(realpath -m "${1:-$ROOT/../sequential-runs}")
    PILOT=$(realpath -m "${PILOT_RUNS:-$ROOT/../pilot-runs}")
    STUDY_DIR=bench/studies/extrapolation-sequential
    TRAIN_COMMIT=7186bb6  # the pilot's: every run of the study is trained by it
    SCORE_COMMIT=$(git -C "$ROOT" log -1 --format=%h -- "$STUDY_DIR/design.json")  # the commit that fixed the design
    if [ -z "$SCORE_COMMIT" ]; then
        echo "$STUDY_DIR/design.json is not committed: score the noise pilot, run bench/pilot_design.py on its two" \
            "arms with --out $STUDY_DIR, commit what it writes, then start this again"
        return 1
    fi
    # shellcheck source=bench/worktree.sh
    source "$ROOT/bench/worktree.sh"  # in_background, worktree DIR COMMIT, step DIR WHAT ARGS...
    in_background "$0" "$RUNS" queue.log "sequential study" 10
    mkdir -p "$RUNS" && exec >> "$RUNS/queue.log" 2>&1 < /dev/null || return 1
    TRAIN_WT=$(realpath -m "$ROOT/../pilot-wt")
    SCORE_WT=$(realpath -m "$ROOT/../sequential-score-wt")
    worktree "$TRAIN_WT" "$TRAIN_COMMIT" && worktree "$SCORE_WT" "$SCORE_COMMIT" || return 1

    design() {  # design arm|sets|looks: what the committed design.json decided
        "$SCORE_WT/.venv/bin/python" - "$SCORE_WT/$STUDY_DIR/design.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print({"arm": d["arm"], "sets": " ".join(f"--set {o}" for o in d["overrides"]),
       "looks": " ".join(map(str, d["looks"]))}[sys.argv[2]])
PY
    }

    kept() {  # kept STUDY LOOK: a scored look's files, copied whole (a look's folder is complete or absent)
        rm -rf "$2.partial" && mkdir -p "$2.partial" &&
            cp -a "$1/results.json" "$1/report.md" "$1/figures" "$1/hypotheses" "$1/tb" "$2.partial/" &&
            mv "$2.partial" "$2"
    }

    looks() {  # every look in turn, the natural-length arm after the first, until the stopping rule says stop
        local k=0 n verdict taken=()
        for n in $LOOKS; do
            k=$((k + 1))
            if [ ! -f "$RUNS/looks/look-$k/results.json" ]; then
                # shellcheck disable=SC2086  # the option strings split into words on purpose
                step "$TRAIN_WT" "look $k: training to $n seeds per system" $SHORT --seeds "$n" --train-only \
                    --merge "$PILOT/study_pilot-$ARM" &&
                    step "$SCORE_WT" "look $k: scoring at $n seeds per system" $SHORT --seeds "$n" $SCORING \
                        --family "$SCORE_WT/$STUDY_DIR/family.json" --decoders beam5,greedy,beam5-minlen &&
                    kept "$RUNS/study_extrapolation-sequential" "$RUNS/looks/look-$k" || return 1
            fi
            taken+=("$RUNS/looks/look-$k")
            if [ "$k" = 1 ] && [ ! -f "$RUNS/looks/natural/results.json" ]; then
                # shellcheck disable=SC2086
                step "$TRAIN_WT" "natural-length arm: training" $NATURAL --train-only &&
                    step "$SCORE_WT" "natural-length arm: scoring" $NATURAL $SCORING --decoders beam5,greedy &&
                    kept "$RUNS/study_extrapolation-sequential-natural" "$RUNS/looks/natural" || return 1
            fi
            verdict=$(cd "$SCORE_WT" && .venv/bin/python bench/study_stop.py "${taken[@]}") || return 1
            echo "== $(date -Is) after look $k: the stopping rule"
            echo "$verdict"
            case $verdict in
                stop:*) return 0 ;;
            esac
        done
    }

    ARM=$(design arm) && SETS=$(design sets) && LOOKS=$(design looks) || return 1
    echo "== $(date -Is) sequential study: the $ARM arm (${SETS:-no --set}), looks at $LOOKS seeds per system;" \
        "scored by $SCORE_COMMIT"
    COMMON="--steps 900 --eval-every 300 --checkpoint last --runs $RUNS --jobs 2 $SETS"
    SHORT="--preset train-short-test-long --name extrapolation-sequential --variants sinusoidal,learnable,alibi,t5,rope
        $COMMON"
    NATURAL="--preset train-natural-test-long --name extrapolation-sequential-natural
        --variants sinusoidal,learnable,alibi,t5,rope --seeds 3 $COMMON"
    SCORING="--score-only --bootstrap 10000"
    looks &&
        echo "== $(date -Is) sequential study done"
}
main "$@"; exit $?
