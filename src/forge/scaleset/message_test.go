package scaleset

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func rawMessage(id int64, kind, body string, stats any) []byte {
	b, _ := json.Marshal(map[string]any{"messageId": id, "messageType": kind, "body": body, "statistics": stats})
	return b
}

var zeroStats = map[string]int{"totalAssignedJobs": 0}

// Messages are bounded and checked: too big, not JSON, another kind, no
// statistics or negative counts are refused whole (with the id when it
// could be read); entries without a request id, or a start without a
// runner, are refused one by one; unknown kinds are ignored.
func TestMessagesAreBoundedAndChecked(t *testing.T) {
	huge := make([]byte, MaxMessageBytes+1)
	many := "[" + strings.Repeat(`{"messageType":"JobAssigned","runnerRequestId":1},`, MaxJobMessages) + `{"messageType":"JobAssigned","runnerRequestId":1}]`
	for name, c := range map[string]struct {
		raw    []byte
		wantID int64
	}{
		"over the size bound":   {huge, 0},
		"not JSON":              {[]byte(`{"messageId": 3, "body": `), 0},
		"no id":                 {rawMessage(0, messageKind, "", zeroStats), 0},
		"another kind":          {rawMessage(4, "RunnerScaleSetSomethingElse", "", zeroStats), 4},
		"no statistics":         {rawMessage(5, messageKind, "", nil), 5},
		"a negative count":      {rawMessage(6, messageKind, "", map[string]int{"totalAssignedJobs": -1}), 6},
		"a body not an array":   {rawMessage(7, messageKind, `{"messageType":"JobAvailable"}`, zeroStats), 7},
		"too many job messages": {rawMessage(8, messageKind, many, zeroStats), 8},
	} {
		_, err := parseMessage(c.raw)
		var me *MessageError
		if !errors.As(err, &me) || !errors.Is(err, ErrMessageRefused) || me.ID != c.wantID {
			t.Errorf("%s: %v; want refused with id %d", name, err, c.wantID)
		}
	}
	body := `[{"messageType":"JobAvailable","runnerRequestId":11,"ownerName":"acme","repositoryName":"app","queueTime":"2026-01-02T03:04:05.1234567"},
		{"messageType":"JobAvailable"},
		{"messageType":"JobStarted","runnerRequestId":12},
		{"messageType":"JobStarted","runnerRequestId":13,"runnerName":"r-1","runnerAssignTime":"0001-01-01T00:00:00"},
		{"messageType":"JobCompleted","runnerRequestId":14,"runnerName":"r-2","result":"succeeded"},
		{"messageType":"JobWhatever","runnerRequestId":15},
		"not an object"]`
	m, err := parseMessage(rawMessage(9, messageKind, body, map[string]int{"totalAssignedJobs": 2, "totalRunningJobs": 1}))
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("available %d started %d completed %d refused %d unknown %d", len(m.Available), len(m.Started), len(m.Completed), m.Refused, m.Unknown)
	if want := "available 1 started 1 completed 1 refused 3 unknown 1"; got != want {
		t.Errorf("%s; want %s", got, want)
	}
	if a := m.Available[0]; a.Repo() != "acme/app" || a.QueueTime.IsZero() || !m.Started[0].RunnerAssignTime.IsZero() {
		t.Errorf("entries %+v / %+v: want the repository and .NET dates read (the minimum date as none)", a, m.Started[0])
	}
	if m.Statistics.TotalAssignedJobs != 2 || m.ID != 9 {
		t.Errorf("message %d statistics %+v", m.ID, m.Statistics)
	}
}

// A JWT's exp is read without its signature (the service checks its own
// tokens); anything else is refused.
func TestTokenExpiry(t *testing.T) {
	enc := func(s string) string { return strings.TrimRight(b64(s), "=") }
	if exp, err := tokenExpiry("h." + enc(`{"exp": 1900000000}`) + ".s"); err != nil || exp.Unix() != 1900000000 {
		t.Errorf("exp %v, %v", exp, err)
	}
	for _, bad := range []string{"", "a.b", "h." + enc(`{"sub":"x"}`) + ".s", "h.!!!.s", "h." + enc(`[1]`) + ".s"} {
		if _, err := tokenExpiry(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func b64(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }
