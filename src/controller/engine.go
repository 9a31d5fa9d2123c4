package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// NewEngine adapts the orchestrator to what the controller needs of it.
// newForge builds a forge's client for Check (cmd/runway's: the
// controller knows no forge library).
func NewEngine(o *orchestrator.Orchestrator, newForge func(config.ForgeConfig) (orchestrator.Forge, error),
	redact *logging.Redactor, log logging.Fields) Engine {
	return engine{o, newForge, redact, log}
}

type engine struct {
	o        *orchestrator.Orchestrator
	newForge func(config.ForgeConfig) (orchestrator.Forge, error)
	redact   *logging.Redactor
	log      logging.Fields
}

func (e engine) Replace(forges []config.ForgeConfig, groups []config.GroupConfig) error {
	return e.o.Replace(forges, groups)
}

func (e engine) State(name string) (GroupState, bool) {
	for _, s := range e.o.Groups() {
		if s.Name == name {
			return GroupState{ActiveRunners: s.ActiveRunners, QueuedJobs: s.QueuedJobs, Idle: s.Idle, Busy: s.Busy,
				LastCheckTime: s.LastCheckTime, LastError: s.LastErrorBrief, Retired: s.Retired, NotTakingJobs: s.NotTakingJobs,
				SpawnsHeldUntil: s.SpawnsHeldUntil}, true
		}
	}
	return GroupState{}, false
}

func (e engine) Check(ctx context.Context, fc config.ForgeConfig, gc config.GroupConfig) error {
	f, err := e.newForge(fc)
	if err != nil {
		return err
	}
	err = orchestrator.Check(ctx, &config.Config{Forges: []config.ForgeConfig{fc}, Groups: []config.GroupConfig{gc}},
		orchestrator.Options{Forges: map[string]orchestrator.Forge{fc.Name: f}, Redactor: e.redact})
	if err == nil {
		return nil
	}
	// Said on the group's status: what the forge answered stays in the log.
	e.log.Warn("the forge refuses what the group needs", "group", gc.Name, "err", e.redact.Redact(err.Error()))
	msg := e.redact.Redact(forge.Brief(err))
	var ae *forge.APIError
	if (errors.As(err, &ae) && (ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden)) ||
		strings.Contains(msg, "lacks the scope") {
		return fmt.Errorf("%w: %s", ErrTokenScope, msg)
	}
	return errors.New(msg)
}
