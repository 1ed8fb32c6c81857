#!/usr/bin/env bash
# simulate.sh — runs the deterministic simulator (ferrolog-sim) for as long as asked.
#
#   scripts/simulate.sh --seeds 100
#   scripts/simulate.sh --minutes 30
#   scripts/simulate.sh --seed 42 --keep 3,7      # replays a printed reproduction
#
# Every option is ferrolog-sim's (scripts/simulate.sh --help lists them). Exits 1 if a
# seed failed; each failure is printed shrunk, with the command that replays it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p ferrolog --bin ferrolog-sim >&2
exec target/release/ferrolog-sim "$@"
