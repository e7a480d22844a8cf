#!/bin/sh
# A daemon whose log is rotated while it writes, ROTATIONS times, every K lines.
#   rename:       mv LOG LOG.1, a few more lines to the old file, then reopen (logrotate create + SIGHUP)
#   copytruncate: cp LOG LOG.1, then truncate LOG in place; the writer keeps its O_APPEND descriptor
# Every line is also written to LOG.truth, which is never rotated.
# usage: daemon_rotating.sh LOG rename|copytruncate ROTATIONS K
log=${1:?log} mode=${2:?mode} rotations=${3:?rotations} k=${4:?lines per rotation}
exec 3>>"$log"
n=0
r=0
line() { echo "$1" >&3; echo "$1" >> "$log.truth"; }
while [ "$r" -le "$rotations" ]; do
    j=0
    while [ "$j" -lt "$k" ]; do
        n=$((n + 1)); line "cuzk line $n rotation $r"; j=$((j + 1))
    done
    [ "$r" -eq "$rotations" ] && break
    sleep 0.25  # rotations are minutes apart in life; the agent polls every 20 ms here
    if [ "$mode" = rename ]; then
        mv "$log" "$log.1"
        n=$((n + 1)); line "cuzk line $n written to the renamed file"
        exec 3>>"$log"
    else
        cp "$log" "$log.1"
        : > "$log"
    fi
    sleep 0.25
    r=$((r + 1))
done
printf 'last line without a newline %s' "$n" >&3
printf 'last line without a newline %s\n' "$n" >> "$log.truth"
echo "Throughput: 1 proofs/hour"
