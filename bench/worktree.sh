# Sourced by bench/study_queue.sh, bench/pilot_noise.sh and bench/study_sequential.sh (with ROOT set to this
# checkout): a study's commands run in the background, from a worktree pinned at one commit with a virtual environment of its own.

in_background() {  # in_background SCRIPT RUNS LOG WHAT [NICENESS]: unless this shell leads a session of its own,
    # SCRIPT RUNS again in one (setsid: no terminal's hangup stops it), its output appended to RUNS/LOG; then exit.
    # One at a time: the run holds RUNS/<LOG's name>.lock (flock; its children inherit it) until it and they end.
    local lock="$2/${3%.log}.lock"
    if [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ]; then  # (started in a session of its own: here, or by hand)
        mkdir -p "$2" || exit 1
        exec 9>> "$lock" && flock -n 9 && return 0
        echo "== $(date -Is) $4 is running already ($lock is held): not started twice"
        exit 1
    fi
    mkdir -p "$2" || exit 1
    if [ -f "$lock" ] && ! flock -n "$lock" true; then
        echo "$4 is running already ($lock is held): not started twice; log: $2/$3"
        exit 1
    fi
    setsid nice -n "${5:-0}" bash "$1" "$2" < /dev/null >> "$2/$3" 2>&1 &
    echo "$4 started in the background (pid $!); log: $2/$3"
    exit 0
}

worktree() {  # worktree DIR COMMIT [movable]: the pinned checkout, unchanged, and its virtual environment
    local dir=$1 commit=$2
    if [ ! -d "$dir" ]; then  # (prune: a worktree deleted by hand stays registered and would refuse the add)
        git -C "$ROOT" worktree prune && git -C "$ROOT" worktree add --detach "$dir" "$commit" || return 1
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
    # The pinned commit's own dependencies (its pyproject.toml, with its dev and export extras): an environment copied
    # from this checkout lacks those that only an older commit declares (datasets, until 2026-12-01). When every one
    # is there pip installs nothing, and looks nothing up (3 to 10 s on a 2-core machine).
    "$dir/.venv/bin/python" - "$dir/pyproject.toml" > "$dir/.venv/pinned-requirements.txt" <<'PY' || return 1
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project.get("optional-dependencies", {})
print("\n".join(project["dependencies"] + extras.get("dev", []) + extras.get("export", [])))
PY
    (cd "$dir" && .venv/bin/python -m pip install -q -c constraints.txt -r .venv/pinned-requirements.txt) || return 1
}

step() {  # step DIR WHAT ARGS...: one bench/study.py command in a worktree
    local dir=$1 what=$2
    shift 2
    echo "== $(date -Is) $what"
    (cd "$dir" && .venv/bin/python bench/study.py "$@")
}

keep_runs() {  # keep_runs RUNS OUT SEED_FOLDER...: the scored runs of these seed folders (paths inside RUNS), without
    # their weights (*.pt) and TensorBoard events (tb/: nothing scoring reads; the curves are in train.log), with the CPU that trained them (cpu.txt, unless a merged run brought its own)
    # and, where KEEP_PYTHON names the Python that trained them, its packages' versions (packages.txt: pip freeze), packed
    # into OUT (an xz tar to commit: what a study's report needs when the machine is gone); made once, whole or not at all
    local runs=$1 out=$2 folder
    shift 2
    [ -f "$out" ] && return 0
    for folder in "$@"; do
        if [ ! -d "$runs/$folder" ]; then
            echo "keep_runs: $runs/$folder: no such seed folder; nothing kept"
            return 1
        fi
    done
    for folder in "$@"; do
        if [ ! -s "$runs/$folder/cpu.txt" ]; then
            { lscpu | grep -E '^(Model name|Flags):' && echo "Host: $(hostname)" &&
                echo "Kept: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; } > "$runs/$folder/cpu.txt.partial" &&
                [ -s "$runs/$folder/cpu.txt.partial" ] && mv "$runs/$folder/cpu.txt.partial" "$runs/$folder/cpu.txt" ||
                { echo "keep_runs: lscpu did not say which CPU this is; nothing kept"; return 1; }
        fi
        if [ -n "${KEEP_PYTHON:-}" ] && [ ! -s "$runs/$folder/packages.txt" ]; then
            "$KEEP_PYTHON" -m pip freeze > "$runs/$folder/packages.txt.partial" &&
                [ -s "$runs/$folder/packages.txt.partial" ] &&
                mv "$runs/$folder/packages.txt.partial" "$runs/$folder/packages.txt" ||
                { echo "keep_runs: $KEEP_PYTHON -m pip freeze did not list its packages; nothing kept"; return 1; }
        fi
    done
    mkdir -p "$(dirname "$out")" &&
        tar -C "$runs" --exclude='*.pt' --exclude=train.lock --exclude=tb -cJf "$out.partial" "$@" &&
        tar -tJf "$out.partial" > /dev/null && sync "$out.partial" && mv "$out.partial" "$out"  # read back, on disk
}

restore_runs() {  # restore_runs INTO ARCHIVE...: unpack keep_runs's archives into INTO, a staging folder that
    # studies --merge from: each run whole as kept (a file an interrupted unpacking left half-written is written again)
    local into=$1 archive
    shift
    for archive in "$@"; do
        [ -f "$archive" ] || continue  # an unmatched glob: nothing kept yet
        mkdir -p "$into" && tar -C "$into" -xJf "$archive" || return 1
    done
}
