// Package cloudtags is what cloud drivers write into tags and metadata:
// merged maps, and name → value pairs packed into one value.
package cloudtags

import (
	"sort"
	"strings"
)

// Merge returns one map with every map's entries, later ones winning.
func Merge(maps ...map[string]string) map[string]string {
	n := 0
	for _, m := range maps {
		n += len(m)
	}
	out := make(map[string]string, n)
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// EncodeNames packs name → value pairs into one tag or metadata value,
// "a=x,b=y" sorted by name, at most limit bytes: cloud drivers keep each
// BOSH network's name on the VM this way, so list_vms can answer by it.
// Pairs that hold ',' or '=' or do not fit are left out.
func EncodeNames(m map[string]string, limit int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v := m[k]
		if k == "" || strings.ContainsAny(k+v, ",=") {
			continue
		}
		n := len(k) + 1 + len(v)
		if b.Len() > 0 {
			n++
		}
		if b.Len()+n > limit {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + v)
	}
	return b.String()
}

// DecodeNames reads what EncodeNames wrote.
func DecodeNames(s string) map[string]string {
	out := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(pair, "="); ok && k != "" {
			out[k] = v
		}
	}
	return out
}
