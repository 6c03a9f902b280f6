package deploy

// The Helm chart under helm/sluice is checked the way the k8s/ manifests
// are: `helm lint` (plain and --strict) and `helm template` with the
// default values and a production-like values file; every rendered object
// decoded strictly into its Kubernetes API type (an unknown or misspelt
// field fails), the KEDA objects checked for their required fields, and
// the rendered config, ports, routes, credentials and RBAC checked against
// the code. The helm binary is bin/helm (`make helm`, which `make test`
// runs first).

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	helmChart     = "helm/sluice"
	helmRelease   = "sluice"
	helmNamespace = "sluice"
)

// The values files the chart is rendered with ("" is the defaults).
var helmValues = []string{"", "helm/sluice/ci/production-values.yaml"}

// helmBinary is $SLUICE_TEST_HELM_BIN (the Makefile sets it to bin/helm),
// else bin/helm, else helm on PATH. A missing binary that the Makefile
// named is an error; run alone without one, the Helm tests skip.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_TEST_HELM_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SLUICE_TEST_HELM_BIN=%s: %v (make helm builds it)", p, err)
		}
		return p
	}
	if p := filepath.Join(repoRoot(t), "bin", "helm"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Skip("no helm binary: run `make helm`")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, errOut.String(), out.String())
	}
	return out.String(), err
}

func valuesArgs(file string) []string {
	if file == "" {
		return nil
	}
	return []string{"-f", file}
}

func valuesName(file string) string {
	if file == "" {
		return "default values"
	}
	return filepath.Base(file)
}

func TestHelmLint(t *testing.T) {
	for _, file := range helmValues {
		for _, strict := range []bool{false, true} {
			args := append([]string{"lint", helmChart}, valuesArgs(file)...)
			if strict {
				args = append(args, "--strict")
			}
			if _, err := runHelm(t, args...); err != nil {
				t.Errorf("%s: %v", valuesName(file), err)
			}
		}
	}
}

// values.schema.json turns bad values into lint errors; without it these
// would render and fail only in the cluster, or silently do nothing.
func TestHelmSchemaRejectsBadValues(t *testing.T) {
	for _, c := range []struct{ set, want string }{
		{"api.port=http", "/api/port"},
		{"bogus=1", "additional properties 'bogus'"},
		{"worker.autoscaling.keda.queueTypes=tasks", "/worker/autoscaling/keda/queueTypes"},
		{"config.api.addr=0.0.0.0:9000", "/config/api/addr"},
		{"config.llm.timeout=1m", "/config/llm/timeout"},
		{"config.temporal.worker_stop_timeout=1m", "/config/temporal/worker_stop_timeout"},
		{"config.auth.admin_key=plain", "/config/auth/admin_key"},
		{"llm.maxAttempts=0", "/llm/maxAttempts"},
		{"serviceMonitor.interval=often", "/serviceMonitor/interval"},
	} {
		_, err := runHelm(t, "lint", helmChart, "--strict", "--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm lint --set %s: %v; want an error naming %s", c.set, err, c.want)
		}
	}
	// What the schema cannot say, the templates refuse with a message.
	for _, c := range []struct{ set, want string }{
		{"simulator.enabled=false", "config.pools.short.endpoints: list your LLM servers' URLs"},
		{"worker.autoscaling.keda.enabled=true,worker.autoscaling.hpa.enabled=true", "enable keda or hpa, not both"},
		{"temporal.tls.enabled=true", "temporal.tls.existingSecret"},
		{"temporal.apiKey=true", "temporal.apiKey: set secret.temporalAPIKey"},
		{"networkPolicy.apiFrom=null", "networkPolicy.apiFrom: name who may reach the API's port"},
	} {
		_, err := runHelm(t, "template", helmRelease, helmChart, "--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm template --set %s: %v; want %q", c.set, err, c.want)
		}
	}
}

func TestHelmTemplate(t *testing.T) {
	bins := dockerBinaries(t)
	for _, file := range helmValues {
		t.Run(valuesName(file), func(t *testing.T) {
			args := append([]string{"template", helmRelease, helmChart, "--namespace", helmNamespace}, valuesArgs(file)...)
			out, err := runHelm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			r := decodeRendered(t, out)
			r.check(t, bins)
		})
	}
}

// rendered holds a chart's objects by kind and name, each decoded into its
// API type.
type rendered struct {
	deployments  map[string]*appsv1.Deployment
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	accounts     map[string]*corev1.ServiceAccount
	roles        []*rbacv1.Role
	bindings     []*rbacv1.RoleBinding
	pdbs         []*policyv1.PodDisruptionBudget
	hpas         []*autoscalingv2.HorizontalPodAutoscaler
	policies     map[string]*networkingv1.NetworkPolicy
	monitors     []*monitoringv1.ServiceMonitor
	rules        []*monitoringv1.PrometheusRule
	scaledObjs   []*scaledObject
	triggerAuths map[string]*triggerAuthentication
}

// scaledObject and triggerAuthentication are the parts of KEDA's
// keda.sh/v1alpha1 types the chart uses; decoding is strict, so a field
// the chart writes that is not here (or misspelt) fails.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		Triggers        []struct {
			Type              string            `json:"type"`
			Metadata          map[string]string `json:"metadata"`
			AuthenticationRef *struct {
				Name string `json:"name"`
			} `json:"authenticationRef"`
		} `json:"triggers"`
	} `json:"spec"`
}

type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretTargetRef []struct {
			Parameter string `json:"parameter"`
			Name      string `json:"name"`
			Key       string `json:"key"`
		} `json:"secretTargetRef"`
	} `json:"spec"`
}

func decodeRendered(t *testing.T, out string) *rendered {
	t.Helper()
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		accounts: map[string]*corev1.ServiceAccount{}, policies: map[string]*networkingv1.NetworkPolicy{},
		triggerAuths: map[string]*triggerAuthentication{},
	}
	seen := map[string]bool{}
	reader := k8syaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("split helm template output: %v", err)
		}
		var head metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("parse rendered object: %v\n%s", err, doc)
		}
		if head.Kind == "" {
			continue // a document of comments only
		}
		id := head.APIVersion + " " + head.Kind + " " + head.Namespace + "/" + head.Name
		if seen[id] {
			t.Errorf("%s is rendered twice", id)
		}
		seen[id] = true
		if head.Namespace != helmNamespace && head.Kind != "Role" && head.Kind != "RoleBinding" {
			t.Errorf("%s is not in the release namespace %s", id, helmNamespace)
		}
		obj := r.slot(head.APIVersion, head.Kind, head.Name)
		if obj == nil {
			t.Errorf("%s: no API type known for it; add it to rendered.slot", id)
			continue
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Errorf("%s does not decode strictly into its API type: %v", id, err)
		}
	}
	return r
}

// slot returns a new object of the API type of apiVersion and kind, kept
// in r under name; nil for a type the chart should not render.
func (r *rendered) slot(apiVersion, kind, name string) any {
	switch apiVersion + "/" + kind {
	case "apps/v1/Deployment":
		o := &appsv1.Deployment{}
		r.deployments[name] = o
		return o
	case "v1/Service":
		o := &corev1.Service{}
		r.services[name] = o
		return o
	case "v1/ConfigMap":
		o := &corev1.ConfigMap{}
		r.configMaps[name] = o
		return o
	case "v1/Secret":
		o := &corev1.Secret{}
		r.secrets[name] = o
		return o
	case "v1/ServiceAccount":
		o := &corev1.ServiceAccount{}
		r.accounts[name] = o
		return o
	case "rbac.authorization.k8s.io/v1/Role":
		o := &rbacv1.Role{}
		r.roles = append(r.roles, o)
		return o
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		o := &rbacv1.RoleBinding{}
		r.bindings = append(r.bindings, o)
		return o
	case "policy/v1/PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		r.pdbs = append(r.pdbs, o)
		return o
	case "autoscaling/v2/HorizontalPodAutoscaler":
		o := &autoscalingv2.HorizontalPodAutoscaler{}
		r.hpas = append(r.hpas, o)
		return o
	case "networking.k8s.io/v1/NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		r.policies[name] = o
		return o
	case "monitoring.coreos.com/v1/ServiceMonitor":
		o := &monitoringv1.ServiceMonitor{}
		r.monitors = append(r.monitors, o)
		return o
	case "monitoring.coreos.com/v1/PrometheusRule":
		o := &monitoringv1.PrometheusRule{}
		r.rules = append(r.rules, o)
		return o
	case "keda.sh/v1alpha1/ScaledObject":
		o := &scaledObject{}
		r.scaledObjs = append(r.scaledObjs, o)
		return o
	case "keda.sh/v1alpha1/TriggerAuthentication":
		o := &triggerAuthentication{}
		r.triggerAuths[name] = o
		return o
	}
	return nil
}
