package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
)

// The /actions/runners API: Gitea and GitHub serve the same paths and
// bodies under a scope's base path; only their paging differs.

// Paging asks for one page of a listing (Query) and tells whether the
// page just read was the last (Last, given its header, the listing's
// total_count and how many runners were read so far).
type Paging struct {
	Query func(page int) url.Values
	Last  func(h http.Header, total, got, onPage int) bool
}

// ListRunners reads every runner registered under base.
func (a *API) ListRunners(ctx context.Context, base string, p Paging) ([]Runner, error) {
	var out []Runner
	for page := 1; page <= 10000; page++ {
		var body runnersJSON
		h, err := a.Do(ctx, "GET", base+"/actions/runners", p.Query(page), nil, &body)
		if err != nil {
			return nil, err
		}
		out = append(out, body.list()...)
		if p.Last(h, body.TotalCount, len(out), len(body.Runners)) {
			break
		}
	}
	return out, nil
}

// RegistrationToken asks for a runner registration token under base.
func (a *API) RegistrationToken(ctx context.Context, base string) (string, error) {
	var body struct {
		Token string `json:"token"`
	}
	path := base + "/actions/runners/registration-token"
	if _, err := a.Do(ctx, "POST", path, nil, nil, &body); err != nil {
		return "", err
	}
	if body.Token == "" {
		return "", fmt.Errorf("POST %s%s: empty registration token", a.Base, path)
	}
	return body.Token, nil
}

// DeleteRunner removes a registration; one already gone is not an error.
func (a *API) DeleteRunner(ctx context.Context, base string, id int64) error {
	_, err := a.Do(ctx, "DELETE", fmt.Sprintf("%s/actions/runners/%d", base, id), nil, nil, nil)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// runnersJSON is a runners listing as both forges spell it.
type runnersJSON struct {
	Runners []struct {
		ID     int64  `json:"id"`
		Name   string `json:"name"`
		Status string `json:"status"`
		Busy   bool   `json:"busy"`
		Labels []struct {
			Name string `json:"name"`
		} `json:"labels"`
	} `json:"runners"`
	TotalCount int `json:"total_count"`
}

func (r runnersJSON) list() []Runner {
	out := make([]Runner, 0, len(r.Runners))
	for _, x := range r.Runners {
		fr := Runner{ID: x.ID, Name: x.Name, Status: x.Status, Busy: x.Busy}
		for _, l := range x.Labels {
			fr.Labels = append(fr.Labels, l.Name)
		}
		out = append(out, fr)
	}
	return out
}
