# Steps for .ci/run: each with a name, its own time limit, its wall and CPU time recorded; lanes that run in the
# background beside the steps; one deadline for the whole run; a table of every step's times at the end.
#
#   ci_step NAME LIMIT FUNCTION      run FUNCTION now, in a subshell; stop it (and everything it started) after
#                                    LIMIT seconds, saying so with NAME
#   ci_lane NAME LIMIT FUNCTION      the same in the background: its output goes to a log, printed by ci_join
#   ci_join NAME                     wait for a lane, print its output, fail if it failed
#   ci_deadline SECONDS              stop the whole run after SECONDS, naming the steps it was in
#   ci_table                         print every step's start, wall time, CPU time and status
#
# CPU time is the user + system time of the step's processes that ended and were waited for (bash's `times`):
# it says how much of the two CPUs a step needs, which is what decides what can run beside it.

ci_dir=$(mktemp -d)
mkdir -p "$ci_dir/running"
ci_t0=$(date +%s)

# Every descendant of process $1, deepest first.
ci_descendants() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do
        ci_descendants "$child"
        echo "$child"
    done
}

# Stops process $1 and everything under it, whatever process group each is in (timeout(1) makes its own, so a
# group signal would miss what runs under a nested timeout): TERM, then KILL what is left after 10 s.
ci_kill_tree() {
    local pids signal
    for signal in TERM KILL; do
        pids=$(
            ci_descendants "$1"
            echo "$1"
        )
        # shellcheck disable=SC2086
        kill -s "$signal" $pids 2>/dev/null || true
        [[ $signal == KILL ]] || sleep 10
    done
}

# Seconds as "12m34s".
ci_clock() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# The children's user + system time from `times` output (its second line), in whole seconds.
ci_cpu_seconds() {
    awk 'NR == 2 {
        n = split($0, f, " ")
        total = 0
        for (i = 1; i <= n; i++) { split(f[i], ms, "m"); sub("s", "", ms[2]); total += ms[1] * 60 + ms[2] }
        printf "%d", total
    }' "$1" 2>/dev/null || echo 0
}

# A step's name as a file name.
ci_key() { echo "${1//[^A-Za-z0-9]/_}"; }

ci_run() {
    local name=$1 limit=$2 fn=$3 start status=0 watchdog pid key
    key=$(ci_key "$name")
    start=$(date +%s)
    echo "$name" >"$ci_dir/running/$key"
    # A bash of its own, not a subshell: a subshell started inside `ci_run ... || ...` would run with errexit
    # off whatever it sets, and a failing command in the step would go unnoticed.
    bash -c "set -euo pipefail; $(declare -f); trap 'times >\"$ci_dir/$key.times\"' EXIT; $fn" &
    pid=$!
    (
        sleep "$limit"
        echo "== CI: step '$name' passed its limit of $(ci_clock "$limit"): stopped"
        touch "$ci_dir/$key.timedout"
        ci_kill_tree "$pid"
    ) &
    watchdog=$!
    wait "$pid" || status=$?
    # The watchdog first (killed while it sleeps, it never reaches its message), then its sleep.
    local sleeper
    sleeper=$(pgrep -P "$watchdog" 2>/dev/null || true)
    kill "$watchdog" 2>/dev/null || true
    # shellcheck disable=SC2086
    [[ -z $sleeper ]] || kill $sleeper 2>/dev/null || true
    wait "$watchdog" 2>/dev/null || true
    [[ -e $ci_dir/$key.timedout ]] && status=timeout
    rm -f "$ci_dir/running/$key"
    echo "$name|$((start - ci_t0))|$(($(date +%s) - start))|$(ci_cpu_seconds "$ci_dir/$key.times")|$status" \
        >>"$ci_dir/table"
    [[ $status == 0 ]]
}

ci_step() {
    echo "== $1 (limit $(ci_clock "$2"))"
    ci_run "$@" || {
        echo "== CI failed in step '$1'"
        exit 1
    }
}

ci_lane() {
    echo "== $1: started in the background (limit $(ci_clock "$2"))"
    local key
    key=$(ci_key "$1")
    ci_run "$@" >"$ci_dir/$key.log" 2>&1 &
    echo $! >"$ci_dir/$key.pid"
}

ci_join() {
    local status=0 key
    key=$(ci_key "$1")
    wait "$(cat "$ci_dir/$key.pid")" || status=$?
    touch "$ci_dir/$key.joined"
    echo "== $1 (ran in the background):"
    sed 's/^/   /' "$ci_dir/$key.log"
    [[ $status == 0 ]] || {
        echo "== CI failed in step '$1'"
        exit 1
    }
}

ci_deadline() {
    local main=$$
    (
        sleep "$1"
        echo "== CI: the whole run passed its deadline of $(ci_clock "$1"), in: $(cat "$ci_dir"/running/* | paste -sd ';')"
        touch "$ci_dir/deadline"
        for pid in $(ci_descendants "$main"); do
            [[ $pid == "$BASHPID" ]] || kill -TERM "$pid" 2>/dev/null || true
        done
        kill -TERM "$main" 2>/dev/null || true
    ) &
}

# At the end of the run, passed or not: the table, and nothing left running (a lane still busy when a step failed).
ci_finish() {
    local status=$? pid signal
    for signal in TERM KILL; do
        for pid in $(ci_descendants $$); do
            [[ $pid == "$BASHPID" ]] || kill -s "$signal" "$pid" 2>/dev/null || true
        done
        [[ $signal == KILL ]] || [[ -z $(pgrep -P $$) ]] || sleep 5
    done
    if compgen -G "$ci_dir/running/*" >/dev/null; then
        echo "== stopped unfinished: $(cat "$ci_dir"/running/* | paste -sd ';')"
    fi
    # The end of each lane's output that was not printed by ci_join (a lane still running, or the run failed).
    local log
    for log in "$ci_dir"/*.log; do
        [[ -e $log && ! -e ${log%.log}.joined ]] || continue
        echo "== the last lines of a lane that was not joined ($(basename "$log" .log)):"
        tail -20 "$log" | sed 's/^/   /'
    done
    ci_table
    rm -rf "$ci_dir"
    exit "$status"
}

ci_table() {
    local total=$(($(date +%s) - ci_t0))
    echo
    echo "== step times (wall from the start of the run; CPU = user + system of the step's processes)"
    printf '%-44s %9s %9s %9s  %s\n' step start wall cpu status
    local name start wall cpu status
    while IFS='|' read -r name start wall cpu status; do
        printf '%-44s %9s %9s %9s  %s\n' "$name" "$(ci_clock "$start")" "$(ci_clock "$wall")" "$(ci_clock "$cpu")" \
            "$status"
    done <"$ci_dir/table"
    printf '%-44s %9s %9s\n' "whole run" "" "$(ci_clock "$total")"
}
