#!/bin/sh
# The fleet simulation's actuator (tests/fleetsim.py): usage sim_actuator.sh DIR ACTION SUBJECT.
# Records when it ran (its own clock) and, for a destroy, kills the instance the way the cloud does:
# every process of its entrypoint's group, at once.
dir=${1:?dir}
echo "$(date +%s.%N) $2 $3" >> "$dir/actuator.log"
if [ "$2" = destroy ] && [ -f "$dir/$3.pgid" ]; then
    kill -9 "-$(cat "$dir/$3.pgid")" 2>/dev/null
fi
exit 0
