package integration_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, all generated per suite run.
type pki struct {
	caPEM                 string
	server                tls.Certificate
	clientCert, clientKey string // file paths
	pool                  *x509.CertPool
}

func newPKI(dir string) *pki {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "runway test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	Expect(err).NotTo(HaveOccurred())
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		Expect(err).NotTo(HaveOccurred())
		kb, _ := x509.MarshalECPrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	}
	p := &pki{caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	sc, sk := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.server, err = tls.X509KeyPair(sc, sk)
	Expect(err).NotTo(HaveOccurred())
	cc, ck := issue(3, "runway-cpi", x509.ExtKeyUsageClientAuth, nil)
	p.clientCert, p.clientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	Expect(os.WriteFile(p.clientCert, cc, 0o600)).To(Succeed())
	Expect(os.WriteFile(p.clientKey, ck, 0o600)).To(Succeed())
	return p
}

// extension is a real HTTPS server requiring our client certificate.
type extension struct {
	*httptest.Server
	mu       sync.Mutex
	requests []map[string]any
	answer   func(req map[string]any, w http.ResponseWriter)
}

func startExtension(p *pki, answer func(req map[string]any, w http.ResponseWriter)) *extension {
	e := &extension{answer: answer}
	e.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &req)
		req["_path"] = r.URL.Path
		req["_query"] = r.URL.RawQuery
		req["_raw"] = string(body)
		e.mu.Lock()
		e.requests = append(e.requests, req)
		e.mu.Unlock()
		e.answer(req, w)
	}))
	e.TLS = &tls.Config{Certificates: []tls.Certificate{p.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.pool}
	e.StartTLS()
	DeferCleanup(e.Close)
	return e
}

func (e *extension) seen() []map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]map[string]any(nil), e.requests...)
}

func reply(status string, retryAfter int, msg string) func(map[string]any, http.ResponseWriter) {
	return func(req map[string]any, w http.ResponseWriter) {
		json.NewEncoder(w).Encode(map[string]any{"apiVersion": "cpi.hooks/v1", "kind": "HookResponse", "uid": req["uid"],
			"status": status, "message": msg, "retryAfterSeconds": retryAfter})
	}
}

// hookEnv is a local-driver config with a hooks section and its own
// state dir, so each case can count what was created.
type hookEnv struct {
	dir, state, hooksDir, audit, cfg string
}

func newHookEnv(hooksSection map[string]any) *hookEnv {
	dir := GinkgoT().TempDir()
	h := &hookEnv{dir: dir, state: filepath.Join(dir, "state"), hooksDir: filepath.Join(dir, "hooks.d"), audit: filepath.Join(dir, "audit.jsonl")}
	hooksSection["dir"] = h.hooksDir
	hooksSection["audit_log"] = h.audit
	if _, ok := hooksSection["script_timeout_seconds"]; !ok {
		hooksSection["script_timeout_seconds"] = 10
	}
	cfg := map[string]any{"driver": "local", "state_dir": h.state, "local": map[string]any{"stop_grace_seconds": 1}, "hooks": hooksSection}
	b, _ := json.Marshal(cfg)
	h.cfg = filepath.Join(dir, "cpi.json")
	Expect(os.WriteFile(h.cfg, b, 0o600)).To(Succeed())
	// Stop every VM the case made, through a config without hooks so no
	// hook (or a server already gone) can stand in the way.
	DeferCleanup(func() {
		plain := filepath.Join(dir, "cleanup.json")
		b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": h.state, "local": map[string]any{"stop_grace_seconds": 1}})
		os.WriteFile(plain, b, 0o600)
		entries, _ := os.ReadDir(filepath.Join(h.state, "vms"))
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				runWith(plain, request("delete_vm", 2, e.Name()))
			}
		}
	})
	return h
}

func (h *hookEnv) script(method, phase, name, body string) {
	d := filepath.Join(h.hooksDir, method+"-"+phase+".d")
	Expect(os.MkdirAll(d, 0o755)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(d, name), []byte("#!/bin/sh\n"+body), 0o755)).To(Succeed())
}

func (h *hookEnv) run(method string, args ...any) Response {
	return runWith(h.cfg, request(method, 2, args...))
}

func (h *hookEnv) auditLines() []map[string]any {
	f, err := os.Open(h.audit)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		ExpectWithOffset(1, json.Unmarshal(sc.Bytes(), &m)).To(Succeed(), "audit line is not JSON: %s", sc.Text())
		out = append(out, m)
	}
	return out
}

func (h *hookEnv) vms() int {
	entries, _ := os.ReadDir(filepath.Join(h.state, "vms"))
	n := 0
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

func (h *hookEnv) stemcell() string {
	r := h.run("create_stemcell", fx.Image, map[string]any{})
	Expect(r.Error).To(BeNil())
	return asString(r.Result)
}

func (h *hookEnv) createVM(sc string, env map[string]any) Response {
	return h.run("create_vm", "agent-h", sc, map[string]any{"user_data": "#!/bin/sh\nexec sleep 600"}, map[string]any{}, []string{}, env)
}

var _ = describeLocal("lifecycle hooks through bin/cpi", func() {
	var p *pki
	BeforeEach(func() {
		p = newPKI(GinkgoT().TempDir())
	})

	ext := func(e *extension, policy string, extra map[string]any) map[string]any {
		m := map[string]any{"name": "quota", "operations": []string{"create_vm", "create_disk"},
			"clientConfig":  map[string]any{"url": e.URL, "caBundle": p.caPEM, "clientCert": p.clientCert, "clientKey": p.clientKey},
			"failurePolicy": policy, "timeoutSeconds": 2, "settings": map[string]any{"tenant": "prod"}}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	It("a pre script that denies create_vm stops it: nothing is created, post still sees the error", func() {
		h := newHookEnv(map[string]any{})
		h.script("create_vm", "pre", "10-quota", `echo "quota for $CPI_DIRECTOR_UUID exhausted ($CPI_AGENT_ID)"; exit 3`)
		h.script("create_vm", "post", "10-observe", `echo "$CPI_POST_STATUS $CPI_POST_ERROR_TYPE" > `+filepath.Join(h.dir, "post.out"))
		sc := h.stemcell()
		r := h.createVM(sc, nil)
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::CloudError"))
		Expect(r.Error.Message).To(ContainSubstring("create_vm denied by hook script create_vm-pre.d/10-quota"))
		Expect(r.Error.Message).To(ContainSubstring("quota for it-director exhausted (agent-h)"))
		Expect(h.vms()).To(Equal(0))
		b, err := os.ReadFile(filepath.Join(h.dir, "post.out"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("error Bosh::Clouds::CloudError\n"))
		Expect(r.Log).To(ContainSubstring("hook ran phase=pre method=create_vm kind=script hook=create_vm-pre.d/10-quota outcome=deny exit=3"))
	})

	It("scripts run sorted with the CPI_ environment only; names and executability filter them", func() {
		h := newHookEnv(map[string]any{})
		out := filepath.Join(h.dir, "order")
		h.script("create_disk", "pre", "20-second", `echo second >> `+out)
		h.script("create_disk", "pre", "10-first", `echo first >> `+out+`; env | sort > `+filepath.Join(h.dir, "env")+`; pwd > `+filepath.Join(h.dir, "cwd")+`; cat $CPI_REQUEST_FILE > `+filepath.Join(h.dir, "req")+`; stat -c %a $CPI_REQUEST_FILE > `+filepath.Join(h.dir, "mode"))
		h.script("create_disk", "pre", "30-skip.sh", `echo dotted >> `+out)
		h.script("create_disk", "pre", ".hidden", `echo hidden >> `+out)
		Expect(os.WriteFile(filepath.Join(h.hooksDir, "create_disk-pre.d", "40-noexec"), []byte("#!/bin/sh\necho noexec >> "+out), 0o644)).To(Succeed())
		r := h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).To(BeNil())
		b, _ := os.ReadFile(out)
		Expect(string(b)).To(Equal("first\nsecond\n"))
		env, _ := os.ReadFile(filepath.Join(h.dir, "env"))
		for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
			Expect(line).To(Or(HavePrefix("CPI_"), HavePrefix("PATH="), HavePrefix("PWD="), HavePrefix("SHLVL="), HavePrefix("_=")), "unexpected variable %s", line)
		}
		Expect(string(env)).To(ContainSubstring("PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"))
		Expect(string(env)).To(ContainSubstring("CPI_HOOKS_PHASE=pre\n"))
		Expect(string(env)).To(ContainSubstring("CPI_OP_CODE=create_disk\n"))
		Expect(string(env)).To(ContainSubstring("CPI_OBJECT_TYPE=disk\n"))
		Expect(string(env)).To(ContainSubstring("CPI_DISK_SIZE=64\n"))
		Expect(string(env)).To(ContainSubstring("CPI_REQUEST_ID=cpi-424242\n"))
		cwd, _ := os.ReadFile(filepath.Join(h.dir, "cwd"))
		Expect(string(cwd)).To(Equal("/\n"))
		mode, _ := os.ReadFile(filepath.Join(h.dir, "mode"))
		Expect(string(mode)).To(Equal("600\n"))
		req, _ := os.ReadFile(filepath.Join(h.dir, "req"))
		Expect(string(req)).To(ContainSubstring(`"method":"create_disk"`))
		var lines []string
		for _, l := range h.auditLines() {
			lines = append(lines, fmt.Sprintf("%s %s %s %s", l["phase"], l["kind"], l["name"], l["outcome"]))
		}
		Expect(lines).To(Equal([]string{"pre script create_disk-pre.d/10-first success", "pre script create_disk-pre.d/20-second success"}))
	})

	It("a script that hangs is killed at its timeout, and one that forks a sleeper does not hold the CPI", func() {
		h := newHookEnv(map[string]any{"script_timeout_seconds": 1, "script_grace_seconds": 1})
		h.script("create_disk", "pre", "10-fork", `sleep 300 & echo $! > `+filepath.Join(h.dir, "sleeper")+`; exit 0`)
		start := time.Now()
		r := h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).To(BeNil())
		Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
		pid, _ := os.ReadFile(filepath.Join(h.dir, "sleeper"))
		Eventually(func() bool { return alive(strings.TrimSpace(string(pid))) }).Should(BeFalse(), "the forked sleeper survived")

		h.script("create_disk", "pre", "20-hang", `trap '' TERM; echo hanging; while :; do sleep 1; done`)
		r = h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("timed out after 1s"))
		last := h.auditLines()[len(h.auditLines())-1]
		Expect(last["name"]).To(Equal("create_disk-pre.d/20-hang"))
		Expect(last["outcome"]).To(Equal("fail"))
	})

	It("script output goes to a capped per-call log, never to bin/cpi's stdout", func() {
		h := newHookEnv(map[string]any{"log_cap_bytes": 1000, "log_dir": "/tmp/ignored-overridden"})
		logDir := filepath.Join(h.dir, "logs")
		b, _ := os.ReadFile(h.cfg)
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		cfg["hooks"].(map[string]any)["log_dir"] = logDir
		b, _ = json.Marshal(cfg)
		os.WriteFile(h.cfg, b, 0o600)
		h.script("has_vm", "pre", "10-chatty", `i=0; while [ $i -lt 500 ]; do echo "line $i to stdout"; echo "err $i" >&2; i=$((i+1)); done`)
		r := h.run("has_vm", fx.UnknownVM) // runRaw asserts stdout is exactly one response
		Expect(r.Error).To(BeNil())
		entries, err := os.ReadDir(logDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(entries).To(HaveLen(1))
		content, _ := os.ReadFile(filepath.Join(logDir, entries[0].Name()))
		Expect(string(content)).To(ContainSubstring("line 0 to stdout"))
		Expect(string(content)).To(ContainSubstring("bytes of output dropped: log cap 1000 reached"))
		Expect(len(content)).To(BeNumerically("<", 1200))
	})

	It("an extension over mutual TLS allows, and receives a redacted request", func() {
		e := startExtension(p, reply("Success", 0, "ok"))
		h := newHookEnv(map[string]any{"extensions": []any{ext(e, "Fail", nil)}})
		dump := filepath.Join(h.dir, "script-saw")
		h.script("create_vm", "pre", "10-dump", `env > `+dump+`; cat "$CPI_REQUEST_FILE" >> `+dump)
		sc := h.stemcell()
		canary := "canary-hook-secret-7781"
		r := h.createVM(sc, map[string]any{"bosh": map[string]any{"password": canary}, "runner_token": canary})
		Expect(r.Error).To(BeNil())
		Expect(h.vms()).To(Equal(1))
		seen := e.seen()
		Expect(seen).To(HaveLen(2)) // pre and post
		Expect(seen[0]["_path"]).To(Equal("/v1/pre/create_vm"))
		Expect(seen[1]["_path"]).To(Equal("/v1/post/create_vm"))
		Expect(seen[0]["apiVersion"]).To(Equal("cpi.hooks/v1"))
		Expect(seen[0]["kind"]).To(Equal("HookRequest"))
		Expect(seen[0]["objectType"]).To(Equal("vm"))
		Expect(seen[0]["settings"]).To(Equal(map[string]any{"tenant": "prod"}))
		Expect(seen[1]["result"].(map[string]any)["status"]).To(Equal("success"))
		for _, s := range seen {
			Expect(s["_raw"]).NotTo(ContainSubstring(canary))
			Expect(s["_raw"]).NotTo(ContainSubstring("exec sleep 600")) // user_data
		}
		audit, _ := os.ReadFile(h.audit)
		Expect(string(audit)).NotTo(ContainSubstring(canary))
		saw, err := os.ReadFile(dump)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(saw)).To(ContainSubstring("CPI_AGENT_ID=agent-h"))
		Expect(string(saw)).To(ContainSubstring(`"method":"create_vm"`))
		Expect(string(saw)).NotTo(ContainSubstring(canary))
		Expect(r.Log).NotTo(ContainSubstring(canary))
		Expect(r.Log).To(ContainSubstring("hook ran phase=pre method=create_vm kind=http hook=quota outcome=success http=200"))
	})

	It("redacts keys naming a secret in any spelling: stderr, response log, hook env, CPI_REQUEST_FILE, extension bodies, audit", func() {
		e := startExtension(p, reply("Success", 0, "ok"))
		h := newHookEnv(map[string]any{"extensions": []any{ext(e, "Fail", nil)}})
		b, _ := os.ReadFile(h.cfg)
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		cfg["log_level"] = "debug" // the request itself is logged
		b, _ = json.Marshal(cfg)
		Expect(os.WriteFile(h.cfg, b, 0o600)).To(Succeed())
		dump := filepath.Join(h.dir, "script-saw")
		h.script("create_disk", "pre", "10-dump", `env > `+dump+`; cat "$CPI_REQUEST_FILE" >> `+dump)
		spellings := []string{"password", "encryption_key", "sshKey", "private-key", "privateKey", "apiKey", "secret_access_key",
			"clientSecret", "X-Auth-Token", "Credentials", "user-data", "PassPhrase", "application_credential_secret"}
		props, nested := map[string]any{}, map[string]any{}
		ctx := map[string]any{"director_uuid": "it-director", "request_id": "cpi-redact"}
		canary := func(i int, where string) string { return fmt.Sprintf("canary-%s-%02d-x9", where, i) }
		for i, k := range spellings {
			props[k] = canary(i, "props")
			nested[k] = canary(i, "nested")
			ctx[k] = canary(i, "ctx")
		}
		props["nested"] = map[string]any{"deeper": nested}
		ctx["aws"] = map[string]any{"extra": nested} // another driver's section: carried, not used
		req, _ := json.Marshal(map[string]any{"method": "create_disk", "api_version": 2, "arguments": []any{64, props, nil}, "context": ctx})
		r := runWith(h.cfg, string(req))
		// The local driver knows none of these keys (context or cloud
		// properties): the call fails naming one, after the pre hooks saw
		// the request — and even then no value leaks anywhere.
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("unknown key"))
		raw, _ := json.Marshal(r)
		saw, err := os.ReadFile(dump)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(saw)).To(ContainSubstring(`"method":"create_disk"`))
		audit, _ := os.ReadFile(h.audit)
		places := map[string]string{"response": string(raw), "stderr": r.Stderr, "hook env and CPI_REQUEST_FILE": string(saw), "audit log": string(audit)}
		for i, s := range e.seen() {
			places[fmt.Sprintf("extension body %d", i)] = s["_raw"].(string)
		}
		Expect(r.Stderr).To(ContainSubstring("<redacted>")) // the debug request line is there, redacted
		for where, text := range places {
			for i, k := range spellings {
				for _, c := range []string{canary(i, "props"), canary(i, "nested"), canary(i, "ctx")} {
					Expect(text).NotTo(ContainSubstring(c), "%s (key %q) leaked into the %s", c, k, where)
				}
			}
		}
	})

	It("a URL with a query: the method path goes before it, and the query never reaches a message, stderr or the audit log", func() {
		const token = "qtoken-8812-secret"
		e := startExtension(p, reply("Success", 0, "ok"))
		h := newHookEnv(map[string]any{"extensions": []any{ext(e, "Fail", map[string]any{"clientConfig": map[string]any{
			"url": e.URL + "/hk?token=" + token, "caBundle": p.caPEM, "clientCert": p.clientCert, "clientKey": p.clientKey}})}})
		r := h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).To(BeNil())
		seen := e.seen()
		Expect(seen).To(HaveLen(2))
		Expect(seen[0]["_path"]).To(Equal("/hk/v1/pre/create_disk"))
		Expect(seen[0]["_query"]).To(Equal("token=" + token))

		// Unreachable: the error names the extension and its path, not the query.
		closed := e.URL
		e.Close()
		h = newHookEnv(map[string]any{"extensions": []any{ext(e, "Fail", map[string]any{"clientConfig": map[string]any{
			"url": closed + "/hk?token=" + token, "caBundle": p.caPEM, "clientCert": p.clientCert, "clientKey": p.clientKey}})}})
		r = h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("/hk/v1/pre/create_disk"))
		audit, _ := os.ReadFile(h.audit)
		raw, _ := json.Marshal(r)
		for where, text := range map[string]string{"response": string(raw), "stderr": r.Stderr, "audit log": string(audit)} {
			Expect(text).NotTo(ContainSubstring(token), "the query's token is in the %s", where)
		}
	})

	It("Failure denies even with failurePolicy Ignore", func() {
		e := startExtension(p, reply("Failure", 0, "over quota"))
		h := newHookEnv(map[string]any{"extensions": []any{ext(e, "Ignore", nil)}})
		r := h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::CloudError"))
		Expect(r.Error.Message).To(ContainSubstring("denied by hook extension quota: over quota"))
	})

	It("defer without a budget: VMCreationFailed / NoDiskSpace with ok_to_retry", func() {
		e := startExtension(p, reply("Success", 30, "quota frees at the top of the hour"))
		h := newHookEnv(map[string]any{"extensions": []any{ext(e, "Fail", nil)}})
		sc := h.stemcell()
		r := h.createVM(sc, nil)
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMCreationFailed"))
		Expect(r.Error.OkToRetry).To(BeTrue())
		Expect(r.Error.Message).To(ContainSubstring("retry after 30s"))
		Expect(h.vms()).To(Equal(0))
		r = h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::NoDiskSpace"))
		Expect(r.Error.OkToRetry).To(BeTrue())
	})

	It("defer with a budget waits and asks again; the lowest retry-after of several wins", func() {
		var mu sync.Mutex
		calls := 0
		e := startExtension(p, func(req map[string]any, w http.ResponseWriter) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if req["phase"] == "pre" && n == 1 {
				reply("Success", 1, "wait a second")(req, w)
				return
			}
			reply("Success", 0, "")(req, w)
		})
		slow := startExtension(p, reply("Success", 0, ""))
		h := newHookEnv(map[string]any{"defer_wait_budget_seconds": 5, "extensions": []any{ext(e, "Fail", nil), ext(slow, "Fail", map[string]any{"name": "second"})}})
		r := h.run("create_disk", 64, map[string]any{}, nil)
		Expect(r.Error).To(BeNil())
		Expect(r.Log).To(ContainSubstring(`deferred by a hook; waiting method=create_disk hook="extension quota" retry_after_s=1`))
		var outcomes []string
		for _, l := range h.auditLines() {
			outcomes = append(outcomes, fmt.Sprintf("%s/%s/%s", l["phase"], l["name"], l["outcome"]))
		}
		Expect(outcomes).To(Equal([]string{"pre/quota/defer", "pre/second/success", "pre/quota/success", "pre/second/success", "post/quota/success", "post/second/success"}))
	})

	DescribeTable("call errors follow failurePolicy",
		func(answer func(map[string]any, http.ResponseWriter), wantMsg string) {
			e := startExtension(p, answer)
			for _, policy := range []string{"Fail", "Ignore"} {
				h := newHookEnv(map[string]any{"extensions": []any{ext(e, policy, nil)}})
				r := h.run("create_disk", 64, map[string]any{}, nil)
				last := h.auditLines()[0]
				if policy == "Fail" {
					Expect(r.Error).NotTo(BeNil())
					Expect(r.Error.Message).To(ContainSubstring(wantMsg))
					Expect(last["outcome"]).To(Equal("error"))
				} else {
					Expect(r.Error).To(BeNil(), "Ignore must fail open")
					Expect(last["outcome"]).To(Equal("ignored"))
				}
			}
		},
		Entry("bad JSON", func(_ map[string]any, w http.ResponseWriter) { w.Write([]byte("{not json")) }, "not a HookResponse"),
		Entry("uid mismatch", func(req map[string]any, w http.ResponseWriter) {
			req["uid"] = "someone-else"
			reply("Success", 0, "")(req, w)
		}, "does not match request uid"),
		Entry("redirect refused", func(_ map[string]any, w http.ResponseWriter) {
			w.Header().Set("Location", "https://127.0.0.1:1/elsewhere")
			w.WriteHeader(http.StatusTemporaryRedirect)
		}, "answered HTTP 307"),
		Entry("oversized body", func(req map[string]any, w http.ResponseWriter) {
			w.Write([]byte(`{"uid":"` + req["uid"].(string) + `","status":"Success","message":"`))
			w.Write([]byte(strings.Repeat("x", 2<<20)))
			w.Write([]byte(`"}`))
		}, "exceeds 1048576 bytes"),
		Entry("server error", func(_ map[string]any, w http.ResponseWriter) { w.WriteHeader(503) }, "answered HTTP 503"),
		Entry("timeout", func(req map[string]any, w http.ResponseWriter) {
			time.Sleep(3 * time.Second) // the extension is slower than its 2 s timeout
			reply("Success", 0, "")(req, w)
		}, "no answer within 2s"),
	)

	It("an unreachable extension: Fail blocks, Ignore fails open", func() {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		for policy, wantErr := range map[string]bool{"Fail": true, "Ignore": false} {
			h := newHookEnv(map[string]any{"extensions": []any{map[string]any{"name": "gone", "failurePolicy": policy,
				"clientConfig": map[string]any{"url": "https://" + addr, "caBundle": p.caPEM}}}})
			r := h.run("create_disk", 64, map[string]any{}, nil)
			Expect(r.Error != nil).To(Equal(wantErr), policy)
		}
	})

	It("post hooks run on error and cannot change the answer", func() {
		e := startExtension(p, reply("Failure", 0, "post hooks only observe"))
		h := newHookEnv(map[string]any{"extensions": []any{map[string]any{"name": "observer", "phases": []string{"post"},
			"clientConfig": map[string]any{"url": e.URL, "caBundle": p.caPEM, "clientCert": p.clientCert, "clientKey": p.clientKey}}}})
		h.script("delete_vm", "post", "10-fails", `exit 1`)
		r := h.run("delete_vm", fx.UnknownVM)
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMNotFound"))
		seen := e.seen()
		Expect(seen).To(HaveLen(1))
		Expect(seen[0]["result"]).To(HaveKeyWithValue("status", "error"))
		Expect(seen[0]["result"].(map[string]any)["error"]).To(HaveKeyWithValue("type", "Bosh::Clouds::VMNotFound"))
		r = h.run("has_vm", fx.UnknownVM)
		Expect(r.Error).To(BeNil())
	})

	It("bad hook configs are CpiErrors naming the field", func() {
		for _, tc := range []struct {
			hooks map[string]any
			want  string
		}{
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "clientConfig": map[string]any{"url": "http://quota.example:80"}}}}, "must use https"},
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "timeoutSeconds": 60, "clientConfig": map[string]any{"url": "https://q"}}}}, "timeoutSeconds: must be 1 to 30"},
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "failurePolicy": "Maybe", "clientConfig": map[string]any{"url": "https://q"}}}}, "failurePolicy"},
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "operations": []string{"create_everything"}, "clientConfig": map[string]any{"url": "https://q"}}}}, `unknown method "create_everything"`},
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "clientConfig": map[string]any{"url": "https://q", "caBundle": "nope"}}}}, "caBundle: holds no PEM"},
			{map[string]any{"extensions": []any{map[string]any{"name": "x", "clientConfig": map[string]any{"url": "https://q", "clientCert": "/a"}}}}, "clientCert and clientKey go together"},
			{map[string]any{"script_timeout": 5}, `hooks: unknown key "script_timeout" (did you mean "script_timeout_seconds"?)`},
		} {
			h := newHookEnv(tc.hooks)
			r := h.run("has_vm", fx.UnknownVM)
			Expect(r.Error).NotTo(BeNil(), "%v", tc.hooks)
			Expect(r.Error.Type).To(Equal("Bosh::Clouds::CpiError"))
			Expect(r.Error.Message).To(ContainSubstring(tc.want))
		}
	})

	It("concurrent bin/cpi processes write whole audit lines", func() {
		h := newHookEnv(map[string]any{})
		h.script("has_vm", "pre", "10-a", `exit 0`)
		h.script("has_vm", "post", "10-b", `exit 0`)
		var wg sync.WaitGroup
		for i := 0; i < 24; i++ {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				h.run("has_vm", fx.UnknownVM)
			}()
		}
		wg.Wait()
		lines := h.auditLines() // fails on any torn line
		Expect(lines).To(HaveLen(48))
		uids := map[any]int{}
		for _, l := range lines {
			uids[l["uid"]]++
		}
		Expect(uids).To(HaveLen(24))
	})
})

func alive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}
