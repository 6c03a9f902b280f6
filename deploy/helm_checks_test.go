package deploy

// The cross-checks of a rendered chart against the code it deploys (see
// helm_test.go): config, ports, routes, shutdown bounds, credentials,
// autoscalers, RBAC, NetworkPolicies and ServiceMonitors.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/sluice-dev/sluice/pkg/config"
)

// check runs every cross-check of one rendering.
func (r *rendered) check(t *testing.T, bins []string) {
	t.Helper()
	api := r.deployment(t, helmRelease+"-api")
	worker := r.deployment(t, helmRelease+"-worker")
	if api == nil || worker == nil {
		t.FailNow()
	}
	r.checkPods(t, bins)
	apiCfg := r.loadConfig(t, api)
	workerCfg := r.loadConfig(t, worker)
	if apiCfg == nil || workerCfg == nil {
		t.FailNow()
	}
	r.checkAPI(t, api, *apiCfg)
	r.checkWorker(t, worker, *workerCfg)
	r.checkServices(t)
	r.checkDependencies(t, *apiCfg)
	r.checkCredentials(t, api, worker)
	r.checkAutoscaling(t, api, worker, *workerCfg)
	r.checkScalerRBAC(t, *workerCfg, api, worker)
	r.checkNetworkPolicies(t, *apiCfg, api, worker)
	checkTrustedProxies(t, *apiCfg)
	r.checkMonitors(t)
	for _, p := range r.pdbs {
		if n := r.selectedDeployments(p.Spec.Selector.MatchLabels); len(n) != 1 {
			t.Errorf("PodDisruptionBudget %s selects Deployments %v, want one", p.Name, n)
		}
	}
}

func (r *rendered) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	d, ok := r.deployments[name]
	if !ok || len(d.Spec.Template.Spec.Containers) != 1 {
		t.Errorf("want a Deployment %s with one container", name)
		return nil
	}
	return d
}

// checkPods: one image, a built binary each, resources, non-root with a
// read-only root filesystem, selectors that select their own pods.
func (r *rendered) checkPods(t *testing.T, bins []string) {
	image := ""
	for name, d := range r.deployments {
		pod := d.Spec.Template.Spec
		c := pod.Containers[0]
		if image == "" {
			image = c.Image
		}
		if c.Image != image {
			t.Errorf("Deployment %s runs %s; every Sluice container runs one image (%s)", name, c.Image, image)
		}
		if len(c.Command) == 0 || !slices.Contains(bins, c.Command[0]) {
			t.Errorf("Deployment %s: command %q names none of the image's binaries %v", name, c.Command, bins)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("Deployment %s: want cpu and memory requests and a memory limit, got %+v", name, c.Resources)
		}
		psc, csc := pod.SecurityContext, c.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Errorf("Deployment %s: pod does not run as a non-root user", name)
		}
		if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
			csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities == nil ||
			!slices.Contains(csc.Capabilities.Drop, "ALL") {
			t.Errorf("Deployment %s: want a read-only root fs, no privilege escalation and all capabilities dropped", name)
		}
		if d.Spec.Selector == nil || !labelsMatch(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			t.Errorf("Deployment %s: selector does not select its own pods", name)
		}
		mounts := map[string]bool{}
		for _, v := range pod.Volumes {
			mounts[v.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !mounts[m.Name] {
				t.Errorf("Deployment %s mounts unknown volume %s", name, m.Name)
			}
		}
	}
}

// loadConfig loads the config a Sluice container reads (its -config file,
// from the mounted ConfigMap) as the binary would: alone, then with the
// container's environment, whose SLUICE_* names must all be settings.
func (r *rendered) loadConfig(t *testing.T, d *appsv1.Deployment) *config.Config {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	path := flagValue(c.Args, "-config", "")
	data, ok := r.mountedConfig(d, path)
	if !ok {
		t.Errorf("Deployment %s: -config %q is no key of a mounted ConfigMap", d.Name, path)
		return nil
	}
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, nil)
	if err != nil {
		t.Errorf("Deployment %s: the rendered config does not load: %v", d.Name, err)
		return nil
	}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "from-secret"
		}
		env = append(env, e.Name+"="+v)
	}
	if _, err := config.Load(file, env); err != nil {
		t.Errorf("Deployment %s: config with the container's environment does not load: %v", d.Name, err)
	}
	// TLS files the config names must be mounted from a Secret.
	for _, f := range []string{cfg.Temporal.TLS.CertFile, cfg.Temporal.TLS.KeyFile, cfg.Temporal.TLS.CAFile} {
		if f != "" && !mountedFromSecret(d, f) {
			t.Errorf("Deployment %s: config names %s, which no mounted Secret provides", d.Name, f)
		}
	}
	return &cfg
}

func (r *rendered) mountedConfig(d *appsv1.Deployment, path string) (string, bool) {
	for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
		if filepath.Dir(path) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				if cm, ok := r.configMaps[v.ConfigMap.Name]; ok {
					data, ok := cm.Data[filepath.Base(path)]
					return data, ok
				}
			}
		}
	}
	return "", false
}

func mountedFromSecret(d *appsv1.Deployment, path string) bool {
	for _, m := range d.Spec.Template.Spec.Containers[0].VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && filepath.Dir(path) == filepath.Clean(m.MountPath) {
				return true
			}
		}
	}
	return false
}

// checkAPI: the port the config listens on, probes on routes the API
// serves, the preStop hook, and a grace period covering every step of
// the shutdown.
func (r *rendered) checkAPI(t *testing.T, d *appsv1.Deployment, cfg config.Config) {
	c := d.Spec.Template.Spec.Containers[0]
	port := checkListenAddr(t, "api config api.addr", cfg.API.Addr)
	checkHelmProbe(t, "api startupProbe", c, c.StartupProbe, port, "/healthz")
	checkHelmProbe(t, "api livenessProbe", c, c.LivenessProbe, port, "/healthz")
	checkHelmProbe(t, "api readinessProbe", c, c.ReadinessProbe, port, "/readyz")
	if cfg.Metrics.Addr == "" {
		t.Error("api: metrics.addr is empty, so the public port serves /metrics")
	} else if mp := checkListenAddr(t, "api config metrics.addr", cfg.Metrics.Addr); mp == port {
		t.Errorf("api: metrics.addr shares the public port %s", port)
	} else if p, ok := containerPort(c, "metrics"); !ok || p != mp {
		t.Errorf("api: container port \"metrics\" is %q, want the one metrics.addr listens on (%s)", p, mp)
	}
	checkAuthOff(t, "chart config", cfg)
	var preStop time.Duration
	if l := c.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Exec == nil || len(l.PreStop.Exec.Command) != 2 || l.PreStop.Exec.Command[0] != "sleep" {
		t.Errorf("api: want a preStop hook `sleep N` (the pod leaving the Service's endpoints), got %+v", c.Lifecycle)
	} else if d, err := time.ParseDuration(l.PreStop.Exec.Command[1] + "s"); err != nil {
		t.Errorf("api: preStop sleep %q: %v", l.PreStop.Exec.Command[1], err)
	} else {
		preStop = d
	}
	if cfg.API.DrainDelay <= 0 {
		t.Errorf("api: api.drain_delay is %s; /readyz should fail a while before the listener closes", cfg.API.DrainDelay)
	}
	checkStopsInTime(t, "api", cfg)
	need := preStop + cfg.API.DrainDelay + cfg.API.ShutdownTimeout + cfg.Temporal.WorkerStopTimeout
	checkGrace(t, d, need)
}

// checkWorker: metrics on metrics.worker_addr's port, probes on the route
// the worker serves, and a grace period beyond its stop timeout.
func (r *rendered) checkWorker(t *testing.T, d *appsv1.Deployment, cfg config.Config) {
	c := d.Spec.Template.Spec.Containers[0]
	port := checkListenAddr(t, "worker config metrics.worker_addr", cfg.Metrics.WorkerAddr)
	for what, p := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe} {
		checkHelmProbe(t, "worker "+what, c, p, port, "")
	}
	if len(c.Ports) != 1 {
		t.Errorf("worker: ports %+v, want only the metrics port", c.Ports)
	}
	checkStopsInTime(t, "worker", cfg)
	checkGrace(t, d, cfg.Temporal.WorkerStopTimeout)
}

// checkStopsInTime: a stopping worker lets every answer in flight finish,
// however many attempts it took.
func checkStopsInTime(t *testing.T, what string, cfg config.Config) {
	longest := cfg.LLM.Timeout * time.Duration(cfg.LLM.MaxAttempts)
	if cfg.Temporal.WorkerStopTimeout < longest {
		t.Errorf("%s: temporal.worker_stop_timeout %s is shorter than the longest answer (llm.timeout × llm.max_attempts = %s)",
			what, cfg.Temporal.WorkerStopTimeout, longest)
	}
}

func checkGrace(t *testing.T, d *appsv1.Deployment, need time.Duration) {
	g := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil || time.Duration(*g)*time.Second <= need {
		t.Errorf("Deployment %s: terminationGracePeriodSeconds %v, want more than %s (its shutdown steps)", d.Name, g, need)
	}
}

// checkHelmProbe checks an httpGet probe: the port the process listens on
// and a route the binary serves (wantPath, if given).
func checkHelmProbe(t *testing.T, what string, c corev1.Container, p *corev1.Probe, listenPort, wantPath string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: missing (want an httpGet probe)", what)
		return
	}
	if wantPath != "" && p.HTTPGet.Path != wantPath {
		t.Errorf("%s: path %s, want %s", what, p.HTTPGet.Path, wantPath)
	}
	if port, ok := containerPort(c, p.HTTPGet.Port.String()); !ok || port != listenPort {
		t.Errorf("%s: port %s resolves to %q, but the process listens on %s", what, p.HTTPGet.Port.String(), port, listenPort)
	}
	if c.Command[0] == "sluice-worker" {
		checkMetricsServerRoute(t, what, p.HTTPGet.Path)
		return
	}
	checkRoute(t, what, c.Command[0], p.HTTPGet.Path)
}

// checkMetricsServerRoute checks that the metrics server (the worker's,
// and the API's on metrics.addr) serves GET path, as registered on its mux
// in app.
func checkMetricsServerRoute(t *testing.T, what, path string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "app", "app.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), `mux.Handle("GET `+path+`"`) {
		t.Errorf("%s: sluice-worker serves no GET %s", what, path)
	}
}

// containerPort resolves a port name or number to the container's port.
func containerPort(c corev1.Container, port string) (string, bool) {
	for _, p := range c.Ports {
		if port == p.Name || port == fmt.Sprint(p.ContainerPort) {
			return fmt.Sprint(p.ContainerPort), true
		}
	}
	return "", false
}

func (r *rendered) selectedDeployments(selector map[string]string) []string {
	var names []string
	for name, d := range r.deployments {
		if len(selector) > 0 && labelsMatch(selector, d.Spec.Template.Labels) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// checkServices: each Service selects one Deployment and targets one of
// its container ports.
func (r *rendered) checkServices(t *testing.T) {
	for name, s := range r.services {
		targets := r.selectedDeployments(s.Spec.Selector)
		if len(targets) != 1 {
			t.Errorf("Service %s selects Deployments %v, want exactly one", name, targets)
			continue
		}
		c := r.deployments[targets[0]].Spec.Template.Spec.Containers[0]
		for _, p := range s.Spec.Ports {
			if _, ok := containerPort(c, p.TargetPort.String()); !ok {
				t.Errorf("Service %s: targetPort %s is no port of %s", name, p.TargetPort.String(), targets[0])
			}
		}
	}
}

// dependencyAddrs are the addresses the config dials, by field.
func dependencyAddrs(cfg config.Config) map[string]string {
	deps := map[string]string{"temporal.host_port": cfg.Temporal.HostPort}
	if cfg.Redis.Addr != "" {
		deps["redis.addr"] = cfg.Redis.Addr
	}
	for i, a := range cfg.Redis.Addrs {
		deps[fmt.Sprintf("redis.addrs[%d]", i)] = a
	}
	for i, e := range cfg.Pools.Short.Endpoints {
		deps[fmt.Sprintf("pools.short.endpoints[%d]", i)] = e
	}
	for i, e := range cfg.Pools.Long.Endpoints {
		deps[fmt.Sprintf("pools.long.endpoints[%d]", i)] = e
	}
	return deps
}

// checkDependencies: nothing on loopback, and an address that names a
// Service of the release uses that Service's port.
func (r *rendered) checkDependencies(t *testing.T, cfg config.Config) {
	for field, addr := range dependencyAddrs(cfg) {
		host, port, err := splitAddr(addr)
		if err != nil {
			t.Errorf("config %s %q: %v", field, addr, err)
			continue
		}
		if isLoopback(host) {
			t.Errorf("config %s is %s, the container itself", field, addr)
			continue
		}
		if s, ok := r.services[clusterServiceName(host, helmNamespace)]; ok {
			if len(s.Spec.Ports) == 0 || fmt.Sprint(s.Spec.Ports[0].Port) != port {
				t.Errorf("config %s %s: Service %s does not listen on %s", field, addr, s.Name, port)
			}
		}
	}
}

// checkCredentials: the admin key (API only) and the other credentials
// come from a Secret, which either the chart renders with the admin key
// in it or the user names (existingSecret).
func (r *rendered) checkCredentials(t *testing.T, api, worker *appsv1.Deployment) {
	refs := func(d *appsv1.Deployment) map[string]*corev1.SecretKeySelector {
		out := map[string]*corev1.SecretKeySelector{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Value != "" && strings.HasPrefix(e.Name, config.EnvPrefix) && strings.Contains(e.Name, "KEY") {
				t.Errorf("Deployment %s: %s is written in the manifest; want it from a Secret", d.Name, e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out[e.Name] = e.ValueFrom.SecretKeyRef
			}
		}
		return out
	}
	apiRefs, workerRefs := refs(api), refs(worker)
	admin := apiRefs[config.EnvPrefix+"AUTH_ADMIN_KEY"]
	if admin == nil || (admin.Optional != nil && *admin.Optional) {
		t.Fatalf("Deployment %s: want SLUICE_AUTH_ADMIN_KEY from a Secret, not optional", api.Name)
	}
	if _, ok := workerRefs[config.EnvPrefix+"AUTH_ADMIN_KEY"]; ok {
		t.Errorf("Deployment %s reads the admin key, which only the API needs", worker.Name)
	}
	for _, name := range []string{"REDIS_PASSWORD", "TEMPORAL_API_KEY"} {
		a, w := apiRefs[config.EnvPrefix+name], workerRefs[config.EnvPrefix+name]
		if a == nil || w == nil || a.Name != admin.Name || w.Name != admin.Name {
			t.Errorf("SLUICE_%s: want it in both Deployments from the Secret %s", name, admin.Name)
		}
	}
	if s, ok := r.secrets[admin.Name]; ok {
		if len(s.Data[admin.Key]) == 0 {
			t.Errorf("Secret %s has no %s", s.Name, admin.Key)
		}
	} else if len(r.secrets) > 0 {
		t.Errorf("the chart renders Secrets %v but the API reads the admin key from %s", keys(r.secrets), admin.Name)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkAutoscaling: the API's HPA scales the API; the worker has at most
// one autoscaler, and a KEDA trigger watches the task queue the worker
// polls on the server it dials, with the worker's own credentials.
func (r *rendered) checkAutoscaling(t *testing.T, api, worker *appsv1.Deployment, cfg config.Config) {
	scaled := map[string]int{}
	for _, h := range r.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || r.deployments[ref.Name] == nil {
			t.Errorf("HorizontalPodAutoscaler %s scales %s/%s, no Deployment of the chart", h.Name, ref.Kind, ref.Name)
		}
		scaled[ref.Name]++
		if len(h.Spec.Metrics) == 0 || h.Spec.MinReplicas == nil || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
			t.Errorf("HorizontalPodAutoscaler %s: want metrics and minReplicas <= maxReplicas", h.Name)
		}
	}
	for _, so := range r.scaledObjs {
		ref := so.Spec.ScaleTargetRef
		if ref.Name != worker.Name {
			t.Errorf("ScaledObject %s scales %q, want the worker %s", so.Name, ref.Name, worker.Name)
		}
		scaled[ref.Name]++
		if len(so.Spec.Triggers) == 0 {
			t.Errorf("ScaledObject %s has no triggers", so.Name)
		}
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "temporal" {
				t.Errorf("ScaledObject %s: trigger %q, want temporal", so.Name, tr.Type)
				continue
			}
			want := map[string]string{"endpoint": cfg.Temporal.HostPort, "namespace": cfg.Temporal.Namespace, "taskQueue": cfg.Temporal.TaskQueue}
			for k, v := range want {
				if tr.Metadata[k] != v {
					t.Errorf("ScaledObject %s: trigger %s is %q; the worker's config says %q", so.Name, k, tr.Metadata[k], v)
				}
			}
			if tr.Metadata["targetQueueSize"] == "" {
				t.Errorf("ScaledObject %s: trigger has no targetQueueSize", so.Name)
			}
			r.checkTriggerAuth(t, so.Name, tr.AuthenticationRef, worker, cfg)
		}
	}
	if scaled[api.Name] != 1 {
		t.Errorf("the API has %d autoscalers, want its CPU HPA", scaled[api.Name])
	}
	if scaled[worker.Name] > 1 {
		t.Errorf("the worker has %d autoscalers; they would fight", scaled[worker.Name])
	}
	for _, d := range []*appsv1.Deployment{api, worker} {
		if scaled[d.Name] > 0 && d.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas and is autoscaled: every upgrade would reset it", d.Name)
		}
	}
}

// checkTriggerAuth: KEDA dials Temporal as the worker does, with the
// client certificate the worker mounts or its API key.
func (r *rendered) checkTriggerAuth(t *testing.T, so string, ref *struct {
	Name string `json:"name"`
}, worker *appsv1.Deployment, cfg config.Config) {
	mtls := cfg.Temporal.TLS.CertFile != ""
	if ref == nil {
		if mtls {
			t.Errorf("ScaledObject %s: Temporal needs a client certificate, but the trigger has no authenticationRef", so)
		}
		return
	}
	ta, ok := r.triggerAuths[ref.Name]
	if !ok {
		t.Errorf("ScaledObject %s: authenticationRef %s is not rendered", so, ref.Name)
		return
	}
	params := map[string]string{}
	for _, s := range ta.Spec.SecretTargetRef {
		if s.Parameter == "" || s.Name == "" || s.Key == "" {
			t.Errorf("TriggerAuthentication %s: secretTargetRef %+v lacks parameter, name or key", ta.Name, s)
		}
		params[s.Parameter] = s.Name + "/" + s.Key
	}
	if mtls {
		var secret string
		for _, v := range worker.Spec.Template.Spec.Volumes {
			if v.Secret != nil && mountedFromSecret(worker, cfg.Temporal.TLS.CertFile) {
				secret = v.Secret.SecretName
			}
		}
		for _, p := range []string{"cert", "key"} {
			if !strings.HasPrefix(params[p], secret+"/") {
				t.Errorf("TriggerAuthentication %s: %s is %q, want the worker's client certificate Secret %s", ta.Name, p, params[p], secret)
			}
		}
	}
}

// checkScalerRBAC: the healer's Kubernetes scaler may get and patch the
// scale of exactly the Deployments the config names, from the service
// account the pods run as; without it no token is mounted.
func (r *rendered) checkScalerRBAC(t *testing.T, cfg config.Config, pods ...*appsv1.Deployment) {
	want := map[string][]string{} // namespace -> Deployments
	for _, p := range []config.Pool{cfg.Pools.Short, cfg.Pools.Long} {
		if s := p.Scaler; s.Kind == config.ScalerKubernetes {
			ns := s.Namespace
			if ns == "" {
				ns = helmNamespace
			}
			want[ns] = append(want[ns], s.Deployment)
		}
	}
	sa := pods[0].Spec.Template.Spec.ServiceAccountName
	for _, d := range pods {
		spec := d.Spec.Template.Spec
		if spec.ServiceAccountName != sa {
			t.Errorf("Deployment %s runs as %s, the API as %s: the healer runs in both", d.Name, spec.ServiceAccountName, sa)
		}
		mounted := spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken
		if mounted != (len(want) > 0) {
			t.Errorf("Deployment %s: automountServiceAccountToken %v, but a Kubernetes scaler is configured: %v", d.Name, mounted, len(want) > 0)
		}
	}
	got := map[string][]string{}
	for _, role := range r.roles {
		if len(role.Rules) != 1 {
			t.Errorf("Role %s/%s: %d rules, want the one for deployments/scale", role.Namespace, role.Name, len(role.Rules))
			continue
		}
		rule := role.Rules[0]
		if !slices.Equal(rule.APIGroups, []string{"apps"}) || !slices.Equal(rule.Resources, []string{"deployments/scale"}) ||
			!slices.Equal(rule.Verbs, []string{"get", "patch"}) || len(rule.ResourceNames) == 0 {
			t.Errorf("Role %s/%s: rule %+v, want get and patch on apps deployments/scale of named Deployments", role.Namespace, role.Name, rule)
		}
		got[role.Namespace] = append(got[role.Namespace], rule.ResourceNames...)
		bound := false
		for _, b := range r.bindings {
			if b.Namespace == role.Namespace && b.RoleRef.Kind == "Role" && b.RoleRef.Name == role.Name {
				for _, s := range b.Subjects {
					bound = bound || (s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == helmNamespace)
				}
			}
		}
		if !bound {
			t.Errorf("Role %s/%s is not bound to the pods' service account %s", role.Namespace, role.Name, sa)
		}
	}
	for ns := range want {
		slices.Sort(want[ns])
		slices.Sort(got[ns])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("RBAC lets the scaler scale %v; the config's Kubernetes scalers name %v", got, want)
	}
	if len(r.bindings) != len(r.roles) {
		t.Errorf("%d RoleBindings for %d Roles", len(r.bindings), len(r.roles))
	}
	if _, ok := r.accounts[sa]; !ok && sa != "default" {
		t.Errorf("the pods' service account %s is not rendered", sa)
	}
}

// checkNetworkPolicies: the API takes clients on its port, the worker
// only scrapes on its metrics port; both may reach DNS and every port the
// config dials.
func (r *rendered) checkNetworkPolicies(t *testing.T, cfg config.Config, api, worker *appsv1.Deployment) {
	if len(r.policies) == 0 {
		t.Error("no NetworkPolicies rendered")
		return
	}
	var dialed []string
	for _, addr := range dependencyAddrs(cfg) {
		if _, port, err := splitAddr(addr); err == nil {
			dialed = append(dialed, port)
		}
	}
	for _, d := range []*appsv1.Deployment{api, worker} {
		var np *networkingv1.NetworkPolicy
		for _, p := range r.policies {
			if labelsMatch(p.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
				np = p
			}
		}
		if np == nil {
			t.Errorf("Deployment %s: no NetworkPolicy selects its pods", d.Name)
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		var ingress []string
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				port, ok := containerPort(c, p.Port.String())
				if !ok {
					t.Errorf("NetworkPolicy %s: ingress port %s is no port of %s", np.Name, p.Port.String(), d.Name)
				}
				ingress = append(ingress, port)
			}
		}
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, fmt.Sprint(p.ContainerPort))
		}
		if slices.Sort(ingress); !slices.Equal(ingress, slices.Sorted(slices.Values(ports))) {
			t.Errorf("NetworkPolicy %s: ingress on %v, want exactly %s's ports %v", np.Name, ingress, d.Name, c.Ports)
		}
		if d == api {
			checkAPIFrom(t, np)
		}
		egress := map[string]bool{}
		for _, rule := range np.Spec.Egress {
			for _, p := range rule.Ports {
				egress[p.Port.String()] = true
			}
		}
		for _, port := range append([]string{"53"}, dialed...) {
			if !egress[port] {
				t.Errorf("NetworkPolicy %s: no egress to port %s, which %s dials", np.Name, port, d.Name)
			}
		}
	}
}

// checkAPIFrom: the API's port admits only the peers named for it (the
// ingress in front), never anyone: a rule without peers, a peer that
// selects every pod, or an address block of everyone would let any pod
// talk to the API and, were its network trusted, name its client.
func checkAPIFrom(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	for _, rule := range np.Spec.Ingress {
		if !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == "http" }) {
			continue
		}
		if len(rule.From) == 0 {
			t.Errorf("NetworkPolicy %s: the API's port admits anyone; want only the ingress (networkPolicy.apiFrom)", np.Name)
		}
		for _, peer := range rule.From {
			everyPod := peer.PodSelector != nil && len(peer.PodSelector.MatchLabels) == 0 && len(peer.PodSelector.MatchExpressions) == 0
			everyone := peer.IPBlock != nil && strings.HasSuffix(peer.IPBlock.CIDR, "/0")
			if everyPod || everyone || (peer.PodSelector == nil && peer.IPBlock == nil) {
				t.Errorf("NetworkPolicy %s: the API's port admits %+v, which is not one ingress's pods", np.Name, peer)
			}
		}
	}
}

// checkTrustedProxies: the proxies whose X-Forwarded-For is believed are
// named narrowly, never a pod network (a /16 or wider), where any pod
// could name its client as it liked.
func checkTrustedProxies(t *testing.T, cfg config.Config) {
	t.Helper()
	for _, p := range cfg.API.TrustedProxyPrefixes() {
		if (p.Addr().Is4() && p.Bits() <= 16) || (p.Addr().Is6() && p.Bits() <= 48) {
			t.Errorf("api.trusted_proxies trusts %s, a network as wide as a cluster's pods; want the ingress's own addresses", p)
		}
	}
}

// checkMonitors: each ServiceMonitor scrapes a named port of a Service of
// the chart, on a path its process serves.
func (r *rendered) checkMonitors(t *testing.T) {
	for _, m := range r.monitors {
		var svc *corev1.Service
		for _, s := range r.services {
			if len(m.Spec.Selector.MatchLabels) > 0 && labelsMatch(m.Spec.Selector.MatchLabels, s.Labels) {
				svc = s
			}
		}
		if svc == nil || len(m.Spec.Endpoints) == 0 {
			t.Errorf("ServiceMonitor %s selects no Service of the chart, or has no endpoints", m.Name)
			continue
		}
		c := r.deployments[r.selectedDeployments(svc.Spec.Selector)[0]].Spec.Template.Spec.Containers[0]
		for _, e := range m.Spec.Endpoints {
			named := slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port })
			if !named {
				t.Errorf("ServiceMonitor %s: port %q is no port of Service %s", m.Name, e.Port, svc.Name)
			}
			if e.Port == "metrics" || c.Command[0] == "sluice-worker" {
				checkMetricsServerRoute(t, "ServiceMonitor "+m.Name, e.Path)
			} else {
				checkRoute(t, "ServiceMonitor "+m.Name, c.Command[0], e.Path)
			}
		}
	}
}
