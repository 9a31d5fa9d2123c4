package orchestrator

import (
	"context"
	"fmt"
)

// fenced says why this process may not act now (Options.Fence), or nil.
func (o *Orchestrator) fenced() error {
	if o.fence == nil {
		return nil
	}
	if err := o.fence(); err != nil {
		return fmt.Errorf("not acting: %w", err)
	}
	return nil
}

// stale is what ends other replicas' leadership sessions.
type stale interface {
	EndOthers(ctx context.Context) (int, error)
}

// endStaleLeaders ends the other replicas' leadership sessions: they
// would hold their groups until their connection dies (a frozen
// process's can live for hours).
func (o *Orchestrator) endStaleLeaders(ctx context.Context) {
	s, ok := o.leader.(stale)
	if !ok {
		return
	}
	n, err := s.EndOthers(ctx)
	if err != nil {
		o.log.Warn("ending other replicas' leadership sessions", "err", err)
		return
	}
	if n > 0 {
		o.log.Info("ended the leadership sessions of replicas no longer leading", "sessions", n)
	}
}
