#!/usr/bin/env bash
# A longer campaign of faults at random moments (the test `chaos` with more trials).
#   ./scripts/chaos.sh 200            # 200 trials, a fresh seed (printed)
#   EVB_CHAOS_SEED=1234 ./scripts/chaos.sh 200   # replay a campaign
#   EVB_CHAOS_SEED=1234 EVB_CHAOS_FROM=600 ./scripts/chaos.sh 1000   # its trials 600..999
#   EVB_CHAOS_STANDBY=1 ./scripts/chaos.sh 100    # only the EVM's loss with a standby
# Each trial: a random fault (kill/freeze a BU, an RU under both policies, the EVM with or
# without a standby, two BUs,
# one RU->BU data link cut, or none) at a random moment, over tcp or shm, through `evb run`
# or separate `evb node` processes, with the file sink; see crates/cli/tests/chaos.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
export EVB_CHAOS_TRIALS="${1:-100}"
exec cargo test -p evb --test chaos -- --nocapture
