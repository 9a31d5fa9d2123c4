package scaleset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/runway-cpi/runway/src/forge"
)

// HeaderMaxCapacity tells the service, with every long poll, how many
// jobs the listener can take (actions-runner-controller #3431: "so that
// the back-end is aware of how many jobs we can handle at one time").
const HeaderMaxCapacity = "X-ScaleSetMaxCapacity"

// sessionJSON is a message session as the service spells it.
type sessionJSON struct {
	SessionID       string      `json:"sessionId,omitempty"`
	OwnerName       string      `json:"ownerName,omitempty"`
	ScaleSet        *ScaleSet   `json:"runnerScaleSet,omitempty"`
	MessageQueueURL string      `json:"messageQueueUrl,omitempty"`
	QueueToken      string      `json:"messageQueueAccessToken,omitempty"`
	Statistics      *Statistics `json:"statistics,omitempty"`
}

// Session is one message session of a scale set: this process is its
// one listener while it lasts.
type Session struct {
	c          *Client
	scaleSetID int

	mu    sync.Mutex
	id    string
	queue string // the message queue URL
	token string // the message queue's token (a secret)
	stats Statistics
}

// OpenSession opens the scale set's message session for owner.
// ErrSessionConflict: another listener holds it.
func (c *Client) OpenSession(ctx context.Context, scaleSetID int, owner string) (*Session, error) {
	var s sessionJSON
	op := fmt.Sprintf("opening a session of scale set %d", scaleSetID)
	if err := c.service(ctx, "POST", fmt.Sprintf("%s/%d/sessions", scaleSetsPath, scaleSetID), sessionJSON{OwnerName: owner}, &s, op); err != nil {
		return nil, err
	}
	out := &Session{c: c, scaleSetID: scaleSetID}
	if err := out.take(s, op); err != nil {
		return nil, err
	}
	return out, nil
}

// take checks a session answer and keeps it.
func (s *Session) take(j sessionJSON, op string) error {
	switch {
	case j.SessionID == "" || strings.ContainsAny(j.SessionID, "/?#"):
		return &Error{Op: op, Message: "the answer names no usable session id"}
	case j.QueueToken == "":
		return &Error{Op: op, Message: "the answer holds no message queue token"}
	case j.Statistics != nil && !j.Statistics.valid():
		return &Error{Op: op, Message: "the session's statistics hold a negative count"}
	}
	u, err := url.Parse(j.MessageQueueURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &Error{Op: op, Message: "the message queue URL is not an http(s) URL"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id, s.queue, s.token = j.SessionID, j.MessageQueueURL, j.QueueToken
	if j.Statistics != nil {
		s.stats = *j.Statistics
	}
	return nil
}

// ID is the session's id (kept by the caller so that a listener taking
// over after a crash can delete the dead one's session).
func (s *Session) ID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Statistics are the scale set's counts as the session opened (or was
// last refreshed).
func (s *Session) Statistics() Statistics {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// DeleteSession deletes a scale set's session by id (the listener's own
// on exit, or a dead listener's it recorded); one already gone (404) or
// expired (400 RunnerScaleSetSessionExpiredException) is not an error.
func (c *Client) DeleteSession(ctx context.Context, scaleSetID int, id string) error {
	if id == "" || strings.ContainsAny(id, "/?#") {
		return errors.New("scale sets: no session id to delete")
	}
	err := c.service(ctx, "DELETE", fmt.Sprintf("%s/%d/sessions/%s", scaleSetsPath, scaleSetID, url.PathEscape(id)), nil, nil,
		fmt.Sprintf("deleting session %s of scale set %d", id, scaleSetID))
	if errors.Is(err, forge.ErrNotFound) || errors.Is(err, ErrSessionExpired) {
		return nil
	}
	return err
}

// Close deletes the session.
func (s *Session) Close(ctx context.Context) error {
	return s.c.DeleteSession(ctx, s.scaleSetID, s.ID())
}

// Refresh renews the session's message queue token (PATCH the session).
func (s *Session) Refresh(ctx context.Context) error {
	var j sessionJSON
	op := fmt.Sprintf("refreshing session %s of scale set %d", s.ID(), s.scaleSetID)
	if err := s.c.service(ctx, "PATCH", fmt.Sprintf("%s/%d/sessions/%s", scaleSetsPath, s.scaleSetID, url.PathEscape(s.ID())), nil, &j, op); err != nil {
		return err
	}
	return s.take(j, op)
}

// withToken runs a request with the session's token; a 401 (the token
// expired, perhaps mid-poll) refreshes the session and runs it once more.
func (s *Session) withToken(ctx context.Context, req func(queue, token string) error) error {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		queue, token := s.queue, s.token
		s.mu.Unlock()
		err := req(queue, token)
		if attempt > 0 || !errors.Is(err, ErrUnauthorized) {
			return err
		}
		if rerr := s.Refresh(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
	}
}

// Message waits for the next message after lastID (the long poll),
// telling the service how many jobs the listener can hold at one time
// (capacity: its maximum; the jobs the scale set holds count against
// it). nil, nil: nothing came before the service's poll ended — 202, or
// 200 with an empty body (github.com answers that too: ARC #4285,
// #4470).
func (s *Session) Message(ctx context.Context, lastID int64, capacity int) (*Message, error) {
	if capacity < 0 {
		capacity = 0
	}
	var msg *Message
	err := s.withToken(ctx, func(queue, token string) error {
		u, err := url.Parse(queue)
		if err != nil {
			return err
		}
		if lastID > 0 {
			q := u.Query()
			q.Set("lastMessageId", strconv.FormatInt(lastID, 10))
			u.RawQuery = q.Encode()
		}
		resp, err := s.c.send(ctx, s.c.longPoll, "GET", u.String(), map[string]string{"Accept": "application/json; api-version=" + APIVersion,
			"Authorization": "Bearer " + token, HeaderMaxCapacity: strconv.Itoa(capacity)}, nil)
		if err != nil {
			return &Error{Op: "the next message", Err: forge.RedactError(err)}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMessageBytes+1))
		switch {
		case err != nil:
			return &Error{Op: "the next message", Status: resp.StatusCode, Err: forge.RedactError(err)}
		case resp.StatusCode == http.StatusAccepted:
			msg = nil
			return nil
		case resp.StatusCode != http.StatusOK:
			return answerError("the next message", resp, body)
		case len(bytes.TrimSpace(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")))) == 0:
			msg = nil
			return nil
		}
		msg, err = parseMessage(body)
		return err
	})
	return msg, err
}

// DeleteMessage acknowledges a message: the service will not send it
// again.
func (s *Session) DeleteMessage(ctx context.Context, id int64) error {
	op := fmt.Sprintf("deleting message %d", id)
	return s.withToken(ctx, func(queue, token string) error {
		u, err := url.Parse(queue)
		if err != nil {
			return err
		}
		u.Path = strings.TrimRight(u.Path, "/") + "/" + strconv.FormatInt(id, 10)
		err = s.c.do(ctx, s.c.actions, "DELETE", u.String(), map[string]string{"Authorization": "Bearer " + token}, nil, nil, op)
		if errors.Is(err, forge.ErrNotFound) {
			return nil // deleted already
		}
		return err
	})
}

// Acquire asks for the jobs of these request ids; the service answers
// the ones this scale set got (a job another listener or scale set got
// first, or one gone, is left out). github.com has no acquire step: 404
// (forge.ErrNotFound).
func (s *Session) Acquire(ctx context.Context, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var got list[int64]
	op := fmt.Sprintf("acquiring %d jobs", len(ids))
	err := s.withToken(ctx, func(_, token string) error {
		base, _, err := s.c.admin(ctx, false)
		if err != nil {
			return err
		}
		u := serviceURL(base, fmt.Sprintf("%s/%d/acquirejobs", scaleSetsPath, s.scaleSetID))
		return s.c.do(ctx, s.c.actions, "POST", u, map[string]string{"Authorization": "Bearer " + token}, ids, &got, op)
	})
	if err != nil {
		return nil, err
	}
	asked := map[int64]bool{}
	for _, id := range ids {
		asked[id] = true
	}
	out := make([]int64, 0, len(got.Value))
	for _, id := range got.Value {
		if asked[id] { // never more than was asked
			out = append(out, id)
			delete(asked, id)
		}
	}
	return out, nil
}
