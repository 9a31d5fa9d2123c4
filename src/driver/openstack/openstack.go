// Package openstack is the OpenStack driver: Nova servers, Cinder volumes
// and snapshots, Neutron ports and Glance images through gophercloud v2.
// One Keystone token per process (shared with later processes through a
// 0600 cache file in the state dir); every call runs inside the CPI's wait
// budget, so 413/429 answers, 5xx and resets are waited out and logged;
// everything created carries the creator's tags, and a create that fails
// part-way removes what it made.
package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/driver/clouddeps"
	"github.com/runway-cpi/runway/src/driver/found"
	"github.com/runway-cpi/runway/src/driver/poll"
)

// Driver implements driver.Driver on OpenStack.
type Driver struct {
	clouddeps.Base
	cfg      Config
	stateDir string
	redact   func(...string)

	once    sync.Once
	sess    *session
	initErr error
}

var _ driver.Complete = (*Driver)(nil)

// New builds the driver from its config section. No network I/O happens
// until a method needs OpenStack.
func New(section json.RawMessage, deps driver.Deps) (*Driver, error) {
	c, err := parseConfig(section)
	if err != nil {
		return nil, err
	}
	redact := deps.Redact
	if redact == nil {
		redact = func(...string) {}
	}
	redact(c.Password, c.ApplicationCredentialSecret)
	return &Driver{Base: clouddeps.New("openstack", deps.Locker, deps.Logger, deps.Retry, classify), cfg: c, stateDir: deps.StateDir, redact: redact}, nil
}

// StemcellFormats: images Glance stores (qcow2, raw) and light stemcells
// naming an existing image.
func (d *Driver) StemcellFormats() []string { return catalog.Formats("openstack") }

// client returns the service client of one kind.
func (d *Driver) client(ctx context.Context, kind string) (*gophercloud.ServiceClient, error) {
	s, err := d.session(ctx)
	if err != nil {
		return nil, err
	}
	return s.service(kind)
}

// do runs one API call of a service inside the retry budget; attempts
// counts the HTTP attempts (a create sent twice may have happened twice).
func (d *Driver) do(ctx context.Context, kind, op string, fn func(ctx context.Context, c *gophercloud.ServiceClient) error) (attempts int, err error) {
	c, err := d.client(ctx, kind)
	if err != nil {
		return 0, err
	}
	err = d.Retry.Do(ctx, "openstack "+op, func(ctx context.Context) error {
		attempts++
		return fn(ctx, c)
	})
	return attempts, err
}

// doOnce runs an operation that is not repeatable blindly: when an
// attempt after the first fails in a way alreadyDone recognises (a 404 on
// a delete, a 409 on an action), the earlier attempt reached the cloud
// before its answer was lost, and the call succeeded.
func (d *Driver) doOnce(ctx context.Context, kind, op string, fn func(ctx context.Context, c *gophercloud.ServiceClient) error, alreadyDone func(error) bool) error {
	n := 0
	_, err := d.do(ctx, kind, op, func(ctx context.Context, c *gophercloud.ServiceClient) error {
		n++
		err := fn(ctx, c)
		if err != nil && n > 1 && alreadyDone(err) {
			d.Log.Info("an earlier attempt took effect", "op", op, "status", status(err))
			return nil
		}
		return err
	})
	return err
}

// doCreate runs a create POST whose outcome may be unknown (a timeout, a
// reset after the request went out): before each resend it asks find for
// what an earlier attempt may have made, and adopts that instead of
// making a second one. It answers how many POSTs were sent.
func (d *Driver) doCreate(ctx context.Context, kind, op string, post func(ctx context.Context, c *gophercloud.ServiceClient) error,
	find func(ctx context.Context, c *gophercloud.ServiceClient) (bool, error)) (int, error) {
	posts := 0
	_, err := d.do(ctx, kind, op, func(ctx context.Context, c *gophercloud.ServiceClient) error {
		if posts > 0 {
			found, err := find(ctx, c)
			if err != nil {
				return err
			}
			if found {
				d.Log.Info("an earlier attempt made it; adopting it", "op", op)
				return nil
			}
		}
		posts++
		return post(ctx, c)
	})
	return posts, err
}

func is409(err error) bool { return status(err) == 409 }

// waitFor sleeps 250 ms first, then 1.4× longer each time up to
// poll_max_ms (1.4 rather than 1.5: Nova's ~1.5 s builds are caught by
// the 4th poll instead of the 5th; measured in docs/benchmarks.md).
func (d *Driver) waitFor(ctx context.Context, what string, check func(ctx context.Context) (bool, error)) error {
	how := poll.Poll{Name: "openstack", First: firstPoll, Factor: 14}
	return d.cfg.WaitFor(ctx, how, what, d.Log.Debug, check)
}

// read runs one read (a get or a list) of a service inside the retry
// budget; a 404 answers gone when gone is not nil, any other failure is
// the cloud's error for op.
func read[T any](ctx context.Context, d *Driver, kind, op string, gone error, fetch func(ctx context.Context, sc *gophercloud.ServiceClient) (T, error)) (T, error) {
	var out, none T
	_, err := d.do(ctx, kind, op, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		out, err = fetch(ctx, sc)
		return err
	})
	if gone != nil && isNotFound(err) {
		return none, gone
	}
	if err != nil {
		return none, d.cloudErr(op, err)
	}
	return out, nil
}

// sweep deletes what a create call sent more than once may have left:
// every listed item carrying token, except keep; gone (may be nil) from
// delete means another sweep got there first.
func sweep[T any](ctx context.Context, d *Driver, kind, op, noun, token, keep string,
	list func(ctx context.Context, sc *gophercloud.ServiceClient) ([]T, error),
	of func(T) (id string, md map[string]string), del func(ctx context.Context, id string) error, gone error) {
	var items []T
	_, err := d.do(ctx, kind, op, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		items, err = list(ctx, sc)
		return err
	})
	if err != nil {
		d.Log.Warn("listing "+noun+"s for cleanup failed", "token", token, "err", err)
		return
	}
	for _, it := range items {
		id, md := of(it)
		if id == keep || md[mdToken] != token {
			continue
		}
		d.Log.Info("deleting what this create left", noun, id)
		if err := del(ctx, id); err != nil && !errors.Is(err, gone) {
			d.Log.Warn("deleting failed", noun, id, "err", err)
		}
	}
}

// all reads every page of a listing.
func all[T any](ctx context.Context, p pagination.Pager, extract func(pagination.Page) ([]T, error)) ([]T, error) {
	pages, err := p.AllPages(ctx)
	if err != nil {
		return nil, err
	}
	return extract(pages)
}

// waitGone waits until probe (a lookup of what) answers gone.
func (d *Driver) waitGone(ctx context.Context, what string, gone error, probe func(ctx context.Context) error) error {
	return d.waitFor(ctx, what+" gone", func(ctx context.Context) (bool, error) {
		err := probe(ctx)
		if errors.Is(err, gone) {
			return true, nil
		}
		return false, err
	})
}

// exists answers whether what cid names exists: read answering gone is
// a no, not an error.
func exists[T any](ctx context.Context, kind, cid string, gone error, read func(ctx context.Context, id string) (T, error)) (bool, error) {
	id, err := validCID(kind, cid)
	if err != nil {
		return false, err
	}
	_, err = read(ctx, id)
	return found.Answer(err, gone)
}

// byID runs act on the id of a CID of kind, once validCID accepts it.
func byID(ctx context.Context, kind, cid string, act func(ctx context.Context, id string) error) error {
	id, err := validCID(kind, cid)
	if err != nil {
		return err
	}
	return act(ctx, id)
}

// validCID refuses anything but an OpenStack UUID (a stemcell may end
// " light"), so a path-like or foreign CID never reaches the cloud.
func validCID(kind, cid string) (string, error) {
	id := cid
	if kind == "stemcell" {
		id = strings.TrimSuffix(cid, " light")
	}
	if len(id) != 36 || uuid.Validate(id) != nil {
		return "", driver.Invalid("%s cid %q is not an OpenStack UUID", kind, cid)
	}
	return id, nil
}

// Metadata and tag keys the driver owns.
const (
	mdToken = "runway_token" // one per create call: finds duplicates
	// Neutron tags are plain strings, "key=value" here.
	tagSep = "="
)

// metadata clips a map to Nova/Cinder limits.
func metadata(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k == "" {
			continue
		}
		out[clip.To(k, 255)] = clip.To(v, 255)
	}
	return out
}

// serverTags turns creator tags into Nova/Neutron tags ("key=value",
// at most 60 characters, no comma or slash), which list filters match.
func serverTags(m map[string]string) []string {
	var out []string
	for k, v := range m {
		if k == "" {
			continue
		}
		t := clip.To(sanitizeTag(k+tagSep+v), 60)
		out = append(out, t)
	}
	return out
}

func sanitizeTag(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == ',' || c == '/' {
			b[i] = '_'
		}
	}
	return string(b)
}
