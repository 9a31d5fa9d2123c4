package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	giteav1 "github.com/runway-cpi/runway/src/controller/apis/gitea/v1alpha1"
	runwayv1 "github.com/runway-cpi/runway/src/controller/apis/runway/v1alpha1"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// reconcile brings one object's part of the engine's set and its status
// up to date.
func (c *Controller) reconcile(ctx context.Context, key string) error {
	kind, rest, _ := strings.Cut(key, "/")
	ns, name, _ := strings.Cut(rest, "/")
	inf := c.infs[kind][ns]
	if inf == nil {
		inf = c.infs[kind][metav1.NamespaceAll]
	}
	if inf == nil {
		return nil // a namespace not watched
	}
	o, exists, err := inf.GetStore().GetByKey(ns + "/" + name)
	if err != nil {
		return err
	}
	if !exists {
		c.mu.Lock()
		if e := c.entries[key]; e != nil && e.group != nil && c.byGroup[e.group.Name] == key {
			delete(c.byGroup, e.group.Name)
		}
		delete(c.entries, key)
		c.mu.Unlock()
		return c.apply()
	}
	u := o.(*unstructured.Unstructured)
	c.mu.Lock()
	old := c.entries[key]
	c.mu.Unlock()
	e := c.build(kind, u, old)
	if kind != kindForge && !e.deleting && !slices.Contains(u.GetFinalizers(), Finalizer) {
		// The update that follows brings the object back here.
		return c.setFinalizers(ctx, kind, u, append(u.GetFinalizers(), Finalizer))
	}
	c.mu.Lock()
	c.entries[key] = e
	if e.group != nil {
		c.byGroup[e.group.Name] = key
	}
	c.mu.Unlock()
	if err := c.apply(); err != nil {
		return err
	}
	c.check(ctx, e)
	if err := c.writeStatus(ctx, key, e, u); err != nil {
		return err
	}
	if e.deleting && slices.Contains(u.GetFinalizers(), Finalizer) {
		return c.release(ctx, kind, e, u)
	}
	return nil
}

// build turns an object into its entry: its forge, its group, or why
// not. old is the entry the object had (its group is kept for a
// deletion that can no longer be read: it still has runners to remove).
func (c *Controller) build(kind string, u *unstructured.Unstructured, old *entry) *entry {
	e := &entry{kind: kind, ns: u.GetNamespace(), name: u.GetName(), generation: u.GetGeneration(), uid: string(u.GetUID()),
		deleting: u.GetDeletionTimestamp() != nil}
	if old != nil {
		e.checkKey, e.checkErr, e.written, e.writtenAt = old.checkKey, old.checkErr, old.written, old.writtenAt
	}
	var err error
	switch kind {
	case kindSeed:
		err = c.buildSeed(e, u)
	case kindForge:
		err = c.buildForge(e, u)
	case kindGroup:
		err = c.buildGroup(e, u)
	}
	if err != nil {
		nr, ok := err.(*notReady)
		if !ok {
			nr = &notReady{ReasonInvalid, err.Error()}
		}
		e.bad, e.group = nr, nil
		if old != nil && old.group != nil {
			// The engine keeps the last config that worked (a Secret gone
			// or a Forge broken stops nothing that runs; the condition
			// says why), and a deleted group retires with it.
			e.group, e.forge = old.group, old.forge
		}
	}
	if e.group != nil && e.deleting {
		g := *e.group
		g.Retire = true
		e.group = &g
	}
	return e
}

func (c *Controller) buildSeed(e *entry, u *unstructured.Unstructured) error {
	var rg giteav1.RunnerGroup
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rg); err != nil {
		return err
	}
	an, _ := rg.Spec.AuthToken.Ref()
	rn, _ := rg.Spec.RegistrationToken.Ref()
	e.secrets = []string{e.ns + "/" + an, e.ns + "/" + rn}
	fc, gc, token, hook, err := seedGroup(&rg, c.opt.Seed, c.readSecret)
	if err != nil {
		return err
	}
	return c.accept(e, fc, &gc, forgeSecrets{token: token, hook: hook})
}

func (c *Controller) buildForge(e *entry, u *unstructured.Unstructured) error {
	var f runwayv1.Forge
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &f); err != nil {
		return err
	}
	e.secrets = secretRefs(e.ns, f.Spec.Token, f.Spec.WebhookSecret)
	if f.Spec.GitHubConfigSecret != "" {
		e.secrets = append(e.secrets, e.ns+"/"+f.Spec.GitHubConfigSecret)
	}
	fc, sec, err := runwayForge(&f, c.readSecret)
	if err != nil {
		return err
	}
	return c.accept(e, fc, nil, sec)
}

func (c *Controller) buildGroup(e *entry, u *unstructured.Unstructured) error {
	var rg runwayv1.RunnerGroup
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rg); err != nil {
		return err
	}
	e.forgeRef = keyOf(kindForge, e.ns, rg.Spec.Forge)
	c.mu.Lock()
	fe := c.entries[e.forgeRef]
	c.mu.Unlock()
	switch {
	case fe == nil:
		return &notReady{ReasonForgeMissing, fmt.Sprintf("spec.forge: no Forge %s/%s", e.ns, rg.Spec.Forge)}
	case fe.bad != nil:
		return &notReady{fe.bad.reason, fmt.Sprintf("spec.forge: Forge %s/%s: %s", e.ns, rg.Spec.Forge, fe.bad.msg)}
	}
	e.secrets = fe.secrets
	gc, err := runwayGroup(&rg, fe.forge.Name)
	if err != nil {
		return err
	}
	fc := *fe.forge
	if err := validate(&fc, &gc); err != nil {
		return err
	}
	if a, ok := fc.Secrets.(config.AppSource); ok && gc.Scope == "enterprise" {
		if id, _, _ := a.App(); id != "" {
			return &notReady{ReasonInvalid, fmt.Sprintf("spec.scope: GitHub does not let an App register enterprise runners: Forge %s/%s needs a classic PAT (github_token) with manage_runners:enterprise", e.ns, rg.Spec.Forge)}
		}
	}
	e.forge, e.group = &fc, &gc
	return nil
}

// accept validates a forge (and a group of it) as the engine will, and
// keeps them with the forge's secrets.
func (c *Controller) accept(e *entry, fc config.ForgeConfig, gc *config.GroupConfig, sec forgeSecrets) error {
	field := "spec.url"
	if e.kind == kindSeed {
		field = "spec.gitea.url"
	}
	if err := c.opt.Addresses.checkURL(field, fc.URL); err != nil {
		return err
	}
	if c.opt.Addresses != nil {
		fc.Guard = c.opt.Addresses
	}
	c.mu.Lock()
	src := c.sources[fc.Name]
	if src == nil {
		src = &secretSource{}
		c.sources[fc.Name] = src
	}
	c.mu.Unlock()
	src.set(sec.token, sec.hook, sec.app)
	fc.Secrets = src
	if err := validate(&fc, gc); err != nil {
		return err
	}
	e.forge, e.group = &fc, gc
	return nil
}

// validate holds a forge and group to the engine's rules (config's), the
// way the engine will when they are handed over.
// The defaults it fills are kept.
func validate(fc *config.ForgeConfig, gc *config.GroupConfig) error {
	forges := []config.ForgeConfig{*fc}
	var groups []config.GroupConfig
	if gc != nil {
		groups = append(groups, *gc)
	}
	err := config.PrepareSet(forges, groups)
	*fc = forges[0]
	if gc != nil {
		*gc = groups[0]
	}
	if err != nil {
		return &notReady{ReasonInvalid, strings.ReplaceAll(strings.Join(inItems(err), "; "), "\n", "; ")}
	}
	return nil
}

// inItems says each of the engine's refusals of one forge and group by
// the field within it ("group labels: ..."), not the engine's list
// index, which means nothing on the object.
func inItems(err error) []string {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []string
	for _, err := range errs {
		var fe *config.FieldError
		if errors.As(err, &fe) && fe.List != "" {
			out = append(out, strings.TrimSuffix(fe.List, "s")+" "+fe.InItem()+": "+fe.Msg)
		} else {
			out = append(out, err.Error())
		}
	}
	return out
}

// apply hands the engine the whole set the objects make, when it
// changed. A group the engine refuses is marked invalid, and the rest
// handed over without it.
func (c *Controller) apply() error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	for range 8 {
		forges, groups, keys := c.set()
		if reflect.DeepEqual(c.last, setOf{forges, groups}) {
			return nil
		}
		err := c.opt.Engine.Replace(forges, groups)
		if err == nil {
			c.last = setOf{forges, groups}
			return nil
		}
		// A group at fault is left out; anything else stops the hand-over.
		var fe *config.FieldError
		if !errors.As(err, &fe) || fe.List != "groups" || fe.Index < 0 || fe.Index >= len(keys) {
			return fmt.Errorf("the engine refused the set: %w", err)
		}
		c.mu.Lock()
		if e := c.entries[keys[fe.Index]]; e != nil {
			e.bad, e.group = &notReady{ReasonInvalid, c.opt.Redactor.Redact(err.Error())}, nil
		}
		c.mu.Unlock()
	}
	return fmt.Errorf("the engine keeps refusing the set")
}

type setOf struct {
	forges []config.ForgeConfig
	groups []config.GroupConfig
}

// set is the engine's set: every group that can be handed over (those
// being deleted marked Retire), their forges; keys[i] is groups[i]'s.
func (c *Controller) set() ([]config.ForgeConfig, []config.GroupConfig, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.entries))
	for key, e := range c.entries {
		if e.group != nil && e.forge != nil {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	byName := map[string]config.ForgeConfig{}
	groups := make([]config.GroupConfig, 0, len(keys))
	for _, key := range keys {
		e := c.entries[key]
		byName[e.forge.Name] = *e.forge
		groups = append(groups, *e.group)
	}
	forges := make([]config.ForgeConfig, 0, len(byName))
	for _, f := range byName {
		forges = append(forges, f)
	}
	sort.Slice(forges, func(a, b int) bool { return forges[a].Name < forges[b].Name })
	return forges, groups, keys
}

// check asks the forge, once per spec and Secrets, whether the group's
// token can do what it needs (runway check).
func (c *Controller) check(ctx context.Context, e *entry) {
	if e.group == nil || e.deleting {
		return
	}
	key := fmt.Sprint(e.generation, e.forge.URL, e.forge.Secrets.Token())
	if a, ok := e.forge.Secrets.(config.AppSource); ok {
		id, inst, k := a.App()
		key += fmt.Sprint(id, inst, k)
	}
	if key == e.checkKey {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	e.checkErr = c.opt.Engine.Check(cctx, *e.forge, *e.group)
	e.checkKey = key // the engine logs what the forge said; the status has it briefly
}

// setFinalizers writes the object's finalizers (optimistically: a
// conflict is retried by the queue).
func (c *Controller) setFinalizers(ctx context.Context, kind string, u *unstructured.Unstructured, fins []string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": fins, "resourceVersion": u.GetResourceVersion()}})
	_, err := c.opt.Dyn.Resource(gvrs[kind]).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), mergePatch, patch, metav1PatchOptions)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// release drops the finalizer of a group being deleted once the engine
// has removed everything it had (or never had it).
func (c *Controller) release(ctx context.Context, kind string, e *entry, u *unstructured.Unstructured) error {
	if e.group != nil {
		st, ok := c.opt.Engine.State(e.group.Name)
		if ok && !st.Retired {
			return nil // the status loop brings it back
		}
	}
	c.opt.Log.Info("group's runners gone: releasing it", "object", kind+"/"+e.ns+"/"+e.name)
	return c.setFinalizers(ctx, kind, u, slices.DeleteFunc(slices.Clone(u.GetFinalizers()), func(f string) bool { return f == Finalizer }))
}
