#!/usr/bin/env bash
# The second extrapolation study, look by look (the documentation's studies: "Pre-registration: the second
# extrapolation study", and its amendments). It starts once its noise pilot (bench/pilot_noise.sh) is scored and the
# design the pre-registered rule gives (bench/pilot_design.py -> bench/studies/extrapolation-sequential/design.json
# and family.json) is committed; without that commit it refuses to start.
#
# - Seed blocks: one seed of every system at a time, trained from a worktree pinned at the pilot's commit 7186bb6
#   (../pilot-wt), two runs at a time, one thread each; then decoded (--decode-only: every decoder, split, test-time
#   variant and length floor, and the attention statistics) from a worktree pinned at the commit that committed
#   design.json (../sequential-score-wt); then kept: the block's runs without their weights, packed into
#   bench/studies/extrapolation-sequential/records/ to be committed. A machine replaced between sessions loses at
#   most the block it was training: on the next, the kept blocks are unpacked and merged (--merge), not trained again.
# - Each look, once every block of its seeds is kept and committed (it waits for the commit): scored from the records (--family family.json, beam 5, greedy
#   and the length-controlled decoding, 10,000 bootstrap resamples); its results.json, report.md, figures,
#   hypotheses and tb are copied to bench/studies/extrapolation-sequential/looks/look-K, to be committed.
# - After the first look, the natural-length arm (seeds 1-3), in blocks and scored the same way (looks/natural).
# - After each look, bench/study_stop.py: the study stops at the first look at which every primary test is resolved
#   or futile, and otherwise at its last planned look.
#
#   bash bench/study_sequential.sh [RUNS_DIR]   # default ../sequential-runs; returns at once, log: RUNS_DIR/queue.log
#
# Resumable: run it again after any interruption, on this machine or another; each step skips what is done.
set -u
# The whole script is one function, read before it runs: an edit to this file while it runs cannot change it.
main() {
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    RUNS=$(realpath -m "${1:-$ROOT/../sequential-runs}")
    STUDY_DIR=bench/studies/extrapolation-sequential
    KEEP=$ROOT/$STUDY_DIR/records  # committed: every decoded run without its weights
    LOOKS_DIR=$ROOT/$STUDY_DIR/looks  # committed: each look as published
    TRAIN_COMMIT=7186bb6  # the pilot's: every run of the study is trained by it
    # The commit that fixed the design (the first to add design.json): it decodes and scores every block and look.
    SCORE_COMMIT=$(git -C "$ROOT" log --diff-filter=A --format=%h -- "$STUDY_DIR/design.json" | tail -n 1)
    if [ -z "$SCORE_COMMIT" ]; then
        echo "$STUDY_DIR/design.json is not committed: score the noise pilot, run bench/pilot_design.py on its two" \
            "arms with --out $STUDY_DIR, commit what it writes, then start this again"
        return 1
    fi
    if ! git -C "$ROOT" diff --quiet "$SCORE_COMMIT" HEAD -- "$STUDY_DIR/design.json" "$STUDY_DIR/family.json"; then
        echo "$STUDY_DIR/design.json or family.json differs from the commit that fixed the design ($SCORE_COMMIT):" \
            "the design is fixed once; restore them as that commit has them"
        return 1
    fi
    # shellcheck source=bench/worktree.sh
    source "$ROOT/bench/worktree.sh"  # in_background, worktree DIR COMMIT, step DIR WHAT ARGS..., keep_runs, restore_runs
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

    folder() {  # folder ARM: the arm's study folder name
        if [ "$1" = short ]; then echo study_extrapolation-sequential; else echo study_extrapolation-sequential-natural; fi
    }

    arm() {  # arm ARM: the arm's study options
        if [ "$1" = short ]; then echo "$SHORT"; else echo "$NATURAL"; fi
    }

    decoding() {  # decoding ARM: the options of the arm's decoding and scoring (its look's)
        if [ "$1" = short ]; then
            echo "--family $SCORE_WT/$STUDY_DIR/family.json --decoders beam5,greedy,beam5-minlen"
        else
            echo "--decoders beam5,greedy"
        fi
    }

    merged() {  # merged ARM: the --merge option of the arm's kept runs, if any were unpacked
        if [ -d "$RUNS/kept/$(folder "$1")/runs" ]; then echo "--merge $RUNS/kept/$(folder "$1")"; fi
    }

    block() {  # block ARM SEED: one seed of every system of the arm trained, decoded and kept, unless kept already
        local out="$KEEP/$1.seed$2.tar.xz"
        [ -f "$out" ] && return 0
        # shellcheck disable=SC2086,SC2046  # the option strings split into words on purpose
        step "$TRAIN_WT" "$1 arm, seed $2: training" $(arm "$1") --seeds "$2" --train-only $(merged "$1") &&
            step "$SCORE_WT" "$1 arm, seed $2: decoding" $(arm "$1") $(decoding "$1") --seeds "$2" --decode-only \
                $(merged "$1") &&
            keep_runs "$RUNS" "$out" $(cd "$RUNS" && echo "$(folder "$1")"/runs/*/"seed$2") &&
            echo "== $(date -Is) kept the $1 arm's seed $2 in $out (commit it)"
    }

    recorded() {  # recorded ARM SEEDS: once every block of the arm's seeds is committed as kept (tracked, unchanged):
        # a look is scored from committed records only, so that a later look on another machine merges the same runs
        local seed record waiting=""
        for seed in $(seq 1 "$2"); do
            record=$KEEP/$1.seed$seed.tar.xz
            until git -C "$ROOT" ls-files --error-unmatch -- "$record" > /dev/null 2>&1 &&
                git -C "$ROOT" diff --quiet HEAD -- "$record"; do
                if [ -z "$waiting" ]; then
                    echo "== $(date -Is) waiting for $record to be committed (a look is scored from committed records)"
                    waiting=1
                fi
                sleep "${RECORD_POLL:-60}"
            done
        done
    }

    look() {  # look ARM SEEDS NAME: every block of the arm's seeds, then the look scored and kept as NAME
        local seed
        for seed in $(seq 1 "$2"); do
            block "$1" "$seed" || return 1
        done
        recorded "$1" "$2" || return 1
        # shellcheck disable=SC2086,SC2046
        step "$SCORE_WT" "$3: scoring at $2 seeds per system" $(arm "$1") $(decoding "$1") --seeds "$2" $SCORING \
            $(merged "$1") && kept "$RUNS/$(folder "$1")" "$LOOKS_DIR/$3"
    }

    looks() {  # every look in turn, the natural-length arm after the first, until the stopping rule says stop
        local k=0 n verdict taken=()
        restore_runs "$RUNS/kept" "$KEEP"/*.tar.xz || return 1
        for n in $LOOKS; do
            k=$((k + 1))
            if [ ! -f "$LOOKS_DIR/look-$k/results.json" ]; then
                look short "$n" "look-$k" || return 1
            fi
            taken+=("$LOOKS_DIR/look-$k")
            if [ "$k" = 1 ] && [ ! -f "$LOOKS_DIR/natural/results.json" ]; then
                look natural 3 natural || return 1
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
    COMMON="--steps 900 --eval-every 300 --checkpoint last --runs $RUNS --jobs 2 --no-link $SETS"
    SHORT="--preset train-short-test-long --name extrapolation-sequential --variants sinusoidal,learnable,alibi,t5,rope
        $COMMON"
    NATURAL="--preset train-natural-test-long --name extrapolation-sequential-natural
        --variants sinusoidal,learnable,alibi,t5,rope $COMMON"
    SCORING="--score-only --bootstrap 10000"
    looks &&
        echo "== $(date -Is) sequential study done"
}
main "$@"; exit $?
