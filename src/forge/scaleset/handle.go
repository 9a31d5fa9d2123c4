package scaleset

import (
	"context"
	"errors"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// completedMemory bounds the completed jobs kept (a late or repeated
// message about one is then still recognised).
const completedMemory = 20000

// handle applies one message: the statistics, then the jobs assigned,
// started and completed in the order the service wrote them, then
// acquires the available jobs the group has room for (a job known
// already — acquired, running or done — is not asked for again). A job
// is known by its Key (its jobId where the message has one). An error
// leaves the message undeleted: the service sends it again, and applying
// it twice changes nothing.
func (l *Listener) handle(ctx context.Context, sess *Session, m *Message) error {
	now := l.cfg.Now()
	l.mu.Lock()
	st := &l.st
	st.Stats, st.Refused = m.Statistics, st.Refused+m.Refused
	for _, j := range m.Events {
		l.apply(j, now)
	}
	l.prune(now)
	if len(m.Available) > 0 {
		st.Flow = FlowAcquire
	}
	room := max(l.cfg.MaxJobs()-st.Held(), 0)
	var ask []int64
	offered := map[int64]JobMessage{}
	for _, j := range m.Available {
		k := j.Key()
		_, queued := st.Queued[k]
		_, running := st.Running[k]
		_, done := l.completed[k]
		if len(ask) >= room || queued || running || done || offered[j.RequestID].RequestID != 0 {
			continue
		}
		ask = append(ask, j.RequestID)
		offered[j.RequestID] = j
	}
	l.mu.Unlock()
	for _, j := range m.Events {
		if j.Kind == JobStarted || j.Kind == JobCompleted {
			l.cfg.OnJob(j)
		}
	}
	if len(ask) > 0 {
		if err := l.acquire(ctx, sess, m.ID, ask, offered, now); err != nil {
			l.cfg.Changed()
			return err
		}
	}
	l.cfg.Changed()
	return nil
}

// apply is one assigned, started or completed job. The caller holds
// l.mu.
func (l *Listener) apply(j JobMessage, now time.Time) {
	st, k := &l.st, j.Key()
	switch j.Kind {
	case JobAssigned:
		if _, running := st.Running[k]; running {
			return
		}
		if c, done := l.completed[k]; done {
			if c.ran {
				return // a replay: the job ran
			}
			delete(l.completed, k) // its assignment was taken back; now it is made again
		}
		if !l.acquired[k] && st.Flow == "" {
			st.Flow = FlowAssign // a job this listener never asked for
		}
		delete(l.acquired, k)
		if prev, ok := st.Queued[k]; ok && j.QueueTime.IsZero() {
			j.QueueTime = prev.QueueTime
		}
		st.Queued[k] = j
	case JobStarted:
		delete(st.Queued, k)
		if _, done := l.completed[k]; !done {
			st.Running[k] = j
		}
	case JobCompleted:
		delete(st.Queued, k)
		delete(st.Running, k)
		l.completed[k] = completion{at: now, ran: j.RunnerName != ""}
		if j.RunnerName != "" {
			st.Finished[j.RunnerName] = now
		}
	}
}

// acquire asks for the jobs offered. A service with no acquire step
// (github.com: 404) assigns jobs itself: those offers are dropped (told,
// counted) and the message is handled.
func (l *Listener) acquire(ctx context.Context, sess *Session, msgID int64, ask []int64, offered map[int64]JobMessage, now time.Time) error {
	got, err := sess.Acquire(ctx, ask)
	if errors.Is(err, forge.ErrNotFound) {
		l.mu.Lock()
		l.st.Flow = FlowAssign
		l.mu.Unlock()
		l.drop(msgID, DropNoAcquire, err)
		return nil
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	for _, id := range got {
		j := offered[id]
		j.ScaleSetAssignTime = Time{now}
		l.st.Queued[j.Key()] = j
		l.acquired[j.Key()] = true
	}
	l.mu.Unlock()
	if len(got) > 0 {
		l.cfg.Log.Info("jobs acquired", "scale_set", l.Spec().Name, "asked", len(ask), "acquired", len(got))
	}
	return nil
}

// prune forgets completed jobs and finished runners over an hour old
// (or the oldest, past the bound). The caller holds l.mu.
func (l *Listener) prune(now time.Time) {
	for id, c := range l.completed {
		if now.Sub(c.at) > time.Hour || len(l.completed) > completedMemory {
			delete(l.completed, id)
		}
	}
	for name, at := range l.st.Finished {
		if now.Sub(at) > time.Hour {
			delete(l.st.Finished, name)
		}
	}
	for k := range l.acquired {
		if _, queued := l.st.Queued[k]; !queued {
			delete(l.acquired, k)
		}
	}
}
