package scaleset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// SessionRecord keeps the id of the session a listener opened where a
// listener taking over (another replica, or this one after a crash) can
// read it: a session whose listener died blocks the scale set (409) until
// it is deleted, and only its id can delete it.
type SessionRecord interface {
	LoadSession() (scaleSetID int, sessionID string, err error)
	// SaveSession records a session ("" clears the record).
	SaveSession(scaleSetID int, sessionID string) error
}

// ListenerConfig is what a listener needs.
type ListenerConfig struct {
	Client *Client
	Spec   Spec
	// Owner names the session (the service shows it).
	Owner string
	// MaxJobs is how many jobs the group can hold at once (its
	// max_active_runners; 0 while drained): jobs are acquired only up to
	// it, and the long poll tells the service as much.
	MaxJobs func() int
	// Leading re-checks, before a session is opened or a dead one
	// deleted, that this process still acts for the group.
	Leading func(context.Context) bool
	Record  SessionRecord
	// Changed is told after every message handled and every session
	// opened or closed (the group's pass then reads State).
	Changed func()
	// OnJob hears of each job started and completed (timings).
	OnJob func(JobMessage)
	Log   logging.Fields
	Now   func() time.Time
	// MinBackoff, MaxBackoff pace retries after a failure (default 2 s
	// and 1 min).
	MinBackoff, MaxBackoff time.Duration
}

// Listener keeps one scale set's message session while its context
// lasts: the acting replica's one listener.
type Listener struct {
	cfg ListenerConfig

	mu        sync.Mutex
	st        State
	completed map[int64]time.Time // recently completed request ids

	// The long poll in flight: its cancel and the capacity it told the
	// service (Nudge ends it when the group can hold more).
	pollMu     sync.Mutex
	pollCancel context.CancelFunc
	pollCap    int
}

// State is what the listener knows, for the group's passes.
type State struct {
	ScaleSetID int
	Session    bool // a session is open now
	Stats      Statistics
	// Queued: jobs acquired by (or assigned to) the scale set that no
	// runner has started; Running: started, by runner name.
	Queued  map[int64]JobMessage
	Running map[int64]JobMessage
	// Finished: runners whose job completed, since when.
	Finished  map[string]time.Time
	LastError string
	// Refused counts messages and entries refused since start.
	Refused int
}

// Demand is how many runners the scale set's jobs wait for: the known
// acquired jobs, or the statistics' assigned jobs no runner runs (after a
// takeover or restart the jobs are known by count only), whichever is
// more.
func (s State) Demand() int {
	return max(len(s.Queued), s.Stats.TotalAssignedJobs-s.Stats.TotalRunningJobs)
}

// Held is how many jobs the scale set holds (acquired and not done).
func (s State) Held() int {
	return max(len(s.Queued)+len(s.Running), s.Stats.TotalAssignedJobs)
}

// NewListener makes a listener; Run starts it.
func NewListener(cfg ListenerConfig) *Listener {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 2 * time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = time.Minute
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	if cfg.OnJob == nil {
		cfg.OnJob = func(JobMessage) {}
	}
	return &Listener{cfg: cfg, completed: map[int64]time.Time{},
		st: State{Queued: map[int64]JobMessage{}, Running: map[int64]JobMessage{}, Finished: map[string]time.Time{}}}
}

// State returns a copy of what the listener knows.
func (l *Listener) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.st
	s.Queued, s.Running, s.Finished = clone(s.Queued), clone(s.Running), clone(s.Finished)
	return s
}

func clone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Completed reports whether a job request completed recently.
func (l *Listener) Completed(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.completed[id]
	return ok
}

// ForgetRunner drops a finished runner once the group has reaped it.
func (l *Listener) ForgetRunner(name string) {
	l.mu.Lock()
	delete(l.st.Finished, name)
	l.mu.Unlock()
}

func (l *Listener) setError(err error) {
	l.mu.Lock()
	if err == nil {
		l.st.LastError = ""
	} else {
		l.st.LastError = err.Error()
	}
	l.mu.Unlock()
	l.cfg.Changed()
}

// Run keeps the session until ctx ends, then deletes it. Failures are
// retried with backoff (State.LastError says why meanwhile); it returns
// only when ctx ends.
func (l *Listener) Run(ctx context.Context) {
	backoff := time.Duration(0)
	wait := func(err error) bool {
		backoff = min(max(backoff*2, l.cfg.MinBackoff), l.cfg.MaxBackoff)
		if ctx.Err() == nil {
			l.cfg.Log.Warn("scale set listener: retrying", "scale_set", l.Spec().Name, "err", err, "retry_in", backoff)
			l.setError(err)
		}
		return retry.SleepContext(ctx, backoff) == nil
	}
	for ctx.Err() == nil {
		sess, err := l.open(ctx)
		if err != nil {
			if !wait(err) {
				return
			}
			continue
		}
		backoff = 0
		err = l.poll(ctx, sess, func() { backoff = 0 }, wait)
		l.close(sess)
		if err != nil && ctx.Err() == nil && !wait(err) {
			return
		}
	}
}

// open finds (or makes) the scale set and opens its session. A session
// held by a dead listener whose id this group recorded is deleted first;
// one held by anyone else is ErrSessionConflict, retried by Run.
func (l *Listener) open(ctx context.Context) (*Session, error) {
	if !l.cfg.Leading(ctx) {
		return nil, errors.New("not acting for the group: no session opened")
	}
	set, err := l.cfg.Client.Ensure(ctx, l.Spec())
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.st.ScaleSetID = set.ID
	l.mu.Unlock()
	sess, err := l.cfg.Client.OpenSession(ctx, set.ID, l.cfg.Owner)
	if errors.Is(err, ErrSessionConflict) {
		recID, recSession, rerr := l.cfg.Record.LoadSession()
		switch {
		case rerr != nil:
			return nil, errors.Join(err, rerr)
		case recID != set.ID || recSession == "":
			return nil, fmt.Errorf("scale set %s (%d) is held by another listener, not one of this group's: %w", set.Name, set.ID, err)
		case !l.cfg.Leading(ctx):
			return nil, errors.New("not acting for the group: the dead listener's session is left")
		}
		l.cfg.Log.Info("deleting the session a dead listener of this group left", "scale_set", set.Name, "session", recSession)
		if derr := l.cfg.Client.DeleteSession(ctx, set.ID, recSession); derr != nil {
			return nil, errors.Join(err, derr)
		}
		sess, err = l.cfg.Client.OpenSession(ctx, set.ID, l.cfg.Owner)
	}
	if err != nil {
		return nil, err
	}
	if err := l.cfg.Record.SaveSession(set.ID, sess.ID()); err != nil {
		l.close(sess)
		return nil, err
	}
	l.mu.Lock()
	l.st.Session, l.st.Stats, l.st.LastError = true, sess.Statistics(), ""
	l.mu.Unlock()
	l.cfg.Log.Info("scale set session opened", "scale_set", set.Name, "id", set.ID, "session", sess.ID(),
		"assigned_jobs", sess.Statistics().TotalAssignedJobs)
	l.cfg.Changed()
	return sess, nil
}

// close deletes the session (best effort: a session left is deleted by
// the next listener of the group, by its recorded id).
func (l *Listener) close(sess *Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sess.Close(ctx); err != nil {
		l.cfg.Log.Warn("deleting the scale set session", "scale_set", l.Spec().Name, "err", err)
	} else if err := l.cfg.Record.SaveSession(sess.scaleSetID, ""); err != nil {
		l.cfg.Log.Warn("clearing the session record", "scale_set", l.Spec().Name, "err", err)
	}
	l.mu.Lock()
	l.st.Session = false
	l.mu.Unlock()
	l.cfg.Changed()
}

// capacity is what the long poll tells the service: how many jobs the
// group can hold at one time (ARC sends its maxRunners; the service
// counts the jobs the scale set holds against it).
func (l *Listener) capacity() int { return max(l.cfg.MaxJobs(), 0) }

// poll long-polls the session until ctx ends or the session is unusable
// (returned as an error: Run opens a new one). A service that fails is
// waited for (wait) on the same session.
func (l *Listener) poll(ctx context.Context, sess *Session, ok func(), wait func(error) bool) error {
	var lastID int64
	for ctx.Err() == nil {
		msg, nudged, err := l.poll1(ctx, sess, lastID)
		var me *MessageError
		switch {
		case ctx.Err() != nil:
			return nil
		case nudged:
			continue // the group can hold more than the poll told: tell it again
		case errors.As(err, &me):
			l.refused(me)
			if me.ID == 0 {
				return err // its id unread: a new session starts a new queue
			}
			lastID = me.ID
			if derr := sess.DeleteMessage(ctx, me.ID); derr != nil && !wait(derr) {
				return nil
			}
			continue
		case errors.Is(err, forge.ErrNotFound) || errors.Is(err, ErrUnauthorized):
			// The session (or the scale set) is gone, or its token cannot
			// be refreshed: a new one.
			return err
		case err != nil:
			if !wait(err) {
				return nil
			}
			continue
		case msg == nil:
			ok()
			continue
		}
		ok()
		if err := l.handle(ctx, sess, msg); err != nil {
			if !wait(err) {
				return nil
			}
			continue // not deleted: the service sends it again
		}
		lastID = msg.ID
		if err := sess.DeleteMessage(ctx, msg.ID); err != nil && ctx.Err() == nil {
			l.cfg.Log.Warn("deleting a handled message", "scale_set", l.Spec().Name, "message", msg.ID, "err", err)
		}
		l.setError(nil)
	}
	return nil
}

// poll1 is one long poll, ended early by Nudge (nudged).
func (l *Listener) poll1(ctx context.Context, sess *Session, lastID int64) (*Message, bool, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	capacity := l.capacity()
	l.pollMu.Lock()
	l.pollCancel, l.pollCap = cancel, capacity
	l.pollMu.Unlock()
	msg, err := sess.Message(pctx, lastID, capacity)
	l.pollMu.Lock()
	l.pollCancel = nil
	l.pollMu.Unlock()
	nudged := ctx.Err() == nil && pctx.Err() != nil
	return msg, nudged, err
}

// Nudge ends the long poll in flight when the group can now hold more
// jobs than it told the service (it was drained, its maximum was raised):
// the next poll says so, and the service offers what waits. A message
// the service built for the poll ended is sent again (it is not deleted).
func (l *Listener) Nudge() {
	l.pollMu.Lock()
	defer l.pollMu.Unlock()
	if l.pollCancel != nil && l.capacity() > l.pollCap {
		l.pollCancel()
		l.pollCancel = nil
	}
}

func (l *Listener) refused(me *MessageError) {
	l.cfg.Log.Warn("scale set message refused", "scale_set", l.Spec().Name, "err", me)
	l.mu.Lock()
	l.st.Refused++
	l.mu.Unlock()
}

// completedMemory bounds the completed request ids kept (a late or
// repeated message about one is then still recognised).
const completedMemory = 20000

// handle applies one message: the statistics, the jobs assigned, started
// and completed, then acquires the available jobs the group has room for
// (a job known already — acquired, running or done — is not asked for
// again). An error leaves the message undeleted: the service sends it
// again, and applying it twice changes nothing.
func (l *Listener) handle(ctx context.Context, sess *Session, m *Message) error {
	now := l.cfg.Now()
	l.mu.Lock()
	st := &l.st
	st.Stats, st.Refused = m.Statistics, st.Refused+m.Refused
	for _, j := range m.Assigned {
		_, running := st.Running[j.RequestID]
		if _, done := l.completed[j.RequestID]; !running && !done {
			if prev, ok := st.Queued[j.RequestID]; ok && j.QueueTime.IsZero() {
				j.QueueTime = prev.QueueTime
			}
			st.Queued[j.RequestID] = j
		}
	}
	for _, j := range m.Started {
		delete(st.Queued, j.RequestID)
		if _, done := l.completed[j.RequestID]; !done {
			st.Running[j.RequestID] = j
		}
	}
	for _, j := range m.Completed {
		delete(st.Queued, j.RequestID)
		delete(st.Running, j.RequestID)
		l.completed[j.RequestID] = now
		if j.RunnerName != "" {
			st.Finished[j.RunnerName] = now
		}
	}
	l.prune(now)
	room := max(l.cfg.MaxJobs()-st.Held(), 0)
	var ask []int64
	offered := map[int64]JobMessage{}
	for _, j := range m.Available {
		_, queued := st.Queued[j.RequestID]
		_, running := st.Running[j.RequestID]
		_, done := l.completed[j.RequestID]
		if len(ask) >= room || queued || running || done || offered[j.RequestID].RequestID != 0 {
			continue
		}
		ask = append(ask, j.RequestID)
		offered[j.RequestID] = j
	}
	l.mu.Unlock()
	for _, j := range append(append([]JobMessage(nil), m.Started...), m.Completed...) {
		l.cfg.OnJob(j)
	}
	if len(ask) > 0 {
		got, err := sess.Acquire(ctx, ask)
		if err != nil {
			l.cfg.Changed()
			return err
		}
		l.mu.Lock()
		for _, id := range got {
			j := offered[id]
			j.ScaleSetAssignTime = Time{now}
			l.st.Queued[id] = j
		}
		l.mu.Unlock()
		if len(got) > 0 {
			l.cfg.Log.Info("jobs acquired", "scale_set", l.Spec().Name, "asked", len(ask), "acquired", len(got))
		}
	}
	l.cfg.Changed()
	return nil
}

// prune forgets completed ids and finished runners over an hour old (or
// the oldest, past the bound). The caller holds l.mu.
func (l *Listener) prune(now time.Time) {
	for id, at := range l.completed {
		if now.Sub(at) > time.Hour || len(l.completed) > completedMemory {
			delete(l.completed, id)
		}
	}
	for name, at := range l.st.Finished {
		if now.Sub(at) > time.Hour {
			delete(l.st.Finished, name)
		}
	}
}
