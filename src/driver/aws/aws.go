// Package aws is the EC2 driver: instances, EBS volumes, snapshots and
// AMIs through aws-sdk-go-v2. Every call goes through the SDK's retryer
// and then the CPI's wait budget, so throttling is waited out and logged;
// everything created carries the creator's tags and a per-call token tag
// so a create that was sent twice, or died part-way, leaves nothing behind.
package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancing"
	elbv2 "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/driver/clouddeps"
	"github.com/runway-cpi/runway/src/driver/poll"
)

// Driver implements driver.Driver on EC2.
type Driver struct {
	clouddeps.Base
	cfg Config

	once    sync.Once
	ec2     *ec2.Client
	ebs     *ebs.Client
	awsCfg  aws.Config
	initErr error

	lbOnce sync.Once
	elb    *elb.Client
	elbv2  *elbv2.Client
}

var _ driver.Complete = (*Driver)(nil)

// New builds the driver from its config section. No network I/O happens
// until a method needs AWS.
func New(section json.RawMessage, deps driver.Deps) (*Driver, error) {
	c, err := parseConfig(section)
	if err != nil {
		return nil, err
	}
	if deps.Redact != nil {
		deps.Redact(c.SecretAccessKey, c.SessionToken)
	}
	b := clouddeps.New("aws", deps.Locker, deps.Logger, deps.Retry, classify)
	b.Retry.MaxFaults = c.MaxAttempts
	return &Driver{Base: b, cfg: c}, nil
}

// Tag keys the driver owns.
const (
	tagToken = "runway:token" // one per create call: finds duplicates
	tagName  = "Name"
	// tagSnapshot on an AMI names the snapshot its stemcell was uploaded to.
	tagSnapshot = "runway:snapshot"
	// tagNetworks maps each BOSH network of an instance to the address it
	// holds, "private" or "public" (cloudtags.EncodeNames), for list_vms.
	tagNetworks = "runway:networks"
)

// StemcellFormats: raw images uploaded through the EBS direct API, and
// light stemcells naming an existing AMI.
func (d *Driver) StemcellFormats() []string { return catalog.Formats("aws") }

// call runs one API call inside the retry budget. The CPI's policy is the
// only one that retries (the SDK's retryer is off): every attempt is
// bounded by the budget and logged once.
func call[T any](ctx context.Context, d *Driver, op string, fn func(ctx context.Context, c *ec2.Client) (T, error)) (T, error) {
	var out T
	c, _, err := d.clients(ctx)
	if err != nil {
		return out, err
	}
	err = d.Retry.Do(ctx, "aws "+op, func(ctx context.Context) error {
		var err error
		out, err = fn(ctx, c)
		return err
	})
	return out, err
}

// create runs a create call whose outcome may be unknown (a timeout, a
// reset after the request went out): before each resend it asks find for
// what an earlier attempt made (by the call's token tag) and adopts that
// instead of making another. It answers how many requests were sent: more
// than one means a duplicate may exist after all (lists lag), so callers
// sweep by token.
func create[T any](ctx context.Context, d *Driver, op string, fn func(ctx context.Context, c *ec2.Client) (T, error),
	find func(ctx context.Context, c *ec2.Client) (T, bool, error)) (T, int, error) {
	sent := 0
	out, err := call(ctx, d, op, func(ctx context.Context, c *ec2.Client) (T, error) {
		if sent > 0 {
			found, ok, err := find(ctx, c)
			if err != nil || ok {
				if ok {
					d.Log.Info("an earlier attempt made it; adopting it", "op", op)
				}
				return found, err
			}
		}
		sent++
		return fn(ctx, c)
	})
	return out, sent, err
}

// waitFor checks at once (EC2 states are often reached already), then
// after 250 ms, 1.5× longer each time up to poll_max_ms.
func (d *Driver) waitFor(ctx context.Context, what string, check func(ctx context.Context) (bool, error)) error {
	how := poll.Poll{Name: "aws", First: firstPoll, Factor: 15, CheckFirst: true}
	return d.cfg.WaitFor(ctx, how, what, d.Log.Debug, check)
}

// cidKinds: the EC2 id prefix of each kind of CID.
var cidKinds = map[string]struct{ prefix, name string }{
	"vm": {"i-", "instance (i-…)"}, "disk": {"vol-", "volume (vol-…)"},
	"snapshot": {"snap-", "snapshot (snap-…)"}, "stemcell": {"ami-", "image (ami-…)"},
}

// validCID refuses anything that is not an EC2 id of the right kind (the
// prefix, then 8 to 32 lowercase hex digits; a stemcell may end " light"),
// so a path-like or foreign CID never reaches AWS. No regexp: package
// init time is bin/cpi start-up time.
func validCID(kind, cid string) error {
	k := cidKinds[kind]
	id, ok := strings.CutPrefix(cid, k.prefix)
	if kind == "stemcell" {
		id = strings.TrimSuffix(id, " light")
	}
	ok = ok && len(id) >= 8 && len(id) <= 32
	for _, c := range id {
		ok = ok && (c >= '0' && c <= '9' || c >= 'a' && c <= 'f')
	}
	if !ok {
		return driver.Invalid("%s cid %q is not an EC2 %s id", kind, cid, k.name)
	}
	return nil
}

// ec2Tags turns a map into EC2 tags, dropping keys AWS reserves and
// truncating to EC2's limits (128-character keys, 256-character values).
func ec2Tags(m map[string]string) []types.Tag {
	out := make([]types.Tag, 0, len(m))
	for k, v := range m {
		if k == "" || len(k) >= 4 && k[:4] == "aws:" {
			continue
		}
		out = append(out, types.Tag{Key: aws.String(clip.To(k, 128)), Value: aws.String(clip.To(v, 256))})
	}
	return out
}

func tagMap(tags []types.Tag) map[string]string {
	m := make(map[string]string, len(tags))
	for _, t := range tags {
		m[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return m
}

// tagFilters selects resources carrying every tag in match.
func tagFilters(match map[string]string) []types.Filter {
	var f []types.Filter
	for k, v := range match {
		f = append(f, types.Filter{Name: aws.String("tag:" + k), Values: []string{v}})
	}
	return f
}

func tagSpec(rt types.ResourceType, m map[string]string) types.TagSpecification {
	return types.TagSpecification{ResourceType: rt, Tags: ec2Tags(m)}
}

// tagged is a kind of resource a create call tags with its token: how to
// list the ids carrying a token, and delete one.
type tagged struct {
	listOp string
	list   func(ctx context.Context, c *ec2.Client, token string) ([]string, error)
	del    func(ctx context.Context, id string) error
}

func (d *Driver) volumes() tagged {
	return tagged{"DescribeVolumes", d.volumesOfToken, func(ctx context.Context, id string) error {
		if err := d.deleteVolume(ctx, id); !errors.Is(err, driver.ErrDiskNotFound) {
			return err
		}
		return nil
	}}
}

func (d *Driver) snapshots() tagged {
	return tagged{"DescribeSnapshots", d.snapshotsOfToken, d.DeleteSnapshot}
}

// createTagged runs create (op, send) for a resource of kind k tagged
// with token, and answers its id. After more than one send a duplicate
// may exist (lists lag): whatever else carries the token is deleted — all
// of it when the create failed.
func (d *Driver) createTagged(ctx context.Context, op, token string, k tagged, send func(ctx context.Context, c *ec2.Client) (string, error)) (string, error) {
	id, sent, err := create(ctx, d, op, send, func(ctx context.Context, c *ec2.Client) (string, bool, error) {
		ids, err := k.list(ctx, c, token)
		if len(ids) == 0 {
			return "", false, err
		}
		return ids[0], true, err
	})
	if sent > 1 {
		d.sweepToken(ctx, k, token, id)
	}
	return id, err
}

// sweepToken deletes what carries token (resources of kind k), except
// keep.
func (d *Driver) sweepToken(ctx context.Context, k tagged, token, keep string) {
	ids, err := call(ctx, d, k.listOp, func(ctx context.Context, c *ec2.Client) ([]string, error) {
		return k.list(ctx, c, token)
	})
	if err != nil {
		d.Log.Warn("listing for cleanup failed", "op", k.listOp, "token", token, "err", err)
		return
	}
	for _, id := range ids {
		if id != keep {
			d.Log.Info("deleting what this create left", "id", id)
			if err := k.del(ctx, id); err != nil {
				d.Log.Warn("deleting failed", "id", id, "err", err)
			}
		}
	}
}

// describe runs one Describe call (op) about one resource (kind, id): an
// error code starting with missing, EC2's not-found family for that kind,
// is notFound.
func describe[O any](ctx context.Context, d *Driver, op, kind, id, missing string, notFound error, fn func(ctx context.Context, c *ec2.Client) (O, error)) (O, error) {
	out, err := call(ctx, d, op, fn)
	if err != nil && strings.HasPrefix(errCode(err), missing) {
		return out, fmt.Errorf("%s %s: %w", kind, id, notFound)
	}
	if err != nil {
		return out, d.cloudErr(op+" "+id, err)
	}
	return out, nil
}

// describeOne describes the resource id names and answers its first item;
// none, or one dead says is gone (naming its state), is notFound.
func describeOne[O, T any](ctx context.Context, d *Driver, op, kind, id, missing string, notFound error,
	fn func(ctx context.Context, c *ec2.Client) (O, error), items func(O) []T, dead func(T) (string, bool)) (T, error) {
	var none T
	out, err := describe(ctx, d, op, kind, id, missing, notFound, fn)
	if err != nil {
		return none, err
	}
	for _, it := range items(out) {
		if state, gone := dead(it); gone {
			return it, fmt.Errorf("%s %s is %s: %w", kind, id, state, notFound)
		}
		return it, nil
	}
	return none, fmt.Errorf("%s %s: %w", kind, id, notFound)
}
