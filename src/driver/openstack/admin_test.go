package openstack

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
)

// admin reads the whole cloud with the admin credentials the dev cloud's
// fixtures.env names, to audit what the driver left behind.
type admin struct{ d *Driver }

func newAdmin(t *testing.T, c cloud) *admin {
	t.Helper()
	user, project, pw := os.Getenv("RUNWAY_OS_ADMIN_USER"), os.Getenv("RUNWAY_OS_ADMIN_PROJECT"), os.Getenv("RUNWAY_OS_ADMIN_PASSWORD")
	if user == "" || pw == "" {
		t.Fatal("RUNWAY_OS_ADMIN_USER/PROJECT/PASSWORD are not set (fixtures.env of scripts/openstack-dev)")
	}
	d, _ := newTestDriver(t, cloud{authURL: c.authURL, user: user, password: pw, project: project, region: c.region}, "", "", nil)
	return &admin{d: d}
}

// get reads a path under one service's endpoint into a map.
func (a *admin) get(t *testing.T, kind, path string) (map[string]any, error) {
	t.Helper()
	sc, err := a.d.client(context.Background(), kind)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	_, err = sc.Get(context.Background(), sc.Endpoint+path, &out, &gophercloud.RequestOpts{OkCodes: []int{200}})
	return out, err
}

func (a *admin) list(t *testing.T, kind, path, key string) []map[string]any {
	t.Helper()
	out, err := a.get(t, kind, path)
	if err != nil {
		t.Fatalf("admin list %s %s: %v", kind, path, err)
	}
	items, _ := out[key].([]any)
	var res []map[string]any
	for _, i := range items {
		if m, ok := i.(map[string]any); ok {
			res = append(res, m)
		}
	}
	return res
}

type port struct {
	ID          string
	Description string
	DeviceID    string
	Tags        []string
	IPs         []string
}

func (p port) FixedIP() string {
	if len(p.IPs) == 0 {
		return ""
	}
	return p.IPs[0]
}

func (a *admin) ports(t *testing.T, query string) []port {
	var out []port
	for _, m := range a.list(t, "network", "v2.0/ports?"+query, "ports") {
		p := port{ID: fmt.Sprint(m["id"]), DeviceID: fmt.Sprint(m["device_id"]), Description: fmt.Sprint(m["description"])}
		for _, tg := range anySlice(m["tags"]) {
			p.Tags = append(p.Tags, fmt.Sprint(tg))
		}
		for _, ip := range anySlice(m["fixed_ips"]) {
			if im, ok := ip.(map[string]any); ok {
				p.IPs = append(p.IPs, fmt.Sprint(im["ip_address"]))
			}
		}
		out = append(out, p)
	}
	return out
}

func anySlice(v any) []any { s, _ := v.([]any); return s }

// leftovers lists, in every project, what carries the creator tag key=val.
func (a *admin) leftovers(t *testing.T, key, val string) []string {
	tag := key + "=" + val
	var left []string
	for _, s := range a.list(t, "compute", "servers/detail?all_tenants=1&tags="+tag, "servers") {
		left = append(left, fmt.Sprintf("server %v (%v)", s["id"], s["status"]))
	}
	// By tag, and by the description runway sets at creation (a port of a
	// killed create may have no tags yet).
	for _, p := range a.ports(t, "") {
		if slices.Contains(p.Tags, tag) || slices.Contains(strings.Fields(p.Description), tag) {
			left = append(left, "port "+p.ID)
		}
	}
	for _, v := range a.list(t, "volume", "volumes/detail?all_tenants=1", "volumes") {
		if md, _ := v["metadata"].(map[string]any); md[key] == val {
			left = append(left, fmt.Sprintf("volume %v (%v)", v["id"], v["status"]))
		}
	}
	for _, s := range a.list(t, "volume", "snapshots/detail?all_tenants=1", "snapshots") {
		if md, _ := s["metadata"].(map[string]any); md[key] == val {
			left = append(left, fmt.Sprintf("snapshot %v (%v)", s["id"], s["status"]))
		}
	}
	for _, i := range a.list(t, "image", "v2/images?tag="+tag, "images") {
		left = append(left, fmt.Sprintf("image %v (%v)", i["id"], i["status"]))
	}
	return left
}

func assertNoLeftovers(t *testing.T, c cloud, who string) {
	t.Helper()
	assertNoneTagged(t, c, "created_by", who)
}

func assertNoneTagged(t *testing.T, c cloud, key, val string) {
	t.Helper()
	if left := newAdmin(t, c).leftovers(t, key, val); len(left) > 0 {
		t.Errorf("left behind (%s=%s):\n  %s", key, val, strings.Join(left, "\n  "))
	}
}
