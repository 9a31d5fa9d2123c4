#!/bin/sh
# Runner command for a Runway runner group (runner.command): the
# orchestrator's bootstrap has exported GITEA_INSTANCE_URL,
# GITEA_RUNNER_REGISTRATION_TOKEN, GITEA_RUNNER_NAME, GITEA_RUNNER_LABELS.
# Registers an ephemeral gitea-runner (act_runner) and runs one job.
set -eu
bin=${GITEA_RUNNER_BIN:-gitea-runner}
work=${RUNWAY_VM_DIR:-$PWD}/runner
mkdir -p "$work" && cd "$work"
# gitea-runner only takes the token as an argument: it is visible in the
# VM's process list for the life of this one command.
"$bin" register --no-interactive --ephemeral \
  --instance "$GITEA_INSTANCE_URL" --token "$GITEA_RUNNER_REGISTRATION_TOKEN" \
  --name "$GITEA_RUNNER_NAME" --labels "$GITEA_RUNNER_LABELS"
unset GITEA_RUNNER_REGISTRATION_TOKEN RUNWAY_RUNNER_TOKEN
exec "$bin" daemon --once
