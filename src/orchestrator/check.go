package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// Check asks each group's forge for every endpoint the group will use,
// with the configured token, and answers what is refused (naming the
// missing token scope where the forge says it). It needs neither the
// state dir nor a running daemon: `runway check`.
func Check(ctx context.Context, cfg *config.Config, opt Options) error {
	logger, redact := opt.Logger, opt.Redactor
	if logger == nil {
		logger, redact = logging.New(boshlog.LevelError, io.Discard)
	}
	if redact == nil {
		redact = &logging.Redactor{}
	}
	o := &Orchestrator{cfg: cfg, log: logging.Fields{Logger: logger, Tag: "orchestrator"}, redact: redact,
		forges: map[string]*forgeView{}, now: time.Now, metrics: NewMetrics()}
	var errs []error
	for _, fc := range cfg.Forges {
		if f, ok := opt.Forges[fc.Name]; ok && f.Client != nil {
			o.forges[fc.Name] = newForgeView(fc, f, o.observeJob)
		}
	}
	for _, gc := range cfg.Groups {
		fv := o.forges[gc.Forge]
		if fv == nil {
			continue
		}
		c, err := checkClient(fv, gc)
		if err == nil {
			err = checkGroup(ctx, c, gc.ForgeScope())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("group %s (forge %s, %s): %w", gc.Name, gc.Forge, gc.ForgeScope(), err))
		}
	}
	return errors.Join(errs...)
}

// checkClient is what a group's check asks: a scale-set group's scale
// set client (its admin connection, the runner list), else the forge's.
func checkClient(fv *forgeView, gc config.GroupConfig) (forge.Client, error) {
	f := fv.cur.Load()
	if gc.Demand != config.DemandScaleSet {
		return f.client, nil
	}
	if f.scaleSets == nil {
		return nil, fmt.Errorf("forge %s serves no scale sets (a GitHub forge does)", gc.Forge)
	}
	c, err := f.scaleSets(gc.ForgeScope())
	if err != nil {
		return nil, err
	}
	l := scaleset.NewListener(scaleset.ListenerConfig{Client: c, Spec: scaleSetSpec(gc, f.cfg)})
	return &scaleset.Forge{L: l, REST: fv.api}, nil
}

// checkGroup uses the forge's own check when it has one, else lists jobs
// and runners.
func checkGroup(ctx context.Context, c forge.Client, s forge.Scope) error {
	if ch, ok := c.(forge.Checker); ok {
		return ch.Check(ctx, s)
	}
	_, jerr := c.Jobs(ctx, s)
	_, rerr := c.Runners(ctx, s)
	return errors.Join(jerr, rerr)
}

// checkAccess runs Check's checks for the daemon at start-up and logs
// what is refused: the daemon still starts (a token may be fixed in its
// file, which is read again), but the operator sees why at once.
func (o *Orchestrator) checkAccess(ctx context.Context) {
	for _, g := range o.groupList() {
		if err := checkGroup(ctx, g.demand.client(), g.scope); err != nil {
			o.log.Error("the forge refuses what this group needs (runway check lists it)", "group", g.cfg().Name, "forge", g.cfg().Forge, "err", err)
			o.Failure(g.cfg().Name, "forge", err)
		}
	}
}
