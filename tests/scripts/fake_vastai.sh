#!/bin/sh
# Stands in for the vast.ai CLI in tests: records its arguments, exits with $FAKE_VASTAI_EXIT.
echo "$@" >> "${FAKE_VASTAI_LOG:?}"
if [ "${FAKE_VASTAI_EXIT:-0}" != 0 ]; then
    echo "error: instance not found" >&2
fi
exit "${FAKE_VASTAI_EXIT:-0}"
