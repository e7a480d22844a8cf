#!/bin/sh
# Stands in for the proving-parameter fetch in the entrypoint test (the real one moves ~56 GiB).
echo "fetching v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher.params"
echo "fetched 3 of 3 parameter files (56.2 GiB) in 212 s"
exit "${STANDIN_PARAMS_EXIT:-0}"
