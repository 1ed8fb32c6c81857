#!/usr/bin/env bash
# test.sh — the one command that sets up a fresh machine and runs every test.
#
#   scripts/test.sh
#
# 1. installs the test clients (scripts/install-test-deps.sh: kcat, confluent-kafka,
#    kafka-python, pytest, the Java client and Kafka's CLI classes, franz-go);
# 2. builds ferrolog in release mode (the binary the end-to-end tests start);
# 3. checks formatting and lints (warnings are errors);
# 4. runs the Rust unit and property tests (cargo test);
# 5. runs the end-to-end tests with real clients against real broker processes (pytest);
# 6. runs a few of them again against a broker built with AddressSanitizer (scripts/asan.sh;
#    skipped, and said so, where there is no nightly Rust toolchain).
#
# Set FERROLOG_TARGET=apache to run step 5 against Apache Kafka 4.1 instead (fetched by
# scripts/fetch-apache-kafka.sh), which is how the end-to-end tests are validated.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
step() { printf '\n==== %s\n' "$*"; }

step "installing test dependencies"
scripts/install-test-deps.sh
if [ "${FERROLOG_TARGET:-ferrolog}" = apache ]; then
    scripts/fetch-apache-kafka.sh
fi

step "building ferrolog (release)"
cargo build --release --workspace --locked

step "rustfmt and clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

step "end-to-end tests (pytest)"
python3 -m pytest tests/ -v

if [ "${FERROLOG_TARGET:-ferrolog}" = ferrolog ]; then
    step "end-to-end tests against an AddressSanitizer build (scripts/asan.sh)"
    scripts/asan.sh
fi
