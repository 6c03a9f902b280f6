package scaler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ServiceAccountDir is where Kubernetes mounts a pod's service account:
// token, ca.crt and namespace.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// KubernetesOptions configures a Kubernetes scaler. Inside a pod only
// Deployment is needed; everything else comes from the service account
// mount and the environment.
type KubernetesOptions struct {
	// APIServer is the API server's base URL. Empty means
	// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, which
	// Kubernetes sets in every pod.
	APIServer string
	// Namespace of the Deployment. Empty means the namespace file of the
	// service account mount, the pod's own namespace.
	Namespace string
	// Deployment is the name of the Deployment to scale. Required.
	Deployment string
	// ServiceAccountDir holds token, ca.crt and namespace; empty means
	// the package's ServiceAccountDir.
	ServiceAccountDir string
	// TokenFile and CAFile override the files in ServiceAccountDir.
	TokenFile string
	CAFile    string
	// InsecureSkipVerify trusts any server certificate. For tests and
	// throwaway clusters only.
	InsecureSkipVerify bool
	// Client, if set, is used as is and CAFile and InsecureSkipVerify are
	// ignored; it must trust the API server itself.
	Client *http.Client
	// Timeout bounds each call; zero means DefaultTimeout.
	Timeout time.Duration
	// Logger records scale requests; nil discards.
	Logger *slog.Logger
	// LookupEnv reads the environment; nil means os.LookupEnv. Tests set
	// it so that they do not depend on where they run.
	LookupEnv func(string) (string, bool)
}

// Kubernetes scales a Deployment through its scale subresource,
// GET and PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale,
// with plain HTTP and the pod's service-account token: no client-go.
//
// The service account needs RBAC for get and patch on deployments/scale in
// the namespace, for example:
//
//	apiVersion: rbac.authorization.k8s.io/v1
//	kind: Role
//	metadata: {name: sluice-scaler, namespace: llm}
//	rules:
//	- apiGroups: ["apps"]
//	  resources: ["deployments/scale"]
//	  verbs: ["get", "patch"]
//
// bound to it with a RoleBinding. Without it the API server answers 403,
// reported as ErrForbidden; a wrong namespace or name is ErrNotFound.
//
// A HorizontalPodAutoscaler on the same Deployment will undo what this
// scaler sets; give the healer its own Deployment or scale the HPA's
// bounds instead.
type Kubernetes struct {
	scaleURL  string
	name      string
	tokenFile string
	ep        endpoint
	log       *slog.Logger
}

var _ Scaler = (*Kubernetes)(nil)

// dnsLabel is RFC 1123, which namespace names follow. Deployment names may
// be DNS subdomains (dots allowed). Checking them keeps the URL path from
// being anything but the intended one.
var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// NewKubernetes resolves the API server, namespace and credentials. It
// reads the namespace and CA files once; the token is read on every call.
func NewKubernetes(o KubernetesOptions) (*Kubernetes, error) {
	k, err := newKubernetes(o)
	if err != nil {
		return nil, fmt.Errorf("kubernetes scaler: %w", err)
	}
	return k, nil
}

func newKubernetes(o KubernetesOptions) (*Kubernetes, error) {
	lookup := o.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	dir := o.ServiceAccountDir
	if dir == "" {
		dir = ServiceAccountDir
	}
	tokenFile, caFile := o.TokenFile, o.CAFile
	if tokenFile == "" {
		tokenFile = filepath.Join(dir, "token")
	}
	if caFile == "" {
		caFile = filepath.Join(dir, "ca.crt")
	}

	server := o.APIServer
	if server == "" {
		host, okHost := lookup("KUBERNETES_SERVICE_HOST")
		port, okPort := lookup("KUBERNETES_SERVICE_PORT")
		if !okHost || !okPort || host == "" || port == "" {
			return nil, errors.New("no API server: set APIServer or run in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)")
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	base, err := parseBaseURL(server)
	if err != nil {
		return nil, fmt.Errorf("API server: %w", err)
	}

	ns := o.Namespace
	if ns == "" {
		raw, err := os.ReadFile(filepath.Join(dir, "namespace"))
		if err != nil {
			return nil, fmt.Errorf("no namespace given and none mounted: %w", err)
		}
		ns = strings.TrimSpace(string(raw))
	}
	if !dnsLabel.MatchString(ns) || len(ns) > 63 {
		return nil, fmt.Errorf("namespace %q is not a valid name", ns)
	}
	if !dnsSubdomain.MatchString(o.Deployment) || len(o.Deployment) > 253 {
		return nil, fmt.Errorf("deployment %q is not a valid name", o.Deployment)
	}

	client := o.Client
	if client == nil {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.InsecureSkipVerify {
			tlsCfg.InsecureSkipVerify = true
		} else {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("read API server CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("read API server CA: no PEM certificate in %s", caFile)
			}
			tlsCfg.RootCAs = pool
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsCfg
		client = &http.Client{Transport: tr}
	}

	return &Kubernetes{
		scaleURL:  fmt.Sprintf("%s/apis/apps/v1/namespaces/%s/deployments/%s/scale", base, ns, o.Deployment),
		name:      ns + "/" + o.Deployment,
		tokenFile: tokenFile,
		ep:        newEndpoint(client, o.Timeout),
		log:       orDiscard(o.Logger),
	}, nil
}

// scale is the part of an autoscaling/v1 Scale the scaler reads.
// spec.replicas is omitted from the JSON when it is 0.
type scale struct {
	Spec struct {
		Replicas int `json:"replicas"`
	} `json:"spec"`
	Status struct {
		Replicas int `json:"replicas"`
	} `json:"status"`
}

// header reads the token on every call: projected service-account tokens
// expire and the kubelet rewrites the file about hourly, so a token read
// at start-up would stop working.
func (k *Kubernetes) header() (http.Header, error) {
	raw, err := os.ReadFile(k.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read service account token: %w", err)
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return nil, fmt.Errorf("read service account token: %s is empty", k.tokenFile)
	}
	h := jsonAccept()
	h.Set("Authorization", "Bearer "+token)
	return h, nil
}

// Replicas reads spec.replicas (Desired) and status.replicas (Current: pods
// created, ready or not).
func (k *Kubernetes) Replicas(ctx context.Context) (Count, error) {
	h, err := k.header()
	if err != nil {
		return Count{}, fmt.Errorf("read replicas of deployment %s: %w", k.name, err)
	}
	var s scale
	if err := k.ep.call(ctx, http.MethodGet, k.scaleURL, h, nil, &s); err != nil {
		return Count{}, fmt.Errorf("read replicas of deployment %s: %w", k.name, err)
	}
	return Count{Desired: s.Spec.Replicas, Current: s.Status.Replicas}, nil
}

// Scale merge-patches spec.replicas. Patching the count the Deployment
// already has changes nothing and succeeds.
func (k *Kubernetes) Scale(ctx context.Context, replicas int, reason string) error {
	if err := checkReplicas(replicas); err != nil {
		return fmt.Errorf("scale deployment %s: %w", k.name, err)
	}
	h, err := k.header()
	if err != nil {
		return fmt.Errorf("scale deployment %s: %w", k.name, err)
	}
	h.Set("Content-Type", "application/merge-patch+json")
	body := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	var s scale
	if err := k.ep.call(ctx, http.MethodPatch, k.scaleURL, h, body, &s); err != nil {
		return fmt.Errorf("scale deployment %s to %d: %w", k.name, replicas, err)
	}
	k.log.InfoContext(ctx, "scaled deployment", "deployment", k.name, "replicas", replicas, "current", s.Status.Replicas, "reason", reason)
	return nil
}
