package scaleset

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	// max_active_runners; 0 while drained or retiring): jobs are acquired
	// only up to it, and every long poll tells the service as much. At 0
	// the listener holds no session at all.
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
	// OnDrop hears of each message the listener gave up on (reason
	// DropHandlingFailed: its handling failed MaxAttempts times; or
	// DropNoAcquire: it offered jobs the service then would not let the
	// listener acquire): the message is deleted and the stream goes on.
	OnDrop func(reason string, err error)
	Log    logging.Fields
	Now    func() time.Time
	// MinBackoff, MaxBackoff pace retries after a failure (default 2 s
	// and 1 min).
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts bounds how often one message's handling is tried
	// (default 3).
	MaxAttempts int
}

// Why a message was dropped (ListenerConfig.OnDrop).
const (
	DropHandlingFailed = "handling_failed"
	DropNoAcquire      = "acquire_not_found"
)

// The flows a service speaks, as the listener found out (State.Flow).
const (
	// FlowAssign: the service assigns jobs itself (JobAssigned with no
	// JobAvailable before it; acquirejobs 404): github.com.
	FlowAssign = "assign"
	// FlowAcquire: the service offers jobs (JobAvailable) for the
	// listener to acquire: GHES up to 3.19.
	FlowAcquire = "acquire"
)

// Listener keeps one scale set's message session while its context
// lasts and the group can hold jobs: the acting replica's one listener.
type Listener struct {
	cfg ListenerConfig

	mu        sync.Mutex
	st        State
	completed map[int64]completion // recently completed jobs, by Key
	acquired  map[int64]bool       // jobs this listener acquired, not yet assigned
	attempts  map[int64]int        // failed handlings, by message id
	warned    string               // the warning last logged

	// The long poll in flight: its cancel and the capacity it told the
	// service (Nudge ends it when that changed); wake ends a pause.
	pollMu     sync.Mutex
	pollCancel context.CancelFunc
	pollCap    int
	wake       chan struct{}
}

// completion is a job's end: when, and whether a runner ran it (one
// that did not was an assignment taken back: the job may be assigned
// again).
type completion struct {
	at  time.Time
	ran bool
}

// State is what the listener knows, for the group's passes.
type State struct {
	ScaleSetID int
	Session    bool // a session is open now
	// Paused: no session, because the group can hold no job (drained,
	// retiring): the service keeps what is queued meanwhile and assigns
	// it once a session opens again.
	Paused bool
	// Flow is how the service hands out jobs, as seen so far (FlowAssign,
	// FlowAcquire; "" until a job came).
	Flow  string
	Stats Statistics
	// Queued: jobs acquired by (or assigned to) the scale set that no
	// runner has started; Running: started. Both by the job's Key.
	Queued  map[int64]JobMessage
	Running map[int64]JobMessage
	// Finished: runners whose job completed, since when.
	Finished  map[string]time.Time
	LastError string
	// Warning: what the service does that the group should know of (its
	// labels dropped), while it holds.
	Warning string
	// Refused counts messages and entries refused since start; Dropped
	// the messages given up on (OnDrop).
	Refused, Dropped int
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
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	if cfg.OnJob == nil {
		cfg.OnJob = func(JobMessage) {}
	}
	if cfg.OnDrop == nil {
		cfg.OnDrop = func(string, error) {}
	}
	return &Listener{cfg: cfg, completed: map[int64]completion{}, acquired: map[int64]bool{}, attempts: map[int64]int{},
		wake: make(chan struct{}, 1),
		st:   State{Queued: map[int64]JobMessage{}, Running: map[int64]JobMessage{}, Finished: map[string]time.Time{}}}
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

// Completed reports whether a job (by Key) completed recently.
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

// errPaused ends a session: the group can hold no job.
var errPaused = errors.New("the group can hold no job: its session is deleted")

// Run keeps the session until ctx ends, then deletes it; while the group
// can hold no job it holds none (advertising capacity 0 would leave the
// service free to assign jobs the group will not run). Failures are
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
		if l.capacity() == 0 {
			l.pause(ctx)
			continue
		}
		sess, err := l.open(ctx)
		if err != nil {
			if !wait(err) {
				return
			}
			continue
		}
		backoff = 0
		opened := time.Now()
		err = l.poll(ctx, sess, func() { backoff = 0 }, wait)
		l.close(sess)
		gone := errors.Is(err, forge.ErrNotFound) || errors.Is(err, ErrUnauthorized)
		switch {
		case err == nil || errors.Is(err, errPaused) || ctx.Err() != nil:
		case gone && time.Since(opened) >= l.cfg.MinBackoff:
			// A session that served a while and is gone (the service
			// evicted it: actions/scaleset #123): a new one at once.
			l.cfg.Log.Info("scale set session gone; opening a new one", "scale_set", l.Spec().Name, "err", err)
		case !wait(err):
			return
		}
	}
}

// pause waits, with no session, until the group can hold jobs again
// (Nudge) or ctx ends.
func (l *Listener) pause(ctx context.Context) {
	l.mu.Lock()
	l.st.Paused, l.st.LastError = true, ""
	l.mu.Unlock()
	l.cfg.Changed()
	for l.capacity() == 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-l.wake:
		}
	}
	l.mu.Lock()
	l.st.Paused = false
	l.mu.Unlock()
}

// open finds (or makes) the scale set and opens its session. A session
// held by a dead listener whose id this group recorded is deleted first
// (one the service expired is gone already: its 400 is no obstacle);
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
	l.noteLabels(set)
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

// noteLabels keeps (and logs once) a warning when the service dropped
// some of the scale set's labels.
func (l *Listener) noteLabels(set ScaleSet) {
	warn := ""
	if len(set.Missing) > 0 {
		warn = fmt.Sprintf("the service dropped labels %s of scale set %s (GHES before 3.18, or custom labels off: it keeps the name only); jobs reach this group with runs-on: %s",
			strings.Join(set.Missing, ", "), set.Name, set.Name)
	}
	l.mu.Lock()
	l.st.Warning = warn
	logIt := warn != "" && warn != l.warned
	l.warned = warn
	l.mu.Unlock()
	if logIt {
		l.cfg.Log.Warn("scale set labels dropped", "scale_set", set.Name, "missing", strings.Join(set.Missing, ","))
	}
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
// (returned as an error: Run opens a new one) or the group can hold no
// job (errPaused). A service that fails is waited for (wait) on the same
// session. A message whose handling fails is tried again, at most
// MaxAttempts times, then dropped: it never holds up the stream.
func (l *Listener) poll(ctx context.Context, sess *Session, ok func(), wait func(error) bool) error {
	var lastID int64
	for ctx.Err() == nil {
		if l.capacity() == 0 {
			return errPaused
		}
		msg, nudged, err := l.poll1(ctx, sess, lastID)
		var me *MessageError
		switch {
		case ctx.Err() != nil:
			return nil
		case nudged:
			continue // the group can hold another number of jobs: tell it again
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
			if l.attempts[msg.ID]++; l.attempts[msg.ID] < l.cfg.MaxAttempts {
				if !wait(err) {
					return nil
				}
				continue // not deleted: the service sends it again
			}
			l.drop(msg.ID, DropHandlingFailed, err)
		}
		delete(l.attempts, msg.ID)
		lastID = msg.ID
		if err := sess.DeleteMessage(ctx, msg.ID); err != nil && ctx.Err() == nil {
			l.cfg.Log.Warn("deleting a handled message", "scale_set", l.Spec().Name, "message", msg.ID, "err", err)
		}
		l.setError(nil)
	}
	return nil
}

// drop gives up on a message: logged, told (OnDrop), then counted, so
// whoever sees the count sees the rest.
func (l *Listener) drop(id int64, reason string, err error) {
	l.cfg.Log.Error("scale set message dropped", "scale_set", l.Spec().Name, "message", id, "reason", reason, "err", err)
	l.cfg.OnDrop(reason, fmt.Errorf("scale set %s: message %d dropped (%s): %w", l.Spec().Name, id, reason, err))
	l.mu.Lock()
	l.st.Dropped++
	l.mu.Unlock()
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

// Nudge tells the listener the group's capacity may have changed (it was
// drained or resumed, its maximum changed): a long poll in flight that
// told the service another number ends (the next poll tells the new one;
// a message the service built for the poll ended is sent again, as it is
// not deleted), and a pause ends if the group can hold jobs again.
func (l *Listener) Nudge() {
	l.pollMu.Lock()
	defer l.pollMu.Unlock()
	if l.pollCancel != nil && l.capacity() != l.pollCap {
		l.pollCancel()
		l.pollCancel = nil
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *Listener) refused(me *MessageError) {
	l.cfg.Log.Warn("scale set message refused", "scale_set", l.Spec().Name, "err", me)
	l.mu.Lock()
	l.st.Refused++
	l.mu.Unlock()
}
