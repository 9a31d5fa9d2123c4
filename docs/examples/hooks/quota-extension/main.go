// Command quota-extension is an example Runway HTTP runtime extension (not
// part of bin/cpi): it allows at most -max VMs per deployment and DEFERS
// create_vm beyond that ("retry after N seconds") instead of failing it.
// It learns what exists from post hooks of create_vm and delete_vm.
//
//	go run ./docs/examples/hooks/quota-extension -listen 127.0.0.1:8443 -max 10
//
// Register it in the CPI config's hooks.extensions with operations
// ["create_vm", "delete_vm"] and phases ["pre", "post"]. Plain http is
// accepted by bin/cpi for loopback only; give -cert/-key for https.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync"
)

type request struct {
	UID       string `json:"uid"`
	Phase     string `json:"phase"`
	Method    string `json:"method"`
	Arguments []any  `json:"arguments"`
	Result    *struct {
		Status string `json:"status"`
		Value  any    `json:"value"`
	} `json:"result"`
}

type response struct {
	APIVersion        string `json:"apiVersion"`
	Kind              string `json:"kind"`
	UID               string `json:"uid"`
	Status            string `json:"status"`
	Message           string `json:"message,omitempty"`
	RetryAfterSeconds int    `json:"retryAfterSeconds"`
}

type quota struct {
	mu         sync.Mutex
	max        int
	retryAfter int
	vms        map[string]string // vm cid → deployment
}

// deployment reads bosh.groups[1] from create_vm's environment argument.
func deployment(args []any) string {
	if len(args) < 6 {
		return ""
	}
	env, _ := args[5].(map[string]any)
	bosh, _ := env["bosh"].(map[string]any)
	groups, _ := bosh["groups"].([]any)
	if len(groups) > 1 {
		s, _ := groups[1].(string)
		return s
	}
	return ""
}

func (q *quota) handle(req request) response {
	resp := response{APIVersion: "cpi.hooks/v1", Kind: "HookResponse", UID: req.UID, Status: "Success"}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case req.Method == "create_vm" && req.Phase == "pre":
		dep := deployment(req.Arguments)
		n := 0
		for _, d := range q.vms {
			if d == dep {
				n++
			}
		}
		if n >= q.max {
			resp.RetryAfterSeconds = q.retryAfter
			resp.Message = fmt.Sprintf("deployment %q has %d of %d VMs", dep, n, q.max)
		}
	case req.Method == "create_vm" && req.Phase == "post" && req.Result != nil && req.Result.Status == "success":
		cid, _ := req.Result.Value.(string)
		if pair, ok := req.Result.Value.([]any); ok && len(pair) > 0 {
			cid, _ = pair[0].(string)
		}
		q.vms[cid] = deployment(req.Arguments)
	case req.Method == "delete_vm" && req.Phase == "post" && req.Result != nil:
		if len(req.Arguments) > 0 {
			cid, _ := req.Arguments[0].(string)
			delete(q.vms, cid)
		}
	}
	return resp
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "address to serve on")
	max := flag.Int("max", 10, "VMs allowed per deployment")
	retryAfter := flag.Int("retry-after", 60, "seconds to defer create_vm when the quota is full")
	cert := flag.String("cert", "", "TLS certificate (PEM); plain http without it")
	key := flag.String("key", "", "TLS key (PEM)")
	flag.Parse()
	q := &quota{max: *max, retryAfter: *retryAfter, vms: map[string]string{}}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || r.Method != http.MethodPost {
			http.Error(w, "expected a HookRequest POST", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(q.handle(req))
	})
	log.Printf("quota extension on %s: max %d VMs per deployment", *listen, *max)
	if *cert != "" {
		log.Fatal(http.ListenAndServeTLS(*listen, *cert, *key, nil))
	}
	log.Fatal(http.ListenAndServe(*listen, nil))
}
