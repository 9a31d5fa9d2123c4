package scaleset

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
)

// Bounds on what the listener reads of one message: past them it is
// refused (ErrMessageRefused), never read into memory whole.
const (
	// MaxMessageBytes bounds one message answer (a batch of job messages
	// is a few hundred bytes a job: 1,000 jobs fit in half a MiB).
	MaxMessageBytes = 4 << 20
	// MaxJobMessages bounds the job messages of one batch.
	MaxJobMessages = 10000
)

// Job message kinds.
const (
	JobAvailable = "JobAvailable"
	JobAssigned  = "JobAssigned"
	JobStarted   = "JobStarted"
	JobCompleted = "JobCompleted"
)

// messageKind is the one kind of message the listener handles.
const messageKind = "RunnerScaleSetJobMessages"

// JobMessage is one entry of a batch: what happened to a job. On
// github.com since mid-2025 its identity is JobID (a UUID) and RequestID
// is 0; GHES up to 3.19 also names the runner request, which acquiring
// needs.
type JobMessage struct {
	Kind          string   `json:"messageType"`
	RequestID     int64    `json:"runnerRequestId"`
	Repository    string   `json:"repositoryName"`
	Owner         string   `json:"ownerName"`
	JobID         string   `json:"jobId"`
	WorkflowRef   string   `json:"jobWorkflowRef"`
	DisplayName   string   `json:"jobDisplayName"`
	WorkflowRunID int64    `json:"workflowRunId"`
	EventName     string   `json:"eventName"`
	Labels        []string `json:"requestLabels"`
	QueueTime     Time     `json:"queueTime"`
	// ScaleSetAssignTime: acquired by the scale set; RunnerAssignTime:
	// a runner took it (JobStarted on).
	ScaleSetAssignTime Time   `json:"scaleSetAssignTime"`
	RunnerAssignTime   Time   `json:"runnerAssignTime"`
	FinishTime         Time   `json:"finishTime"`
	RunnerID           int64  `json:"runnerId"`
	RunnerName         string `json:"runnerName"`
	Result             string `json:"result"`
}

// Key is the job's identity as Runway tracks it: from its jobId when the
// message has one (the same for every message about the job, across
// reassignments), else its runner request id. Keys made from a jobId
// are at or above 1<<62, where no request id reaches.
func (j JobMessage) Key() int64 {
	if j.JobID == "" {
		return j.RequestID
	}
	h := fnv.New64a()
	h.Write([]byte(j.JobID))
	return int64(h.Sum64()&(1<<62-1) | 1<<62)
}

// Repo is owner/name.
func (j JobMessage) Repo() string {
	if j.Owner == "" {
		return j.Repository
	}
	return j.Owner + "/" + j.Repository
}

// Message is one batch from the message queue.
type Message struct {
	ID         int64
	Statistics Statistics
	Available  []JobMessage
	Assigned   []JobMessage
	Started    []JobMessage
	Completed  []JobMessage
	// Events are the assigned, started and completed entries in the
	// order the service wrote them (a job taken back and assigned again
	// in one batch is completed, then assigned).
	Events []JobMessage
	// Refused counts entries not the protocol's shape (no request id, a
	// started job without a runner, undecodable); Unknown counts entries
	// of kinds the listener does not know (ignored, as actions/scaleset
	// does).
	Refused, Unknown int
}

// MessageError is a message refused whole. ID is set when the message's
// id could be read (the listener deletes it and goes on); otherwise it
// opens a new session.
type MessageError struct {
	ID     int64
	Reason string
}

func (e *MessageError) Error() string {
	if e.ID == 0 {
		return "scale sets: a message refused: " + e.Reason
	}
	return fmt.Sprintf("scale sets: message %d refused: %s", e.ID, e.Reason)
}

func (e *MessageError) Unwrap() error { return ErrMessageRefused }

// parseMessage reads one message answer (at most MaxMessageBytes+1 bytes
// of it were read).
func parseMessage(b []byte) (*Message, error) {
	if len(b) > MaxMessageBytes {
		return nil, &MessageError{Reason: fmt.Sprintf("over %d bytes", MaxMessageBytes)}
	}
	var raw struct {
		ID         int64       `json:"messageId"`
		Kind       string      `json:"messageType"`
		Body       string      `json:"body"`
		Statistics *Statistics `json:"statistics"`
	}
	if err := json.Unmarshal(bytes.TrimPrefix(b, []byte("\xef\xbb\xbf")), &raw); err != nil {
		return nil, &MessageError{Reason: "not JSON: " + err.Error()}
	}
	switch {
	case raw.ID <= 0:
		return nil, &MessageError{Reason: "no message id"}
	case raw.Kind != messageKind:
		return nil, &MessageError{ID: raw.ID, Reason: fmt.Sprintf("kind %q is not %s", clipKind(raw.Kind), messageKind)}
	case !raw.Statistics.valid():
		return nil, &MessageError{ID: raw.ID, Reason: "no statistics, or a negative count"}
	}
	m := &Message{ID: raw.ID, Statistics: *raw.Statistics}
	if strings.TrimSpace(raw.Body) == "" {
		return m, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal([]byte(raw.Body), &entries); err != nil {
		return nil, &MessageError{ID: raw.ID, Reason: "its body is not a JSON array"}
	}
	if len(entries) > MaxJobMessages {
		return nil, &MessageError{ID: raw.ID, Reason: fmt.Sprintf("%d job messages, over %d", len(entries), MaxJobMessages)}
	}
	for _, e := range entries {
		m.add(e)
	}
	return m, nil
}

// add sorts one entry of a batch.
func (m *Message) add(e json.RawMessage) {
	var j JobMessage
	if err := json.Unmarshal(e, &j); err != nil {
		m.Refused++
		return
	}
	if j.Kind != JobAvailable && j.Kind != JobAssigned && j.Kind != JobStarted && j.Kind != JobCompleted {
		m.Unknown++
		return
	}
	// A request id is needed only to acquire; every other entry names
	// its job by jobId or request id.
	if j.RequestID < 0 || (j.Kind == JobAvailable && j.RequestID == 0) || j.Key() == 0 ||
		(j.Kind == JobStarted && j.RunnerName == "") || len(j.JobID) > 200 {
		m.Refused++
		return
	}
	switch j.Kind {
	case JobAvailable:
		m.Available = append(m.Available, j)
		return
	case JobAssigned:
		m.Assigned = append(m.Assigned, j)
	case JobStarted:
		m.Started = append(m.Started, j)
	case JobCompleted:
		m.Completed = append(m.Completed, j)
	}
	m.Events = append(m.Events, j)
}

func clipKind(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// Time is a date as the service writes it: RFC 3339, or .NET's form
// without a zone (UTC); zero when absent or "0001-01-01…".
type Time struct{ time.Time }

// UnmarshalJSON implements json.Unmarshaler: an unreadable date is no
// date (the message is not refused for it).
func (t *Time) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) != nil || s == "" {
		t.Time = time.Time{}
		return nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.9999999", "2006-01-02T15:04:05"} {
		if v, err := time.Parse(layout, s); err == nil {
			if v.Year() <= 1 {
				v = time.Time{}
			}
			t.Time = v.UTC()
			return nil
		}
	}
	t.Time = time.Time{}
	return nil
}

// MarshalJSON implements json.Marshaler (RFC 3339; zero as .NET's
// minimum date).
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte(`"0001-01-01T00:00:00Z"`), nil
	}
	return json.Marshal(t.Time.UTC().Format(time.RFC3339Nano))
}
