#!/usr/bin/env bash
# The noise pilot of the extrapolation question: does a run that ends (a learning-rate cool-down to zero) and an
# endpoint that averages (an EMA of the weights) leave less seed-to-seed noise than the published design
# (inverse-sqrt schedule, the last checkpoint)? Declared on 2026-11-29, before any of its runs:
#
# - Arms: "plain", the published study's training exactly (bench/studies/extrapolation: the train-short-test-long
#   preset, --checkpoint last); "cool", the same with train.cooldown=0.2 (the learning rate falls linearly to zero
#   over the last 20 % of the steps) and train.ema_decay=0.99 (the checkpoint scored holds the weights' EMA).
# - Systems: sinusoidal (the baseline) and rope, with the preset's RoPE test variants; seeds 1-6 in each arm, the
#   same seed giving both arms the same tokenizer, initialisation and batch order; 900 optimizer steps (the
#   published study's first budget), validation every 300, one CPU thread per run, two runs at a time; both arms
#   trained, scored and kept seeds 1-2 as a pair, then one seed at a time, in turn (an interrupted pilot stays
#   balanced; amended on 2026-11-30, from two seeds at a time: see the second study's amendments).
# - Scored: chrF and BLEU, beam 5, on test.tatoeba and test.multi30k-2016 at x1 and x4 (the published family's
#   splits and drops), every sentence; 1,000 bootstrap resamples (the pilot's p-values are not its question).
# - Endpoint: for each arm, the pooled residual standard deviation of the family's chrF quantities (the x4 scores
#   and the x1-to-x4 drops; results.json, "primary" -> "power"), and its ratio cool / plain, with a 95 % interval
#   from the F distribution on the residual degrees of freedom. Goal: a ratio of 0.5 or less, a quarter
#   of the seeds for the same power. Secondary: the x1 chrF and validation BLEU of each arm (an arm that lowers
#   noise by lowering quality is said so).
# - Nothing of the pilot is a finding about encodings: it decides the design of the next pre-registration.
#
#   bash bench/pilot_noise.sh [RUNS_DIR]       # default ../pilot-runs; returns at once, log: RUNS_DIR/pilot.log
#
# Resumable: run it again after any interruption; each study skips what is done. After an arm's seed is scored, its
# runs of that seed, without their weights (what the report needs: score files, hypotheses, logs,
# not the TensorBoard events), are packed into bench/studies/noise-pilot/records/ to be committed; on a new machine the
# pilot unpacks them and merges them into its studies (--merge), so only the seeds not yet kept are trained again.
# It trains from a worktree pinned at PILOT_COMMIT (../pilot-wt, made beside this checkout when missing), in a session of its own, at low priority.
# To stop it (before a session ends): kill -TERM -- -PGID, PGID the pilot's process group (ps -eo pgid,args | grep
# pilot_noise): each training finishes its step and saves last.pt; an archive or score file left half-written is
# written again on the next start.
set -u
# The whole script is one function, read before it runs: an edit to this file while the pilot runs cannot change it.
main() {
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    RUNS=$(realpath -m "${1:-$ROOT/../pilot-runs}")
    # shellcheck source=bench/worktree.sh
    source "$ROOT/bench/worktree.sh"  # in_background, worktree DIR COMMIT, step DIR WHAT ARGS..., keep_runs, restore_runs
    in_background "$0" "$RUNS" pilot.log "noise pilot" 10
    PILOT_COMMIT=7186bb6  # trains and scores both arms
    COMMON="--preset train-short-test-long --variants sinusoidal,rope --steps 900 --eval-every 300
        --checkpoint last --runs $RUNS --jobs 2 --bootstrap 1000 --decoders beam5 --no-link
        --splits test.tatoeba,test.tatoeba.x4,test.multi30k-2016,test.multi30k-2016.x4"
    PLAIN="--name pilot-plain"
    COOL="--name pilot-cool --set train.cooldown=0.2 --set train.ema_decay=0.99"
    mkdir -p "$RUNS" && exec >> "$RUNS/pilot.log" 2>&1 < /dev/null || exit 1
    export CUDA_VISIBLE_DEVICES=""  # every run on the CPU, as declared, on a machine with a GPU too
    WT=$(realpath -m "$ROOT/../pilot-wt")
    worktree "$WT" "$PILOT_COMMIT" || exit 1
    KEEP=$ROOT/bench/studies/noise-pilot/records  # committed: what scoring needs outlives this machine
    merged() {  # merged ARM: the --merge option of the arm's kept runs, if any
        if [ -d "$RUNS/kept/study_pilot-$1/runs" ]; then echo "--merge $RUNS/kept/study_pilot-$1"; fi
    }
    arms() {  # each arm trained, scored and kept one seed at a time (both systems at once; seeds 1-2 as a pair, as
        # begun), the arms in turn: an interrupted pilot stays balanced
        local unit first last arm opts out
        restore_runs "$RUNS/kept" "$KEEP"/pilot-*.tar.xz || return 1
        for unit in 1-2 3 4 5 6; do
            first=${unit%-*} last=${unit#*-}
            for arm in plain cool; do
                if [ "$arm" = cool ]; then opts=$COOL; else opts=$PLAIN; fi
                out=$KEEP/pilot-$arm.seeds$unit.tar.xz
                if [ "$first" = "$last" ]; then out=$KEEP/pilot-$arm.seed$last.tar.xz; fi
                # A unit kept already is not scored again: the arm's results.json stays at the most seeds scored
                # (the last unit's steps run whatever: they merge every kept seed and score all six).
                if [ -f "$out" ] && [ "$last" != 6 ]; then continue; fi
                # shellcheck disable=SC2086,SC2046  # the option strings split into words on purpose
                step "$WT" "noise pilot: $arm arm, seeds 1-$last" $COMMON $opts --seeds "$last" --train-only \
                    $(merged "$arm") &&
                    step "$WT" "noise pilot: $arm arm, scoring seeds 1-$last" $COMMON $opts --seeds "$last" \
                        --score-only &&
                    keep_runs "$RUNS" "$out" $(seq -f "study_pilot-$arm/runs/sinusoidal/seed%g" "$first" "$last") \
                        $(seq -f "study_pilot-$arm/runs/rope/seed%g" "$first" "$last") &&
                    echo "== $(date -Is) kept the $arm arm's seeds $unit in $KEEP (commit them)" ||
                    return 1
            done
        done
    }

    arms &&
        echo "== $(date -Is) pilot done"
}
main "$@"; exit $?
