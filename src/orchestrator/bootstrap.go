package orchestrator

import (
	"sort"
	"strings"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// bootstrap is the user-data script a runner VM runs: it exports what the
// runner needs and execs the group's runner command. The registration
// secret travels in this script only — through bin/cpi's stdin, into the
// VM's user data — so it is in no process list (environment, not argv) and,
// as `user_data`, redacted from every CPI log and hook.
//
// Both Runway's names and the forge's own are set: RUNWAY_RUNNER_* for a
// bootstrap of your own; GITEA_* as the gitea-runner image reads them;
// FORGEJO_* for a Forgejo runner registered by the REST API;
// ACTIONS_RUNNER_INPUT_JITCONFIG as the GitHub runner reads --jitconfig.
func bootstrap(g config.GroupConfig, f config.ForgeConfig, name string, reg forge.Registration) string {
	labels := strings.Join(g.Labels, ",")
	env := map[string]string{
		"RUNWAY_RUNNER_NAME":   name,
		"RUNWAY_RUNNER_GROUP":  g.Name,
		"RUNWAY_RUNNER_LABELS": labels,
		"RUNWAY_RUNNER_URL":    f.RunnerURL,
		"RUNWAY_FORGE_TYPE":    f.Type,
	}
	switch {
	case reg.JITConfig != "":
		env["RUNWAY_RUNNER_JITCONFIG"] = reg.JITConfig
		env["ACTIONS_RUNNER_INPUT_JITCONFIG"] = reg.JITConfig
	case f.Type == "forgejo":
		// Registered already: forgejo-runner's .runner file is made from
		// these (docs/orchestrator.md).
		env["RUNWAY_RUNNER_TOKEN"] = reg.Token
		env["RUNWAY_RUNNER_UUID"] = reg.UUID
		env["FORGEJO_INSTANCE_URL"] = f.RunnerURL
		env["FORGEJO_RUNNER_UUID"] = reg.UUID
		env["FORGEJO_RUNNER_TOKEN"] = reg.Token
		env["FORGEJO_RUNNER_NAME"] = name
		env["FORGEJO_RUNNER_LABELS"] = labels
	case f.Type == "gitea":
		env["RUNWAY_RUNNER_TOKEN"] = reg.Token
		env["GITEA_INSTANCE_URL"] = f.RunnerURL
		env["GITEA_RUNNER_REGISTRATION_TOKEN"] = reg.Token
		env["GITEA_RUNNER_NAME"] = name
		env["GITEA_RUNNER_LABELS"] = labels
		env["GITEA_RUNNER_EPHEMERAL"] = "true"
	default:
		env["RUNWAY_RUNNER_TOKEN"] = reg.Token
	}
	for k, v := range g.Runner.Env {
		if _, ours := env[k]; !ours {
			env[k] = v
		}
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Runway runner bootstrap: " + name + " (group " + g.Name + ")\nset -e\n")
	for _, k := range keys {
		b.WriteString("export " + k + "=" + shellQuote(env[k]) + "\n")
	}
	b.WriteString("exec " + shellQuote(g.Runner.Command))
	for _, a := range g.Runner.Args {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\n")
	return b.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}
