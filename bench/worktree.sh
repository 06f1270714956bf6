# Sourced by bench/study_queue.sh and bench/pilot_noise.sh (with ROOT set to this checkout): a study's commands run
# from a worktree pinned at one commit, with a virtual environment of its own.

worktree() {  # worktree DIR COMMIT [movable]: the pinned checkout, unchanged, and its virtual environment
    local dir=$1 commit=$2
    if [ ! -d "$dir" ]; then
        git -C "$ROOT" worktree add --detach "$dir" "$commit" || return 1
    elif [ "${3:-}" = movable ] && [ -z "$(git -C "$dir" status --porcelain --untracked-files=no)" ]; then
        git -C "$dir" checkout -q --detach "$commit" || return 1  # reads only: a newer pin may replace it
    fi
    if [ "$(git -C "$dir" rev-parse HEAD)" != "$(git -C "$ROOT" rev-parse "$commit^{commit}")" ] ||
        [ -n "$(git -C "$dir" status --porcelain --untracked-files=no)" ]; then
        echo "$dir is not commit $commit unchanged: refusing to run the study from it"
        return 1
    fi
    if ! "$dir/.venv/bin/python" -c "import torch, ignite, sacrebleu, tokenizers" 2>/dev/null; then
        rm -rf "$dir/.venv"  # missing, or left half-made by an interrupted install
        if "$ROOT/.venv/bin/python" -c "import torch, ignite, sacrebleu, tokenizers" 2>/dev/null; then
            cp -a "$ROOT/.venv" "$dir/.venv" || return 1
        else
            (cd "$dir" && python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt ".[dev,export]") || return 1
        fi
    fi
}

step() {  # step DIR WHAT ARGS...: one bench/study.py command in a worktree
    local dir=$1 what=$2
    shift 2
    echo "== $(date -Is) $what"
    (cd "$dir" && .venv/bin/python bench/study.py "$@")
}
