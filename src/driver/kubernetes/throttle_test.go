package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// The API server's own fairness limits (a priority level of about three
// seats that rejects the rest, for the driver's user only) answer 429 with
// Retry-After; every call still succeeds, waited out, and nothing is lost.
func TestThrottledByTheAPIServer(t *testing.T) {
	c := devCluster(t)
	ctx := context.Background()
	const level = "runway-test-throttle"
	fc := c.admin.FlowcontrolV1()
	if _, err := fc.PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: level},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](1), LendablePercent: ptr.To[int32](0),
				BorrowingLimitPercent: ptr.To[int32](0),
				LimitResponse:         flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.PriorityLevelConfigurations().Delete(ctx, level, metav1.DeleteOptions{}) })
	if _, err := fc.FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: level},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level},
			MatchingPrecedence:         500,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser,
					User: &flowcontrolv1.UserSubject{Name: "runway-cpi"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"},
					Resources: []string{"*"}, Namespaces: []string{c.ns}}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.FlowSchemas().Delete(ctx, level, metav1.DeleteOptions{}) })
	// In force once the server has seen both (the schema no longer dangling).
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		fs, err := fc.FlowSchemas().Get(ctx, level, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range fs.Status.Conditions {
			if cond.Type == flowcontrolv1.FlowSchemaConditionDangling {
				return cond.Status == flowcontrolv1.ConditionFalse, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("flow schema %s not in force: %v", level, err)
	}
	before := rejected(t, c, level)

	// As many bin/cpi processes at once: each its own driver (its own
	// client-side limiter), all starting together, one call each. The
	// server's Retry-After grows while it keeps rejecting: more calls
	// only make the test slower. On a loaded machine the callers may not
	// overlap enough to be refused: another round then, up to ten.
	const callers = 12
	start, n := time.Now(), 0
	for round := 0; round < 10 && n == 0 && !t.Failed(); round++ {
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		ready := make(chan struct{})
		for i := range callers {
			d := newTestDriver(t, c, nil)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				if ok, err := d.HasVM(ctx, fmt.Sprintf("vm-00000000-0000-0000-0000-%012d", i)); err != nil || ok {
					errs <- fmt.Errorf("has_vm: %v, %v; want false, nil", ok, err)
				}
			}()
		}
		close(ready)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		n = rejected(t, c, level) - before
		t.Logf("round %d: %d calls, %d answered 429 by the server so far, %.1f s", round+1, callers, n, time.Since(start).Seconds())
	}
	if n == 0 {
		t.Error("the server rejected none of the calls in ten rounds: the test throttled nothing")
	}
}

// rejected reads how many requests the API server has rejected at the
// priority level (its apiserver_flowcontrol_rejected_requests_total).
func rejected(t *testing.T, c cluster, level string) int {
	t.Helper()
	raw, err := c.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the API server's metrics: %v", err)
	}
	total := 0
	for _, m := range fams["apiserver_flowcontrol_rejected_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "priority_level" && l.GetValue() == level {
				total += int(m.GetCounter().GetValue())
			}
		}
	}
	return total
}
