#!/usr/bin/env bash
# A GPU instance's whole lifecycle, every phase through fleetlog-agent so that none can fail
# silently and its evidence leaves the machine before anyone can destroy it:
#   registered -> parameter fetch (source setup) -> params_done
#   -> benchmark (benchout; daemon log as benchdaemon) -> bench_done + logs_complete
#   -> running: cuzk-daemon and curio supervised, their logs shipped as cuzk and curio.
# Its own lines go to stdout and, as source 'entrypoint', to the server (from registration to exit).
#
# Settings (environment):
#   FLEETLOG_SERVER            the fleetlog server, e.g. http://10.0.0.2:8080 (required)
#   FLEETLOG_INSTANCE_ID       default C.$CONTAINER_ID (vast.ai sets CONTAINER_ID)
#   FLEETLOG_ENROLL_TOKEN      the fleet's enrollment token, when the server has tokens on: the first
#                              agent registers with it and keeps the instance's own token (0600) in
#                              FLEETLOG_AGENT_TOKEN_FILE (default /var/tmp/fleetlog-agent.token) for all
#                              (and its enrollment key beside it, .key, so a resent registration gets
#                              the same token). Deploy side: the deployer declares FLEETLOG_INSTANCE_ID
#                              with the admin token (POST /api/v1/admin/instances, docs/agent.md) when it
#                              creates the instance; undeclared, its failures are never acted on
#   FLEETLOG_MACHINE_ID, FLEETLOG_HOST_ID, FLEETLOG_DPH, FLEETLOG_LOCATION   identity for 'registered'
#   FLEETLOG_GPU_MODEL, FLEETLOG_GPU_COUNT   the GPUs, when nvidia-smi cannot say (it is asked otherwise)
#   FLEETLOG_IMAGE_VERSION     the image's version (baked in at build time), sent as labels.image_version
#   FLEETLOG_STATE_DIR         the agents' state and spools (default /var/tmp/fleetlog)
#   FLEETLOG_PARAMS_CMD        parameter fetch (default /opt/proving/fetch-params.sh)
#   FLEETLOG_BENCH_CMD         the benchmark (default /opt/proving/benchmark.sh); gets BENCH_PROOFS
#   BENCH_PROOFS, BENCH_CONCURRENCY, BENCH_PARTITION_WORKERS   (12, 3, 16)
#   FLEETLOG_BENCH_DAEMON_LOG  the benchmark daemon's log (default /tmp/cuzk-bench-daemon.log), shipped as
#                              benchdaemon; exported for the benchmark
#   FLEETLOG_BENCH_RESULTS_LOG the benchmark's results log (default /tmp/cuzk-bench-results.log), shipped
#                              as benchresults; exported for the benchmark
#   FLEETLOG_DAEMON_CMD, FLEETLOG_CURIO_CMD   the proving stack (defaults cuzk-daemon, curio run);
#                              an empty FLEETLOG_CURIO_CMD runs no curio
#   FLEETLOG_LOG_DIR           where the daemons' logs go (default /var/log/proving)
#   FLEETLOG_RESTART_DELAY_S   wait before restarting a daemon that exited (default 5)
# Commands are split on spaces, not evaluated by a shell.
# Exit: the parameter fetch's or the benchmark's exit code when it fails (params_done carries the
# fetch's exit_code either way); 0 after SIGTERM once the daemons are stopped and their last lines shipped.
set -uo pipefail

: "${FLEETLOG_SERVER:?FLEETLOG_SERVER must name the fleetlog server}"
export FLEETLOG_SERVER
export FLEETLOG_INSTANCE_ID="${FLEETLOG_INSTANCE_ID:-C.${CONTAINER_ID:?set FLEETLOG_INSTANCE_ID or CONTAINER_ID}}"
state_dir="${FLEETLOG_STATE_DIR:-/var/tmp/fleetlog}"
log_dir="${FLEETLOG_LOG_DIR:-/var/log/proving}"
export FLEETLOG_BENCH_DAEMON_LOG="${FLEETLOG_BENCH_DAEMON_LOG:-/tmp/cuzk-bench-daemon.log}"
export FLEETLOG_BENCH_RESULTS_LOG="${FLEETLOG_BENCH_RESULTS_LOG:-/tmp/cuzk-bench-results.log}"
restart_delay_s="${FLEETLOG_RESTART_DELAY_S:-5}"
read -r -a params_cmd <<< "${FLEETLOG_PARAMS_CMD:-/opt/proving/fetch-params.sh}"
read -r -a bench_cmd <<< "${FLEETLOG_BENCH_CMD:-/opt/proving/benchmark.sh}"
read -r -a daemon_cmd <<< "${FLEETLOG_DAEMON_CMD:-cuzk-daemon}"
read -r -a curio_cmd <<< "${FLEETLOG_CURIO_CMD-curio run}"
proofs="${BENCH_PROOFS:-12}"
mkdir -p "$state_dir" "$log_dir"
self_log="$state_dir/entrypoint.log"
self_tail_pid=""

say() {
    local line
    line="[entrypoint] $(date -u +%H:%M:%S) $*"
    echo "$line"
    echo "$line" >> "$self_log"
}
# The parameter fetch has a spool of its own: a restarted agent adopts the unfinished run of its own
# spool, so after a restart (container or agent) the fetch never adopts the benchmark's run, and the
# benchmark's `run` adopts it and reports it, whatever the fetch did meanwhile.
agent() { fleetlog-agent "$1" --spool "$state_dir/main" "${@:2}"; }
catches_term() {  # PID: 0 once it catches SIGTERM (SigCgt bit 15), 2 once it is gone, else 1
    local key value caught=1
    [[ -r "/proc/$1/status" ]] || return 2
    while read -r key value _; do
        case "$key" in
            State:) [[ "$value" == Z ]] && return 2 ;;
            SigCgt:) (( 0x$value & 0x4000 )) && caught=0 ;;
        esac
    done < "/proc/$1/status"
    return "$caught"
}
stop_agent() {  # PID: SIGTERM once the agent has its handler, then wait for its last lines to leave.
    # Started a moment ago on a loaded machine, it may still be importing: a SIGTERM then kills it
    # unheard and what it tails dies with the container (at most a minute's wait).
    local tries=0
    while (( tries++ < 600 )); do
        catches_term "$1"
        (( $? == 1 )) || break
        sleep 0.1
    done
    kill -TERM "$1" 2>/dev/null
    wait "$1"
}
stop_self_tail() {  # on every exit: the entrypoint's last lines leave before it does
    [[ -n "$self_tail_pid" ]] || return 0
    stop_agent "$self_tail_pid"
    self_tail_pid=""
}
trap stop_self_tail EXIT

# 1. Registration: who this machine is. Spooled if the server cannot be reached yet.
identity=()
json_string() {  # the agent parses KEY=VALUE as JSON when it can: a name such as "4090" stays a string
    local s="${1//\\/\\\\}"
    printf '"%s"' "${s//\"/\\\"}"
}
for pair in machine_id="${FLEETLOG_MACHINE_ID:-}" host_id="${FLEETLOG_HOST_ID:-}" dph="${FLEETLOG_DPH:-}"; do
    [[ -n "${pair#*=}" ]] && identity+=("$pair")
done
[[ -n "${FLEETLOG_LOCATION:-}" ]] && identity+=("location=$(json_string "$FLEETLOG_LOCATION")")
gpu_model="${FLEETLOG_GPU_MODEL:-}"
gpu_count="${FLEETLOG_GPU_COUNT:-}"
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true)"
    if [[ -n "$gpus" ]]; then
        gpu_model="${gpu_model:-${gpus%%,*}}"
        gpu_count="${gpu_count:-$(grep -c . <<< "$gpus")}"
        driver="${gpus#*, }"
        identity+=("driver=${driver%%$'\n'*}")
    fi
fi
[[ -n "$gpu_model" ]] && identity+=("gpu_model=$(json_string "$gpu_model")")
[[ -n "$gpu_count" ]] && identity+=("gpu_count=$gpu_count")
[[ -n "${FLEETLOG_IMAGE_VERSION:-}" ]] && identity+=("labels={\"image_version\": $(json_string "$FLEETLOG_IMAGE_VERSION")}")
say "registering $FLEETLOG_INSTANCE_ID with $FLEETLOG_SERVER (image ${FLEETLOG_IMAGE_VERSION:-unversioned})"
agent event registered "${identity[@]}" || say "registration kept in the spool (server unreachable); going on"
# From here on the entrypoint's own lines (from the first) are a source of their own.
fleetlog-agent tail --spool "$state_dir/self" --gpu-interval-s 0 --tail "entrypoint=$self_log" &
self_tail_pid=$!

# 2. Parameter fetch, its output as source 'setup'; wrap sends params_done with its exit code either
#    way, with its last lines (a failed fetch's params_done is the failure the rules act on).
say "fetching proving parameters: ${params_cmd[*]}"
fleetlog-agent wrap --spool "$state_dir/params" --source setup --done-event params_done -- "${params_cmd[@]}"
rc=$?
if (( rc != 0 )); then
    say "parameter fetch failed (exit $rc)"
    exit "$rc"
fi

# 3. The benchmark: its output as benchout, the daemon's log as benchdaemon; bench_done and
#    logs_complete are sent only once every line is stored.
say "Starting benchmark: $proofs proofs, concurrency ${BENCH_CONCURRENCY:-3}, partition-workers ${BENCH_PARTITION_WORKERS:-16}"
agent run --no-register --tail "benchdaemon=$FLEETLOG_BENCH_DAEMON_LOG" --tail "benchresults=$FLEETLOG_BENCH_RESULTS_LOG" \
    --proofs "$proofs" --concurrency "${BENCH_CONCURRENCY:-3}" --partition-workers "${BENCH_PARTITION_WORKERS:-16}" \
    -- "${bench_cmd[@]}" "$proofs"
rc=$?
if (( rc != 0 )); then
    say "benchmark.sh exited with error (exit $rc); its evidence is stored, the fleet's rules decide"
    exit "$rc"
fi
say "benchmark done"

# 4. The proving stack under a supervisor loop; a tail agent ships its logs until we stop.
cuzk_log="$log_dir/cuzk.log"
curio_log="$log_dir/curio.log"
touch "$cuzk_log" "$curio_log"
fleetlog-agent tail --spool "$state_dir/tail" --tail "cuzk=$cuzk_log" --tail "curio=$curio_log" &
tail_pid=$!
stopping=0
children=()

supervise() {  # NAME LOG CMD...: restart CMD whenever it exits, until we stop
    local name="$1" log="$2"
    shift 2
    local child=""
    trap 'stopping=1; [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null' TERM INT
    while (( ! stopping )); do
        "$@" >> "$log" 2>&1 &
        child=$!
        wait "$child"
        local code=$?
        (( stopping )) && break
        echo "[entrypoint] $(date -u +%H:%M:%S) $name exited with $code; restarting in ${restart_delay_s}s" >> "$log"
        sleep "$restart_delay_s" &
        wait $!
    done
    [[ -n "$child" ]] && wait "$child" 2>/dev/null
}

shutdown() {
    say "stopping: daemons first, then the log shipper"
    if (( ${#children[@]} )); then  # a bare wait would wait for the log shipper too
        kill -TERM "${children[@]}" 2>/dev/null
        wait "${children[@]}" 2>/dev/null
    fi
    stop_agent "$tail_pid"
    exit 0
}
trap shutdown TERM INT  # before 'running': a stop may come as soon as the server knows
supervise cuzk "$cuzk_log" "${daemon_cmd[@]}" &
children+=($!)
if (( ${#curio_cmd[@]} )); then
    supervise curio "$curio_log" "${curio_cmd[@]}" &
    children+=($!)
fi
agent event running || say "'running' kept in the spool"
say "proving stack running (cuzk-daemon${curio_cmd[*]:+, curio})"
wait "${children[@]}"
