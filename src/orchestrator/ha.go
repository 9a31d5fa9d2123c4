package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/secret"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// leader decides whether this process acts for a group.
type leader interface {
	// Lead reports whether this process leads group now, taking the lead
	// when no one holds it. An error means "not leading".
	Lead(ctx context.Context, group string) (bool, error)
	Close()
}

// sole is SQLite's leadership: the state dir's lock already makes this
// daemon the only one on its store.
type sole struct{}

func (sole) Lead(context.Context, string) (bool, error) { return true, nil }
func (sole) Close()                                     {}

// openStore opens the configured store and its leadership.
func (o *Orchestrator) openStore() error {
	if o.cfg.Store != "postgres" {
		st, err := store.Open(filepath.Join(o.cfg.StateDir, "runway.db"))
		if err != nil {
			return err
		}
		o.store, o.leader = st, sole{}
		return nil
	}
	dsn, err := secret.Read(o.cfg.Postgres.DSNFile, o.cfg.Postgres.DSNEnv, "postgres.dsn", o.redact)
	if err != nil {
		return err
	}
	// The password alone may also appear (in a driver's error, say).
	if pc, err := pgx.ParseConfig(dsn); err == nil {
		o.redact.Add(pc.Password)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		return err
	}
	o.store, o.leader = st, st.Leadership()
	return nil
}

// relayChannel carries what one replica learnt that the acting one needs
// at once: a webhook delivery, a drain flag changed.
const relayChannel = "runway_relay"

type relayed struct {
	Replica string     `json:"replica"`
	Group   string     `json:"group,omitempty"` // drain changed: re-read it
	Forge   string     `json:"forge,omitempty"`
	Action  string     `json:"action,omitempty"`
	Job     *forge.Job `json:"job,omitempty"`
}

// relay tells the other replicas (PostgreSQL only; best effort: they
// also poll).
func (o *Orchestrator) relay(r relayed) {
	r.Replica = o.replica
	b, err := json.Marshal(r)
	if err != nil || len(b) > 7900 { // NOTIFY payloads stop at 8000 bytes
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := o.store.Notify(ctx, relayChannel, string(b)); err != nil {
		o.log.Warn("telling the other replicas", "err", err)
	}
}

// listen applies what other replicas relay, until ctx ends.
func (o *Orchestrator) listen(ctx context.Context) {
	o.store.Listen(ctx, relayChannel, func(payload string) {
		var r relayed
		if json.Unmarshal([]byte(payload), &r) != nil || r.Replica == o.replica {
			return
		}
		if r.Group != "" {
			if g := o.group(r.Group); g != nil {
				g.wake()
			}
		}
		if fv := o.forgeMap()[r.Forge]; fv != nil && r.Job != nil {
			fv.apply(forge.WorkflowJobEvent{Action: r.Action, Job: *r.Job, Repo: r.Job.Repo})
			o.Kick(r.Forge, r.Job.Repo)
		}
	}, func(err error) { o.log.Warn("listening to the other replicas", "err", err) })
}

// lead settles whether this process acts for the group in this pass,
// and what a change means: taking over starts a fresh context for the
// group's work; losing the lead cancels it (in-flight spawns end, their
// rows left for the new leader to recover) and waits for it to stop.
func (g *group) lead(ctx context.Context) (context.Context, bool) {
	ok, err := g.dep.leader.Lead(ctx, g.cfg().Name)
	if ferr := g.dep.fenced(); ferr != nil {
		ok, err = false, ferr
	}
	msg := ""
	if err != nil && ctx.Err() == nil {
		msg = "leadership unknown (not acting): " + g.dep.redact.Redact(err.Error())
	}
	g.mu.Lock()
	was := g.leadCancel != nil
	// Logged when it changes, not every pass while the database is away.
	logIt := msg != g.leadErr
	g.leadErr = msg
	g.mu.Unlock()
	if logIt && msg != "" {
		g.dep.log.Warn(msg, "group", g.cfg().Name)
	} else if logIt {
		g.dep.log.Info("leadership known again", "group", g.cfg().Name)
	}
	switch {
	case ok && !was:
		lctx, cancel := context.WithCancel(ctx)
		g.mu.Lock()
		g.leadCtx, g.leadCancel, g.status.Acting, g.status.ActingSince = lctx, cancel, true, time.Now()
		g.mu.Unlock()
		g.dep.metrics.acting.WithLabelValues(g.cfg().Name).Set(1)
		g.dep.log.Info("acting for the group", "group", g.cfg().Name, "replica", g.dep.replica)
		// Deliveries may have been missed while no one acted (a restart,
		// a crashed leader): the first pass lists the queue afresh.
		g.forge.markStale(g.scope)
	case !ok && was:
		g.mu.Lock()
		cancel := g.leadCancel
		g.leadCtx, g.leadCancel, g.status.Acting, g.status.ActingSince = nil, nil, false, time.Time{}
		g.mu.Unlock()
		cancel()
		g.spawns.Wait()
		g.dep.metrics.acting.WithLabelValues(g.cfg().Name).Set(0)
		g.dep.log.Warn("no longer acting for the group", "group", g.cfg().Name, "replica", g.dep.replica)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leadCtx, ok
}

// standby keeps a group's status current from the shared store while
// another replica acts for it.
func (g *group) standby() {
	g.mu.Lock()
	g.status.LastCheckTime = g.dep.now()
	g.mu.Unlock()
	if _, err := g.syncDrained(); err != nil {
		g.dep.log.Warn("standby", "group", g.cfg().Name, "err", err)
	}
	g.refreshStatus(-1)
}

// syncDrained takes the group's drain flag from the store: another
// replica may have changed it.
func (g *group) syncDrained() (bool, error) {
	d, err := g.dep.store.Drained(g.cfg().Name)
	if err != nil {
		return false, fmt.Errorf("reading the drain flag: %w", err)
	}
	g.mu.Lock()
	changed := d != g.drained
	g.drained = d
	g.mu.Unlock()
	if changed {
		g.dep.ownershipChanged()
	}
	return d, nil
}
