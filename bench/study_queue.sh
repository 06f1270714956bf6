#!/usr/bin/env bash
# The extrapolation study (README, "Pre-registration") and its continuation, in the order README declares: train the
# study's 15 runs to 2,250 steps from a worktree pinned at the training commit; then the continuation to a flattened
# budget: the rule (bench/pilot_rule.py, from a third pinned worktree) raises the study's budget by 450 steps while
# any encoding's seed-mean validation BLEU still gains 1.0 (cap 4,500), and the study is scored with --score-only at
# the budget it fixes, from a worktree pinned at the scoring commit. (The candidates of issue 24, queued here first
# until 2026-11-28, were trained and scored on a lent GPU instead: README, "The candidates ... on a GPU".)
# After each training step bench/study_replay.py says, in the log, whether the retrained runs repeat the published
# study's (validation BLEU at every evaluation); it reads only.
# Resumable: run it again after any interruption (a session's end, a reboot, a new machine); each step skips what is
# done.
#
#   bash bench/study_queue.sh [RUNS_DIR]        # default ../study-runs; returns at once, log: RUNS_DIR/queue.log
#
# It goes on in the background in a session of its own (setsid: no terminal's hangup stops it, and its priority
# does not touch the caller's). On a machine without the worktrees it makes them beside this checkout
# (../study-wt, ../score-wt, ../rule-wt), each with a virtual environment: a copy of this checkout's .venv when there
# is one, else a fresh install as .ci/run makes.
set -u
# The whole script is one function, read before it runs: an edit to this file while a queue runs cannot change it.
main() {
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    RUNS=$(realpath -m "${1:-$ROOT/../study-runs}")
    # shellcheck source=bench/worktree.sh
    source "$ROOT/bench/worktree.sh"  # in_background, worktree DIR COMMIT [movable], step DIR WHAT ARGS...
    in_background "$0" "$RUNS" queue.log "study queue"
    TRAIN_COMMIT=44dd6fe   # trains every run of both studies (README: the amendment of 2026-11-26)
    SCORE_COMMIT=2b7045d   # scores them (README: "Scoring, once every run is at 2,250 steps")
    RULE_COMMIT=139ce20    # reads only: the continuation's budget rule (bench/pilot_rule.py --seed 1,2,3), bench/study_replay.py
    BASE="--preset train-short-test-long --seeds 3 --jobs 2 --eval-every 150 --checkpoint last --runs $RUNS"
    COMMON="$BASE --steps 2250"
    STUDY="--name extrapolation --variants sinusoidal,learnable,alibi,t5,rope"

    # Above other work on the machine (training results do not depend on timing; this only keeps the study moving).
    echo -10 > /proc/self/autogroup 2>/dev/null || true
    mkdir -p "$RUNS" && exec >> "$RUNS/queue.log" 2>&1 < /dev/null || exit 1

    replayed() {  # replayed STUDY_DIR...: do the retrained runs repeat the published study's? Logged, and kept in
        # the first study folder's replay.txt for its report (it stops nothing: a difference is reported, not hidden)
        echo "== $(date -Is) replay check against bench/studies/extrapolation"
        (cd "$RULE_WT" && .venv/bin/python bench/study_replay.py bench/studies/extrapolation "$@") |
            tee "$1/replay.txt" || true
    }

    continued() {  # the continuation: raise the study's budget by the rule, then score it at the budget it fixes
        local verdict budget before=""
        while :; do
            verdict=$(cd "$RULE_WT" && .venv/bin/python bench/pilot_rule.py "$RUNS/study_extrapolation" --seed 1,2,3 \
                --start 2250 --cap 4500) || return 1
            echo "== $(date -Is) issue 21 continuation: the budget rule"
            echo "$verdict"
            verdict=$(tail -n 1 <<< "$verdict")
            budget=$(grep -o '[0-9][0-9]*' <<< "$verdict" | head -n 1)  # the line's first number is the budget
            if [ "$verdict" = "$before" ]; then  # trained, yet the rule still waits: an evaluation it needs is missing
                echo "the rule's verdict did not move after training to $budget steps (a run lacks an evaluation the" \
                    "rule reads, e.g. its validation event was lost when it was killed): stopping; see its train.log"
                return 1
            fi
            before=$verdict
            case $verdict in
                "rule: budget B = "*) break ;;
                # a raise, or one a stopped queue began: train every run to that budget
                *"raise the study's --steps to "* | *"the runs are still training toward "*)
                    # shellcheck disable=SC2086
                    step "$TRAIN_WT" "issue 21 continuation: training" $STUDY $BASE --steps "$budget" --train-only || return 1
                    replayed "$RUNS/study_extrapolation" ;;
                *) return 1 ;;
            esac
        done
        # shellcheck disable=SC2086
        step "$SCORE_WT" "issue 21 continuation: scoring" $STUDY $BASE --steps "$budget" --bootstrap 10000 --score-only
    }

    once() {  # once NAME COMMAND...: COMMAND, unless a queue before this one finished it (RUNS/queue-done/NAME): the
        # step at 2,250 is not run again once the continuation has trained its runs on
        local name=$1
        shift
        if [ -f "$RUNS/queue-done/$name" ]; then
            echo "== $(date -Is) $name: done by an earlier queue"
            return 0
        fi
        "$@" && mkdir -p "$RUNS/queue-done" && touch "$RUNS/queue-done/$name"
    }

    TRAIN_WT=$(realpath -m "$ROOT/../study-wt")
    SCORE_WT=$(realpath -m "$ROOT/../score-wt")
    RULE_WT=$(realpath -m "$ROOT/../rule-wt")
    worktree "$TRAIN_WT" "$TRAIN_COMMIT" && worktree "$SCORE_WT" "$SCORE_COMMIT" && worktree "$RULE_WT" "$RULE_COMMIT" movable ||
        exit 1
    # shellcheck disable=SC2086  # the option strings split into words on purpose
    once study-trained-2250 step "$TRAIN_WT" "issue 21 study: training" $STUDY $COMMON --train-only &&
        replayed "$RUNS/study_extrapolation" &&
        once continuation-scored continued &&
        echo "== $(date -Is) queue done"
}
main "$@"; exit $?
