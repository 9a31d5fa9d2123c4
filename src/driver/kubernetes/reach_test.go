package kubernetes

// What a request context and a VM type's cloud properties can reach
// (issue 37, item 8): each probe of the issue, as an attacker would send
// it, refused by name with nothing made.

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// A request context moved an agent pod from the restricted namespace
// into one that admits it. Now it may name only the configured namespace
// or one of allowed_namespaces.
func TestContextNamespaceOnlyFromTheAllowList(t *testing.T) {
	c := devCluster(t)
	agentNS := c.agentNamespace(t).ns
	sc := newTestDriver(t, c, nil)
	stemcell, _ := sc.CreateStemcell(context.Background(), driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	agent := map[string]any{"bosh_agent": true, "command": []string{"sleep", "3600"}}

	cpi := cpiCaller(t, c, map[string]any{"bosh_agent": true})
	r := cpi.Call(t, map[string]any{"namespace": agentNS}, "create_vm", "moved", stemcell, agent, map[string]any{}, []string{}, map[string]any{})
	if r.Error == nil {
		cpi.Call(t, map[string]any{"namespace": agentNS}, "delete_vm", cpibin.VMCID(t, r.Result))
		t.Fatalf("create_vm with the context's namespace %s: made a VM there; want it refused", agentNS)
	}
	if !strings.Contains(r.Error.Message, `kubernetes.namespace "`+agentNS+`"`) || !strings.Contains(r.Error.Message, "allowed_namespaces") {
		t.Errorf("create_vm with the context's namespace %s: %s: %s; want a refusal naming the namespace and allowed_namespaces", agentNS, r.Error.Type, r.Error.Message)
	}

	// The host's own namespace may be named; an allowed one may be chosen.
	plain := map[string]any{"command": []string{"sleep", "3600"}}
	if r := cpi.Call(t, map[string]any{"namespace": c.ns}, "has_vm", "vm-00000000-0000-4000-8000-000000000001"); r.Error != nil {
		t.Errorf("the context naming the configured namespace: %s", r.Error.Message)
	}
	allowed := cpiCaller(t, c, map[string]any{"allowed_namespaces": []string{agentNS}})
	vm := cpibin.VMCID(t, allowed.OK(t, map[string]any{"namespace": agentNS}, "create_vm", "chosen", stemcell, plain, map[string]any{}, []string{}, map[string]any{}))
	if _, err := c.admin.CoreV1().Pods(agentNS).Get(context.Background(), vm, metav1.GetOptions{}); err != nil {
		t.Errorf("the VM in the allowed namespace %s: %v", agentNS, err)
	}
	allowed.OK(t, map[string]any{"namespace": agentNS}, "delete_vm", vm)
}

// A second context in the operator's kubeconfig was a context key away:
// a pod ran as cluster-admin in a namespace the driver's Role does not
// reach. The context key is the host's now; so is every key but
// namespace.
func TestContextCannotChooseTheIdentityOrAnyHostKey(t *testing.T) {
	c := devCluster(t)
	ctx := context.Background()
	// The operator's kubeconfig: the driver's user, and an admin context.
	kc, err := clientcmd.LoadFromFile(c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.LoadFromFile(c.adminConfig)
	if err != nil {
		t.Fatal(err)
	}
	for name, u := range admin.AuthInfos {
		kc.AuthInfos["admin-"+name] = u
		kc.Contexts["admin"] = &clientcmdapi.Context{Cluster: kc.Contexts[kc.CurrentContext].Cluster, AuthInfo: "admin-" + name}
	}
	merged := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, merged); err != nil {
		t.Fatal(err)
	}
	// A namespace the Role is not bound in.
	other := "runway-reach-" + strings.ToLower(uuid.NewString()[:8])
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.admin.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{}) })
	d := newTestDriver(t, c, nil)
	stemcell, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})

	cpi := cpiCaller(t, c, map[string]any{"kubeconfig": merged})
	r := cpi.Call(t, map[string]any{"context": "admin", "namespace": other}, "create_vm", "admin", stemcell,
		map[string]any{"command": []string{"sleep", "3600"}}, map[string]any{}, []string{}, map[string]any{})
	if pods, _ := c.admin.CoreV1().Pods(other).List(ctx, metav1.ListOptions{}); len(pods.Items) > 0 {
		t.Errorf("a pod was made in %s as the admin context: %s", other, pods.Items[0].Name)
	}
	if r.Error == nil || !strings.Contains(r.Error.Message, `"context" configures the host and cannot come from a request context`) {
		t.Errorf("the context's context key: %+v; want it refused as the host's", r.Error)
	}

	// Every key of the section but namespace is the host's, whichever
	// layer of the context it comes in.
	for _, key := range configKeys() {
		if key == "namespace" {
			continue
		}
		for _, layer := range []map[string]any{{key: true}, {"kubernetes": map[string]any{key: true}}} {
			r := cpi.Call(t, layer, "has_vm", "vm-00000000-0000-4000-8000-000000000001")
			if r.Error == nil || !strings.Contains(r.Error.Message, `"`+key+`" configures the host`) {
				t.Errorf("context %v: %+v; want %q refused as the host's", layer, r.Error, key)
			}
		}
	}
}

// configKeys are the top-level keys of the kubernetes section.
func configKeys() []string {
	var out []string
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// A VM type named a cluster-admin service account, a system priority
// class, another team's pull secret, a runtime class, more CPUs and
// memory than the operator offers, and another owner's claim through
// create_vm's disk_cids: each refused by name, nothing made.
func TestCloudPropertiesReachOnlyWhatTheConfigAllows(t *testing.T) {
	c := devCluster(t)
	t.Cleanup(func() { assertNoneLeft(t, c) })
	ctx := context.Background()
	id := strings.ToLower(uuid.NewString()[:8])
	// What the cluster has that the driver must not hand out.
	sa := "reach-admin-" + id
	if _, err := c.admin.CoreV1().ServiceAccounts(c.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.admin.CoreV1().ServiceAccounts(c.ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: c.ns}}}
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	pull := "other-team-pull-" + id
	if _, err := c.admin.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pull}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.admin.CoreV1().Secrets(c.ns).Delete(context.Background(), pull, metav1.DeleteOptions{}) })
	foreign := diskPrefix + uuid.NewString()
	if _, err := c.admin.CoreV1().PersistentVolumeClaims(c.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: foreign, Labels: map[string]string{labelOwner: "other-team", labelKind: "disk"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &c.class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("16Mi")}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.admin.CoreV1().PersistentVolumeClaims(c.ns).Delete(context.Background(), foreign, metav1.DeleteOptions{})
	})

	d := newTestDriver(t, c, nil)
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	sleep := []string{"sleep", "3600"}
	for _, tc := range []struct {
		name  string
		props map[string]any
		disks []string
		want  []string
		is    error
	}{
		{"a cluster-admin service account", map[string]any{"service_account_name": sa}, nil,
			[]string{"cloud_properties.service_account_name", sa, "kubernetes.allowed_service_accounts"}, driver.ErrInvalidInput},
		{"a system priority class", map[string]any{"priority_class_name": "system-node-critical"}, nil,
			[]string{"cloud_properties.priority_class_name", "kubernetes.allowed_priority_classes"}, driver.ErrInvalidInput},
		{"another team's pull secret", map[string]any{"image_pull_secrets": []map[string]string{{"name": pull}}}, nil,
			[]string{"cloud_properties.image_pull_secrets[0].name", pull, "kubernetes.allowed_image_pull_secrets"}, driver.ErrInvalidInput},
		{"a runtime class", map[string]any{"runtime_class_name": "runc"}, nil,
			[]string{"cloud_properties.runtime_class_name", "kubernetes.allowed_runtime_classes"}, driver.ErrInvalidInput},
		{"more CPUs than offered", map[string]any{"cpu": defaultMaxCPU + 1}, nil, []string{"cloud_properties.cpu", "kubernetes.max_cpu"}, driver.ErrInvalidInput},
		{"more memory than offered", map[string]any{"ram": defaultMaxRAM + 1}, nil, []string{"cloud_properties.ram", "kubernetes.max_ram"}, driver.ErrInvalidInput},
		{"another owner's claim", map[string]any{}, []string{foreign}, []string{foreign}, driver.ErrDiskNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.props["command"] = sleep
			vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "reach", StemcellCID: sc, CloudProps: driver.PropsOf(tc.props), DiskCIDs: tc.disks})
			if err == nil {
				d.DeleteVM(ctx, vm.CID)
				t.Fatalf("create_vm made %s; want it refused", vm.CID)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("create_vm: %v; want %v", err, tc.is)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("create_vm: %v; want it to name %s", err, w)
				}
			}
		})
	}

	// The operator's maxima, set lower, hold too.
	small := newTestDriver(t, c, map[string]any{"max_cpu": 1, "max_ram": 128})
	for _, props := range []map[string]any{{"cpu": 2}, {"ram": 129}} {
		if _, err := small.CreateVM(ctx, driver.VMSpec{AgentID: "reach", StemcellCID: sc, CloudProps: driver.PropsOf(props)}); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("create_vm %v under max_cpu 1, max_ram 128: %v; want it refused", props, err)
		}
	}
}

// A pod gets a service account token only when its VM type names a
// service account the config allows: a default VM has none; an allowed
// one has exactly that account's.
func TestServiceAccountTokenOnlyWhenAllowedAndAsked(t *testing.T) {
	c := devCluster(t)
	t.Cleanup(func() { assertNoneLeft(t, c) })
	ctx := context.Background()
	sa := "reach-sa-" + strings.ToLower(uuid.NewString()[:8])
	if _, err := c.admin.CoreV1().ServiceAccounts(c.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.admin.CoreV1().ServiceAccounts(c.ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
	})
	d := newTestDriver(t, c, map[string]any{"allowed_service_accounts": []string{sa}})
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	const tokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	look := "[ -e " + tokenDir + "/token ] && echo token || echo none"
	for _, tc := range []struct {
		props map[string]any
		want  string
	}{{map[string]any{}, "none\n"}, {map[string]any{"service_account_name": sa}, "token\n"}} {
		tc.props["command"] = []string{"sleep", "3600"}
		vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "token", StemcellCID: sc, CloudProps: driver.PropsOf(tc.props)})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.exec(t, vm.CID, "sh", "-c", look); got != tc.want {
			t.Errorf("VM %v: %q; want %q", tc.props, got, tc.want)
		}
		pod, _ := c.admin.CoreV1().Pods(c.ns).Get(ctx, vm.CID, metav1.GetOptions{})
		if want := tc.props["service_account_name"]; want != nil && pod.Spec.ServiceAccountName != want {
			t.Errorf("pod's service account %q; want %v", pod.Spec.ServiceAccountName, want)
		}
		if err := d.DeleteVM(ctx, vm.CID); err != nil {
			t.Fatal(err)
		}
	}
}
