// Package kubernetes is the Kubernetes driver: pods as VMs, persistent
// volume claims as disks, images as stemcells, in one namespace, through
// client-go (docs/kubernetes.md).
package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/clouddeps"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

func init() {
	driver.Register(driver.Registration{Section: config.Section{Name: "kubernetes", Config: &Config{}, ContextKeys: contextKeys},
		New: func(section json.RawMessage, deps driver.Deps) (driver.Driver, error) {
			if err := checkContext(section, deps.Host); err != nil {
				return nil, err
			}
			return New(section, deps.Locker, deps.Logger, deps.Retry)
		},
	})
}

// Driver talks to one namespace of one cluster.
type Driver struct {
	cfg Config
	cs  k8s.Interface
	dyn dynamic.Interface // VolumeSnapshots (nil: snapshots not implemented)
	ns  string
	clouddeps.Base
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Snapshotter = (*Driver)(nil)
)

// New builds the driver; the cluster is first asked when a method needs it.
func New(section json.RawMessage, locks *lock.Locker, log logging.Logger, policy retry.Policy) (*Driver, error) {
	c, err := parseConfig(section)
	if err != nil {
		return nil, err
	}
	rc, err := restConfig(c)
	if err != nil {
		return nil, err
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return &Driver{cfg: c, cs: cs, dyn: dyn, ns: c.Namespace, Base: clouddeps.New("kubernetes", locks, log, policy, classify)}, nil
}

// NewWithClient is New over a given clientset (tests).
func NewWithClient(section json.RawMessage, cs k8s.Interface, locks *lock.Locker, log logging.Logger, policy retry.Policy) (*Driver, error) {
	c, err := parseConfig(section)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: c, cs: cs, ns: c.Namespace, Base: clouddeps.New("kubernetes", locks, log, policy, classify)}, nil
}

func restConfig(c Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if c.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no kubeconfig given and not in a cluster: %w", err)
		}
	} else {
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig}
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
			&clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes.kubeconfig %s: %w", c.Kubeconfig, err)
		}
	}
	rc.QPS, rc.Burst = c.QPS, c.Burst
	rc.UserAgent = "runway-cpi"
	return rc, nil
}

// classify sorts API errors for the retry budget: 429 (with its
// Retry-After) is a throttle, 5xx and timeouts are transient.
func classify(err error) retry.Verdict {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		code := se.Status().Code
		switch {
		case code == 429:
			v := retry.Verdict{Class: retry.Throttle}
			if s, ok := apierrors.SuggestsClientDelay(err); ok {
				v.RetryAfter = time.Duration(s) * time.Second
			}
			return v
		case code >= 500 || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err):
			return retry.Verdict{Class: retry.Transient}
		}
		return retry.Verdict{Class: retry.Permanent}
	}
	return retry.Network(err)
}

// do runs one API call within the retry budget.
func (d *Driver) do(ctx context.Context, op string, fn func(context.Context) error) error {
	return d.Retry.Do(ctx, op, fn)
}

// Labels and annotations the driver owns.
const (
	labelOwner   = "runway.io/owner"
	labelKind    = "runway.io/kind" // vm | disk | settings
	labelVM      = "runway.io/vm"
	annoPrefix   = "runway.io/tag."  // a tag or metadata key, its value exactly
	annoOddTags  = "runway.io/tags"  // JSON: tags whose keys cannot end an annotation key
	labelPrefix  = "tags.runway.io/" // the same when Kubernetes' label rules allow it
	annoAgentID  = "runway.io/agent-id"
	annoStemcell = "runway.io/stemcell"
)

// ownLabels are the labels of an object of kind the driver makes.
func (d *Driver) ownLabels(kind string) map[string]string {
	return map[string]string{labelOwner: d.cfg.Owner, labelKind: kind}
}

// tagMeta spreads tags over labels (where key and value meet Kubernetes'
// label rules) and annotations (always, exactly): one each where the key
// can end an annotation key, else in one JSON annotation, merged with what
// annos holds there already.
func tagMeta(tags map[string]string, labels, annos map[string]string) {
	odd := map[string]string{}
	_ = json.Unmarshal([]byte(annos[annoOddTags]), &odd)
	for k, v := range tags {
		if len(validation.IsQualifiedName(annoPrefix+k)) == 0 {
			annos[annoPrefix+k] = v
		} else {
			odd[k] = v
		}
		if len(validation.IsQualifiedName(labelPrefix+k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			labels[labelPrefix+k] = v
		} else {
			delete(labels, labelPrefix+k)
		}
	}
	delete(annos, annoOddTags)
	if len(odd) > 0 {
		b, _ := json.Marshal(odd)
		annos[annoOddTags] = string(b)
	}
}

// tagsOf reads the tags back from annotations.
func tagsOf(annos map[string]string) map[string]string {
	out := map[string]string{}
	_ = json.Unmarshal([]byte(annos[annoOddTags]), &out)
	for k, v := range annos {
		if t, ok := strings.CutPrefix(k, annoPrefix); ok {
			out[t] = v
		}
	}
	return out
}

// validName refuses a CID that is not one the driver makes (prefix-<uuid>
// in Kubernetes' name rules), so a foreign or path-like CID never reaches
// the API.
func validName(kind, prefix, cid string) (string, error) {
	rest, ok := strings.CutPrefix(cid, prefix)
	if !ok || len(rest) != 36 || len(validation.IsDNS1123Label(cid)) > 0 {
		return "", driver.Invalid("%s cid %q is not one this driver makes (%s<uuid>)", kind, cid, prefix)
	}
	return cid, nil
}
