#!/bin/sh
# Stands in for cuzk-daemon / curio in the entrypoint test: usage standin_daemon.sh NAME.
# Prints a line every 50 ms until stopped.
name=${1:?name}
echo "$name: started (pid $$)"
trap 'echo "$name: stopping on SIGTERM"; exit 0' TERM
n=0
while :; do
    n=$((n + 1))
    echo "$name: heartbeat $n"
    sleep 0.05
done
