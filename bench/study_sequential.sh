#!/usr/bin/env bash
# The second extrapolation study, look by look (the documentation's studies: "Pre-registration: the second
# extrapolation study", and its amendments). It starts once its noise pilot (bench/pilot_noise.sh) is scored and the
# design the pre-registered rule gives (bench/pilot_design.py -> bench/studies/extrapolation-sequential/design.json
# and family.json, committed together, in one commit) is committed; without that commit it refuses to start.
#
# - One commit trains, decodes and scores every run: the one that committed design.json, in a worktree pinned at it
#   (../sequential-score-wt). Before its first run, bench/same_training.py checks that it trains the study's five
#   systems, with the design's keys, bit for bit as the pilot's commit 7186bb6 does (../pilot-wt); the check is kept
#   in records/same_training.json (to be committed), and if they differ the study does not start.
# - Runs two at a time, one thread each, in a queue: seed 1's five systems, then seed 2's, and so on (a pair may
#   span two seeds: no core waits). Each pair is trained (--train-only --only), then decoded (--decode-only --only:
#   every decoder, split, test-time variant and length floor, and the attention statistics), then each of its runs
#   kept without its weights, one archive per run in bench/studies/extrapolation-sequential/records/, to be
#   committed. A machine replaced between sessions loses at most the pair it was training: on the next, the kept
#   runs are unpacked and merged (--merge), not trained again.
# - Each look, once every run of its seeds is kept and committed in this checkout (it waits for that commit, and
#   says once in the log that it waits): scored from the records
#   (--family family.json, beam 5, greedy and the length-controlled decoding, 10,000 bootstrap resamples); its
#   results.json, report.md, figures, hypotheses and tb are copied to
#   bench/studies/extrapolation-sequential/looks/look-K, to be committed.
# - After the first look, the natural-length arm (seeds 1-3), in the same queue and scored the same way
#   (looks/natural), and the two arms side by side (bench/arms_table.py look-1 natural: looks/natural/arms.md).
# - After each look, bench/study_stop.py, its answer kept as looks/look-K/stop.txt: the study stops at the first look
#   at which every primary test is resolved or futile, and otherwise at its last planned look. Its costs count the
#   noise pilot's two arms too (--also, from their committed records in bench/studies/noise-pilot/records/).
#
#   bash bench/study_sequential.sh [RUNS_DIR]   # default ../sequential-runs; returns at once, log: RUNS_DIR/queue.log
#
# Resumable: run it again after any interruption, on this machine or another; each step skips what is done.
# To stop it (before a session ends): kill -TERM -- -PGID, PGID the queue's process group (it runs in a session of
# its own: ps -eo pgid,args | grep study_sequential): each training finishes its step and saves last.pt, and an
# archive or score file left half-written is written again on the next start.
set -u
# The whole script is one function, read before it runs: an edit to this file while it runs cannot change it.
main() {
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    RUNS=$(realpath -m "${1:-$ROOT/../sequential-runs}")
    STUDY_DIR=bench/studies/extrapolation-sequential
    KEEP=$ROOT/$STUDY_DIR/records  # committed: every decoded run without its weights
    LOOKS_DIR=$ROOT/$STUDY_DIR/looks  # committed: each look as published
    PILOT_KEEP=$ROOT/bench/studies/noise-pilot/records  # the pilot's kept runs: their cost joins the study's
    PILOT_COMMIT=7186bb6  # the pilot's: the study's commit must train as it does
    # The commit that fixed the design (the first to add design.json): it trains, decodes and scores every run. A
    # shallow clone's history ends early, and its oldest commit would seem to add design.json: refuse it.
    if [ "$(git -C "$ROOT" rev-parse --is-shallow-repository)" = true ]; then
        echo "this clone is shallow, so the commit that fixed the design cannot be found: run" \
            "git -C $ROOT fetch --unshallow, then start this again"
        return 1
    fi
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
    # The procedure is this script's and worktree.sh's as that commit has them: a later change to either runs only
    # once a dated amendment declares it, committed after the design's commit, and named by AMENDED_DRIVER=<its
    # date>: the latest amendment (the last heading of amendments.md as committed), which that commit did not have.
    if ! git -C "$ROOT" diff --quiet "$SCORE_COMMIT" -- bench/study_sequential.sh bench/worktree.sh; then
        local fixed latest
        fixed=$(git -C "$ROOT" log -1 --format=%cs "$SCORE_COMMIT")
        latest=$(git -C "$ROOT" show "HEAD:$STUDY_DIR/amendments.md" 2> /dev/null | grep '^### ' | tail -n 1)
        if [ -z "${AMENDED_DRIVER:-}" ] || [[ "$latest" != "### ${AMENDED_DRIVER} "* ]] ||
            git -C "$ROOT" show "$SCORE_COMMIT:$STUDY_DIR/amendments.md" 2> /dev/null | grep -qxF -- "$latest"; then
            echo "bench/study_sequential.sh or bench/worktree.sh differs from the commit that fixed the design" \
                "($SCORE_COMMIT, $fixed): declare the change in a dated amendment committed after it, and run with" \
                "AMENDED_DRIVER=<the latest amendment's date>, or restore them as that commit has them"
            return 1
        fi
    fi
    # shellcheck source=bench/worktree.sh
    source "$ROOT/bench/worktree.sh"  # in_background, worktree DIR COMMIT, step DIR WHAT ARGS..., keep_runs, restore_runs
    in_background "$0" "$RUNS" queue.log "sequential study" 10
    mkdir -p "$RUNS" && exec >> "$RUNS/queue.log" 2>&1 < /dev/null || return 1
    export CUDA_VISIBLE_DEVICES=""  # every run on the CPU, as declared, on a machine with a GPU too
    PILOT_WT=$(realpath -m "$ROOT/../pilot-wt")
    SCORE_WT=$(realpath -m "$ROOT/../sequential-score-wt")
    worktree "$PILOT_WT" "$PILOT_COMMIT" && worktree "$SCORE_WT" "$SCORE_COMMIT" || return 1
    KEEP_PYTHON="$SCORE_WT/.venv/bin/python"  # keep_runs records the packages of the Python that trains the runs

    design() {  # design arm|sets|looks: what the committed design.json decided
        "$SCORE_WT/.venv/bin/python" - "$SCORE_WT/$STUDY_DIR/design.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print({"arm": d["arm"], "sets": " ".join(f"--set {o}" for o in d["overrides"]),
       "looks": " ".join(map(str, d["looks"]))}[sys.argv[2]])
PY
    }

    kept() {  # kept STUDY LOOK: a scored look's files, copied whole (a look's folder is complete or absent: one
        # without results.json, from an interrupted copy by hand, is replaced)
        rm -rf "$2.partial" && mkdir -p "$2.partial" &&
            cp -a "$1/results.json" "$1/report.md" "$1/figures" "$1/hypotheses" "$1/tb" "$2.partial/" &&
            rm -rf "$2" && mv -T "$2.partial" "$2"
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

    record() {  # record ARM SYSTEM SEED: the archive that keeps one run
        echo "$KEEP/$1.$2.seed$3.tar.xz"
    }

    pending() {  # pending ARM SEEDS: the arm's runs of seeds 1..SEEDS not kept yet, SYSTEM:SEED in queue order
        local seed system
        for seed in $(seq 1 "$2"); do
            for system in $SYSTEMS; do
                [ -f "$(record "$1" "$system" "$seed")" ] || echo "$system:$seed"
            done
        done
    }

    runs() {  # runs ARM SEEDS: every run of the arm's seeds 1..SEEDS trained, decoded and kept, two at a time
        local todo pair item
        # shellcheck disable=SC2207  # one word per run
        todo=($(pending "$1" "$2"))
        while [ "${#todo[@]}" -gt 0 ]; do
            pair=$(IFS=,; echo "${todo[*]:0:2}")
            # shellcheck disable=SC2086,SC2046  # the option strings split into words on purpose
            step "$SCORE_WT" "$1 arm, $pair: training" $(arm "$1") --seeds "$2" --train-only --only "$pair" \
                $(merged "$1") &&
                step "$SCORE_WT" "$1 arm, $pair: decoding" $(arm "$1") $(decoding "$1") --seeds "$2" --decode-only \
                    --only "$pair" $(merged "$1") || return 1
            for item in "${todo[@]:0:2}"; do
                keep_runs "$RUNS" "$(record "$1" "${item%:*}" "${item#*:}")" \
                    "$(folder "$1")/runs/${item%:*}/seed${item#*:}" &&
                    echo "== $(date -Is) kept the $1 arm's ${item%:*} seed ${item#*:} in $KEEP (commit it)" || return 1
            done
            todo=("${todo[@]:2}")
        done
    }

    same_training() {  # the study's commit trains as the pilot's does: checked once (the warmup shortened so that
        # 30 steps cover the warmup, the inverse-square-root decay and the cool-down), kept in records/ to be committed
        local out=$KEEP/same_training.json rc
        if [ -f "$out" ]; then  # a check made before: of these two commits, and every system identical
            # shellcheck disable=SC2086  # the arm's --set options, word by word
            "$SCORE_WT/.venv/bin/python" - "$out" "$PILOT_COMMIT" "$SCORE_COMMIT" "$SYSTEMS" $SETS <<'PY' && return 0
import json, sys
d = json.load(open(sys.argv[1]))
same = lambda a, b: a.startswith(b) or b.startswith(a)  # short hashes of either length
sets = [w for w in sys.argv[5:] if w != "--set"] + ["train.warmup_tokens=35000", "train.valid_bleu_sentences=16"]
ok = (len(d["commits"]) == 2 and same(d["commits"][0], sys.argv[2]) and same(d["commits"][1], sys.argv[3])
      and [r["system"] for r in d["rows"]] == sys.argv[4].split() and all(r["identical"] for r in d["rows"])
      and d.get("steps") == 30 and d.get("eval_every") == 10 and d.get("sets") == sets)
sys.exit(0 if ok else 1)
PY
            echo "== $(date -Is) $out is not this study's check (30 steps, its arm's keys and the shortened warmup)" \
                "of $SCORE_COMMIT against $PILOT_COMMIT with every system identical: the study does not start"
            return 1
        fi
        echo "== $(date -Is) checking that $SCORE_COMMIT trains the study's systems as $PILOT_COMMIT does"
        # shellcheck disable=SC2086  # the option string splits into words on purpose
        (cd "$SCORE_WT" && .venv/bin/python bench/same_training.py "$PILOT_WT" . --preset train-short-test-long \
            --variants "${SYSTEMS// /,}" --steps 30 --eval-every 10 $SETS --set train.warmup_tokens=35000 \
            --set train.valid_bleu_sentences=16 --out "$out.partial")
        rc=$?
        if [ "$rc" = 0 ] && mv "$out.partial" "$out"; then
            echo "== $(date -Is) $SCORE_COMMIT trains as $PILOT_COMMIT does: $out (commit it)"
            return 0
        elif [ "$rc" = 3 ]; then
            echo "== $(date -Is) $SCORE_COMMIT does not train as $PILOT_COMMIT does ($out.partial): the study does" \
                "not start"
        else
            echo "== $(date -Is) the check that $SCORE_COMMIT trains as $PILOT_COMMIT does failed (exit $rc):" \
                "the study does not start"
        fi
        return 1
    }

    recorded() {  # recorded ARM SEEDS: once every run of the arm's seeds is committed as kept (tracked, unchanged):
        # a look is scored from committed records only, so that a later look on another machine merges the same runs
        local seed system record waiting=""
        for seed in $(seq 1 "$2"); do
            for system in $SYSTEMS; do
                record=$(record "$1" "$system" "$seed")
                until git -C "$ROOT" ls-files --error-unmatch -- "$record" > /dev/null 2>&1 &&
                    git -C "$ROOT" diff --quiet HEAD -- "$record"; do
                    if [ -z "$waiting" ]; then
                        echo "== $(date -Is) waiting for $record to be committed (a look is scored from committed" \
                            "records)"
                        waiting=1
                    fi
                    sleep "${RECORD_POLL:-60}"
                done
            done
        done
    }

    beside() {  # the natural arm beside the short one at look 1 (bench/arms_table.py), kept as looks/natural/arms.md
        local out=$LOOKS_DIR/natural/arms.md
        [ -f "$out" ] && return 0
        (cd "$SCORE_WT" && .venv/bin/python bench/arms_table.py "$LOOKS_DIR/look-1" "$LOOKS_DIR/natural") \
            > "$out.partial" && mv "$out.partial" "$out"
    }

    pilot_also() {  # the --also options of the pilot's arms whose kept runs were unpacked
        local arm
        for arm in cool plain; do
            if [ -d "$RUNS/pilot-kept/study_pilot-$arm" ]; then echo "--also $RUNS/pilot-kept/study_pilot-$arm"; fi
        done
    }

    look() {  # look ARM SEEDS NAME: every run of the arm's seeds, then the look scored and kept as NAME
        runs "$1" "$2" && recorded "$1" "$2" || return 1
        # shellcheck disable=SC2086,SC2046
        step "$SCORE_WT" "$3: scoring at $2 seeds per system" $(arm "$1") $(decoding "$1") --seeds "$2" $SCORING \
            $(merged "$1") && kept "$RUNS/$(folder "$1")" "$LOOKS_DIR/$3"
    }

    looks() {  # every look in turn, the natural-length arm after the first, until the stopping rule says stop
        local k=0 n verdict taken=()
        same_training && restore_runs "$RUNS/kept" "$KEEP"/*.tar.xz &&
            restore_runs "$RUNS/pilot-kept" "$PILOT_KEEP"/*.tar.xz || return 1
        for n in $LOOKS; do
            k=$((k + 1))
            if [ ! -f "$LOOKS_DIR/look-$k/results.json" ]; then
                look short "$n" "look-$k" || return 1
            fi
            taken+=("$LOOKS_DIR/look-$k")
            if [ "$k" = 1 ]; then
                if [ ! -f "$LOOKS_DIR/natural/results.json" ]; then
                    look natural 3 natural || return 1
                fi
                beside || return 1
            fi
            # shellcheck disable=SC2046  # one word per option
            verdict=$(cd "$SCORE_WT" && .venv/bin/python bench/study_stop.py "${taken[@]}" $(pilot_also)) || return 1
            echo "$verdict" > "$LOOKS_DIR/look-$k/stop.txt.partial" &&
                mv "$LOOKS_DIR/look-$k/stop.txt.partial" "$LOOKS_DIR/look-$k/stop.txt" || return 1
            echo "== $(date -Is) after look $k: the stopping rule (looks/look-$k/stop.txt, to be committed)"
            echo "$verdict"
            case $verdict in
                stop:*) return 0 ;;
            esac
        done
    }

    ARM=$(design arm) && SETS=$(design sets) && LOOKS=$(design looks) || return 1
    echo "== $(date -Is) sequential study: the $ARM arm (${SETS:-no --set}), looks at $LOOKS seeds per system;" \
        "scored by $SCORE_COMMIT"
    SYSTEMS="sinusoidal learnable alibi t5 rope"  # the preset's order, the queue's within a seed
    COMMON="--steps 900 --eval-every 300 --checkpoint last --runs $RUNS --jobs 2 --no-link $SETS"
    SHORT="--preset train-short-test-long --name extrapolation-sequential --variants ${SYSTEMS// /,} $COMMON"
    NATURAL="--preset train-natural-test-long --name extrapolation-sequential-natural --variants ${SYSTEMS// /,}
        $COMMON"
    SCORING="--score-only --bootstrap 10000"
    looks &&
        echo "== $(date -Is) sequential study done"
}
main "$@"; exit $?
