package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// startSpawn records the intent to make one runner, then makes it in the
// background (bounded by spawn_concurrency) so a slow create_vm never
// stalls the group's reaping.
func (g *group) startSpawn(ctx context.Context, trigger int64, repo string) {
	dep := g.dep
	now := dep.now()
	name := g.cfg().Name + "-" + randHex(5)
	r := store.Runner{Name: name, Group: g.cfg().Name, AgentID: name, State: store.Spawning, TriggerJob: trigger,
		JobRepo: repo, CreatedAt: now, StateAt: now}
	g.mu.Lock()
	g.inflight[name] = true
	g.mu.Unlock()
	if err := dep.store.Save(r); err != nil {
		g.mu.Lock()
		delete(g.inflight, name)
		g.mu.Unlock()
		dep.log.Error("recording a runner", "group", g.cfg().Name, "err", err)
		return
	}
	// A retiring group stops its spawns in flight (stopSpawns).
	sctx, cancel := context.WithCancel(ctx)
	g.mu.Lock()
	if g.spawnCancels == nil {
		g.spawnCancels = map[string]context.CancelFunc{}
	}
	g.spawnCancels[name] = cancel
	g.mu.Unlock()
	g.spawns.Add(1)
	go func() {
		defer g.spawns.Done()
		defer func() {
			g.mu.Lock()
			delete(g.spawnCancels, name)
			g.mu.Unlock()
			cancel()
		}()
		ctx := sctx
		select {
		case g.spawnSem <- struct{}{}:
		case <-ctx.Done():
			return // the row stays "spawning": the next start recovers it
		}
		defer func() { <-g.spawnSem }()
		g.mu.Lock()
		g.spawnedAt[name] = dep.now() // its start-up counts from here
		g.mu.Unlock()
		err := g.spawn(ctx, r)
		g.mu.Lock()
		delete(g.inflight, name)
		g.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			// The next pass reports it, so the group backs off instead of
			// trying again at once.
			dep.log.Warn("spawn failed", "group", g.cfg().Name, "runner", name, "err", err)
			dep.event(g.cfg().Name, name, RunnerFailed, forge.Brief(err)) // events reach the group's author
			g.mu.Lock()
			g.spawnErr = errors.Join(g.spawnErr, err)
			g.spawnFailing = true
			g.mu.Unlock()
			return
		}
		g.mu.Lock()
		g.spawnFailing = false
		g.mu.Unlock()
		g.wake()
	}()
}

func (g *group) spawn(ctx context.Context, r store.Runner) error {
	dep := g.dep
	c := g.cfg()
	start := time.Now()
	if err := dep.fenced(); err != nil {
		return err
	}
	reg, err := g.demand.client().Register(ctx, g.scope, r.Name, c.Labels)
	if err != nil {
		r.LastError = "registration: " + dep.redact.Redact(err.Error())
		return errors.Join(fmt.Errorf("registering %s: %w", r.Name, err), g.destroy(ctx, r, "registration failed"))
	}
	if reg.RunnerID != 0 {
		r.ForgeRunnerID = reg.RunnerID
		if err := dep.store.Save(r); err != nil {
			return err
		}
	}
	stemcell, err := g.stemcell(ctx, c.Stemcell)
	if err != nil {
		return errors.Join(err, g.destroy(ctx, r, "no stemcell"))
	}
	env := map[string]any{
		"user_data": bootstrap(c.GroupConfig, g.forge.conf(), r.Name, reg),
		"bosh": map[string]any{"tags": map[string]any{"runway_group": c.Name, "runway_runner": r.Name,
			"runway_store": dep.store.ID()}},
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	resp, err := g.call(ctx, "create_vm", r.AgentID, stemcell, c.CloudProperties, c.Networks, nil, env)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // shutting down: recovered on the next start
		}
		r.LastError = dep.redact.Redact(err.Error())
		return errors.Join(fmt.Errorf("create_vm for %s: %w", r.Name, err), g.destroy(ctx, r, "create_vm failed"))
	}
	cid, err := vmCID(resp.Result)
	if err != nil {
		return errors.Join(err, g.destroy(ctx, r, "create_vm answer unreadable"))
	}
	r.VMCID, r.State, r.StateAt = cid, store.Idle, dep.now()
	if err := dep.store.Save(r); err != nil {
		return err
	}
	dep.metrics.spawnLatency.WithLabelValues(g.cfg().Name).Observe(time.Since(start).Seconds())
	dep.log.Info("runner created", "group", c.Name, "runner", r.Name, "vm", cid, "for_job", r.TriggerJob,
		"took", time.Since(start).Round(time.Millisecond))
	dep.event(c.Name, r.Name, RunnerCreated, "VM "+cid+" made for job "+fmt.Sprint(r.TriggerJob))
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// vmCID reads create_vm's result: "cid" (API v1) or [cid, networks] (v2).
func vmCID(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, nil
	}
	var arr []json.RawMessage
	if json.Unmarshal(raw, &arr) == nil && len(arr) > 0 && json.Unmarshal(arr[0], &s) == nil && s != "" {
		return s, nil
	}
	return "", fmt.Errorf("create_vm answered %s, not a VM CID", clip.Quote(string(raw), 120))
}

// stemcell returns the group's stemcell CID, uploading the image once and
// remembering its CID in the store (keyed by image content and cloud
// properties).
func (g *group) stemcell(ctx context.Context, sc config.StemcellConfig) (string, error) {
	if sc.CID != "" {
		return sc.CID, nil
	}
	g.dep.stemcells.mu.Lock()
	defer g.dep.stemcells.mu.Unlock()
	cpi := g.cfg().EffectiveCPI(g.dep.cpi)
	key, err := g.dep.stemcells.key(cpi.Path+"|"+cpi.Config, sc)
	if err != nil {
		return "", err
	}
	if cid, ok, err := g.dep.store.Stemcell(key); err != nil || ok {
		return cid, err
	}
	props := sc.CloudProperties
	if props == nil {
		props = map[string]any{}
	}
	resp, err := g.call(ctx, "create_stemcell", sc.Image, props)
	if err != nil {
		return "", fmt.Errorf("create_stemcell %s: %w", sc.Image, err)
	}
	var cid string
	if err := json.Unmarshal(resp.Result, &cid); err != nil || cid == "" {
		return "", fmt.Errorf("create_stemcell answered %s", clip.Quote(string(resp.Result), 120))
	}
	g.dep.log.Info("stemcell uploaded", "image", sc.Image, "cid", cid)
	kept, err := g.dep.store.PutStemcell(key, cid)
	if err != nil {
		return "", err
	}
	if kept != cid {
		// Another replica uploaded the same image meanwhile: use its
		// stemcell, remove ours.
		g.dep.log.Info("another replica uploaded the stemcell first: deleting ours", "cid", cid, "kept", kept)
		if _, err := g.call(ctx, "delete_stemcell", cid); err != nil {
			g.dep.log.Warn("deleting a duplicate stemcell", "cid", cid, "err", err)
		}
	}
	return kept, nil
}

// stemcellKey is the image's content hash with its cloud properties and
// CPI. The image is hashed again only when the file changed (another
// file, size or modification time): every spawn asks, and hashing a
// 50 MB rootfs under the lock once capped spawns near 20 a second.
// The caller holds s.mu.
func (s *stemcells) key(cpi string, sc config.StemcellConfig) (string, error) {
	if sc.Image == "" {
		// A light stemcell: its cloud properties name the image.
		h := sha256.New()
		props, _ := json.Marshal(sc.CloudProperties)
		h.Write([]byte("light\x00"))
		h.Write(props)
		h.Write([]byte(cpi))
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	f, err := os.Open(sc.Image)
	if err != nil {
		return "", fmt.Errorf("stemcell image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stemcell image: %w", err)
	}
	c, ok := s.hashes[sc.Image]
	if !ok || !os.SameFile(c.file, fi) || c.file.Size() != fi.Size() || !c.file.ModTime().Equal(fi.ModTime()) {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return "", fmt.Errorf("stemcell image: %w", err)
		}
		// The hash's state after the image, resumed below: the key stays
		// what stores made before this cache hold.
		state, err := h.(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil {
			return "", err
		}
		c = imageHash{file: fi, state: state}
		if s.hashes == nil {
			s.hashes = map[string]imageHash{}
		}
		s.hashes[sc.Image] = c
	}
	h := sha256.New()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(c.state); err != nil {
		return "", err
	}
	props, _ := json.Marshal(sc.CloudProperties)
	h.Write(props)
	h.Write([]byte(cpi))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// imageHash is the SHA-256 state after a stemcell image's content, and
// the file it was read from.
type imageHash struct {
	file  os.FileInfo
	state []byte
}

// confirm asks the forge about a job that left the listing (listings can
// skip a job that changes state between pages). It returns a reap reason,
// or "" to keep the runner; taken: another runner took the idle runner's
// trigger job. An error keeps the runner too.
func (g *group) confirm(ctx context.Context, r store.Runner) (reason string, taken bool, err error) {
	id := r.JobID
	if r.State == store.Idle {
		id = r.TriggerJob
	}
	repo := r.JobRepo
	j, err := g.demand.client().Job(ctx, forge.Job{ID: id, Repo: repo})
	if errors.Is(err, forge.ErrNotFound) {
		j, err = forge.Job{ID: id, Status: forge.StatusCompleted}, nil
	}
	if err != nil {
		g.setForgeDown(true)
		return "", false, fmt.Errorf("confirming job %d of runner %s: %w", id, r.Name, err)
	}
	g.dep.observeJob(j, false)
	mine := j.RunnerName == r.Name
	switch {
	case r.State == store.Busy && j.Status == forge.StatusCompleted:
		return reasonJobFinished, false, nil
	case r.State == store.Busy && j.RunnerName != "" && !mine:
		return "job taken over by " + j.RunnerName, false, nil
	case r.State == store.Idle && mine && j.Status == forge.StatusCompleted:
		return reasonJobFinished, false, nil
	case r.State == store.Idle && mine:
		j.Repo = repo
		g.tookJob(&r, j, g.dep.now())
		return "", false, g.dep.store.Save(r)
	case r.State == store.Idle:
		// Another runner took the job it was made for: it stays as supply
		// for the next queued job, unless it is gone (the caller sweeps).
		r.TriggerJob = 0
		return "", true, g.dep.store.Save(r)
	}
	return "", false, nil
}

// recover settles a runner whose create_vm never answered (the daemon
// died mid-call): a VM found running under its agent id is adopted — it
// may already be running a job — anything else is deleted (gone).
func (g *group) recover(ctx context.Context, r store.Runner) (gone bool, err error) {
	mine, err := g.findVMs(ctx, r.AgentID)
	if err != nil {
		return false, fmt.Errorf("recovering %s: %w", r.Name, err)
	}
	if len(mine) == 1 && mine[0].State == "running" {
		r.VMCID, r.State, r.StateAt = mine[0].CID, store.Idle, g.dep.now()
		g.dep.log.Info("adopted the VM of an interrupted spawn", "group", g.cfg().Name, "runner", r.Name, "vm", r.VMCID)
		return false, g.dep.store.Save(r)
	}
	return true, g.destroy(ctx, r, "spawn interrupted")
}
